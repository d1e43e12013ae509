"""`runbook logs [-f]`: a step's output (runbook/store/logs.py decides which run and step)."""

from __future__ import annotations

import sys

import click

from runbook.commands._options import json_option, open_plan, plan_option
from runbook.commands._output import Output
from runbook.contract import LogsResult


@click.command("logs")
@plan_option
@click.option("--run", "run_ref", metavar="RUN", help="A run id (or a unique prefix, `last`, `last~N`); default: the run in progress, else the latest.")
@click.option("--step", metavar="STEP", help="A step id (`step-2`, or `2`); default: the step running now, else the last one started.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing what is appended, step after step, until the run ends.")
@click.option("--lines", "-n", type=click.IntRange(min=0), default=40, show_default=True, help="How many last lines to print first.")
@json_option
def command(plan_opt: str | None, run_ref: str | None, step: str | None, follow: bool, lines: int, as_json: bool) -> Output:
    """Print a step's log: by default the running step of the run in progress.

    Logs are `state/runs/<run>/<step>.log` (a Slurm step's job writes its output straight into
    it). They are not committed: where a recorded run's log is not here (a fresh clone), the last
    lines its run record keeps are printed instead, and stderr says so. With --follow, waits for more output and moves on to the next step's log as the run
    does; it ends when the run ends (printing its verdict) or its runbook dies. Reads only.

    \b
    Examples:
      runbook logs -f                  # follow the run in progress
      runbook logs --run last --step 2 # step-2 of the latest run
    """
    from runbook.errors import RunbookError
    from runbook.store.ledger import tail_lines
    from runbook.store.logs import follow as follow_log
    from runbook.store.logs import locate

    ws = open_plan(plan_opt)
    where = locate(ws, run_ref, step)
    kept = where.fallback()
    if kept is not None:  # the log is not here: the lines the run record keeps, said so
        shown = kept[-lines:] if lines else []
        how = (f"the last {len(kept)} line{'s' * (len(kept) != 1)} its run record keeps" if kept
               else "its run record keeps no line of it (the step printed nothing)")
        note = (f"{ws.rel(where.log)} is not on this machine (logs are not committed; run {where.run_id} ran "
                f"elsewhere or its logs were removed): {how}")
        if not as_json:
            click.echo(f"{note}", err=True)
        result = LogsResult(run_id=where.run_id, phase=where.phase, step=where.step, log_path=ws.rel(where.log),
                            running=False, lines=shown, job_id=where.job_id, from_record=True)
        return Output(result, 0, "".join(line + "\n" for line in shown) or None)
    if follow:
        if as_json:
            raise RunbookError("--follow prints a stream, not one JSON document", "usage",
                               hint="drop --json, or drop --follow to get the last lines as JSON")
        out = sys.stdout.buffer
        state = "running" if where.running else "ended"
        click.echo(f"{ws.rel(where.log)} (run {where.run_id}, {where.phase}, {where.step}, {state})", err=True)

        def write(data: bytes) -> None:
            out.write(data)
            out.flush()

        try:
            closing = follow_log(ws, where, write, lines=lines, pinned=step is not None)
        except KeyboardInterrupt:
            return Output(None, 0, None)
        if closing:
            click.echo(closing, err=True)
        return Output(None, 0, None)
    shown = tail_lines(where.log, lines) if lines else []
    result = LogsResult(run_id=where.run_id, phase=where.phase, step=where.step, log_path=ws.rel(where.log),
                        running=where.running, lines=shown, job_id=where.job_id)
    if not as_json:
        state = "running" if where.running else "ended"
        click.echo(f"{result.log_path} (run {where.run_id}, {where.phase}, {where.step}, {state})", err=True)
    text = "\n".join(shown) + ("\n" if shown else "")
    return Output(result, 0, text if shown else None)
