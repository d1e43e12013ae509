"""`runbook wait`: wait for a run to end, at most --timeout seconds; its state (runbook/run/wait.py)."""

from __future__ import annotations

import click

from runbook.commands._options import json_option, plan_option
from runbook.commands._output import Output
from runbook.run.wait import DEFAULT_WAIT_S, MAX_WAIT_S


@click.command("wait")
@plan_option
@click.option("--run", "run_ref", metavar="RUN",
              help="A run id (or a unique prefix, `last`, `last~N`); default: the run in progress, else the latest.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, max=MAX_WAIT_S), default=DEFAULT_WAIT_S,
              show_default=True, help=f"Wait at most this many seconds (at most {MAX_WAIT_S:g}; call again to wait more).")
@json_option
def command(plan_opt: str | None, run_ref: str | None, timeout_s: float, as_json: bool) -> Output:
    """Wait until a run has ended (judged, written back, committed), or --timeout seconds passed.

    Prints the run's state: still running (its step n/N, heartbeat, metrics so far, the step's last
    log lines), finished (its verdict, reason and metrics), or died (its runbook was killed: the next
    `runbook next` records it interrupted). Reads only: waiting never stops a run, and a wait cut
    short (Ctrl-C, a timeout of the caller's) costs the run nothing.

    \b
    Exit codes: the run's verdict once it ended (0 pass, 1 fail, 3 inconclusive, 4 error / timeout /
    interrupted; a run whose runbook died: 4, as it will be recorded), 5 while it still runs.

    \b
    Examples:
      runbook next --detach --yes && runbook wait --timeout 600
      runbook wait --run 20261129-143012-7f3a --json
    """
    from runbook.run.planstate import running_text
    from runbook.run.wait import exit_code, wait, workspace

    ws = workspace(plan_opt)
    result = wait(ws, run_ref, timeout_s)
    if result.state == "running" and result.running is not None:
        text = f"still running after {result.waited_s:g}s: " + running_text(result.running, result.running.plan or "")
    elif result.run is not None:
        run = result.run
        how = "ended" if result.state == "finished" else "was not recorded: its runbook died"
        text = f"run {run.run_id} ({run.phase}) {how}: {run.verdict} · {run.reason}"
        if result.running is not None:
            text += "\nnow: " + running_text(result.running, result.running.plan or "")
    else:
        text = f"run {result.run_id}: {result.state}"
    return Output(result, exit_code(result), text)
