"""`runbook cancel`: stop the run in progress cleanly (runbook/run/cancel.py)."""

from __future__ import annotations

import click

from runbook.commands._options import json_option, open_plan, plan_option
from runbook.commands._output import Output
from runbook.errors import warning


@click.command("cancel")
@plan_option
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=180.0, show_default=True,
              help="Seconds to wait for the run to stop and be recorded.")
@json_option
def command(plan_opt: str | None, wait_s: float, as_json: bool) -> Output:
    """Stop the run in progress: its step is stopped, the run recorded as interrupted.

    The run's runbook (a `runbook next` in a terminal, or the supervisor of `runbook next
    --detach`) is sent SIGTERM and does what Ctrl-C does: kills the step's process group (or
    scancels its Slurm job and waits until squeue no longer lists it), records the run as
    `interrupted`, writes the plan back and commits. A run whose runbook died is recorded so
    by `cancel` itself (its Slurm jobs cancelled). `runbook next` resumes the phase afterwards.
    Exit 0 when the run stopped (or nothing ran), 4 when it did not stop within --wait, 5 when it
    runs on another host.
    """
    from runbook.run.cancel import cancel

    ws = open_plan(plan_opt)

    def say(msg: str) -> None:
        click.echo(msg, err=True)

    def warn(msg: str) -> None:
        warning(msg)

    result = cancel(ws, wait_s=wait_s, say=say, warn=warn)
    if result.run is not None:
        run = result.run
        text = f"{result.how}\nrun {run.run_id} ({run.phase}): {run.verdict} · {run.reason}"
        text += "\n`runbook next` resumes the phase at its first unfinished step"
    else:
        text = result.how
    return Output(result, 0, text)
