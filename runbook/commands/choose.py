"""`runbook choose RUN`: make one run (a sweep's trial) its phase's verdict, write it back, commit."""

from __future__ import annotations

import click

from runbook.commands._options import json_option, open_plan, plan_option
from runbook.commands._output import Output
from runbook.errors import warning


@click.command(
    "choose",
    epilog="""\b
The phase's verdict becomes RUN's (its status block, checkboxes and the transition `runbook next`
follows); the choice is recorded as a run of its own (state/runs/<id>.json, `decision` naming RUN)
and committed. status and brief name RUN as the deciding run, "chosen by `runbook choose`".
\b
Examples:
  runbook history 1 --metric val_acc --sort val_acc --desc   # the trials side by side
  runbook choose 20261204-081500-ab12
\b
Exit codes: 0 chosen, 2 unknown run or refusal (a run that was not judged), 5 a run is in progress.""",
)
@click.argument("run_ref", metavar="RUN")
@plan_option
@click.option("--no-commit", is_flag=True, help="Write the plan and the record, but do not commit.")
@json_option
def command(run_ref: str, plan_opt: str | None, no_commit: bool, as_json: bool) -> Output:
    """Make RUN (a run id, a unique prefix, `last`, `last~N`) its phase's verdict."""
    from runbook.contract import ChooseResult, RunView
    from runbook.run.holding import holding_run_lock
    from runbook.run.planstate import for_workspace
    from runbook.run.runner import RunOptions
    from runbook.run.sweep import choose_run

    ws = open_plan(plan_opt)
    run = ws.find_run(run_ref)
    commit = not no_commit and ws.git
    opts = RunOptions(commit=commit, say=lambda msg: click.echo(msg, err=True), warn=warning)
    with holding_run_lock(ws, warning):
        result = choose_run(ws, run, opts)
    record = result.record
    assert record.decision is not None
    chosen = ws.find_run(record.decision.run)
    state = for_workspace(ws)
    text = (f"run {chosen.run_id} now decides {record.phase}: {chosen.verdict} · {chosen.reason}\n"
            f"  recorded as run {record.run_id}" + (f", commit {record.commit[:10]}" if record.commit else "")
            + f"\nnext ({state.next.kind}): {state.next.command or state.next.why}")
    return Output(ChooseResult(chosen=RunView.of(chosen), record=RunView.of(record, recorded_in=record.commit),
                               next=state.next), 0, text)
