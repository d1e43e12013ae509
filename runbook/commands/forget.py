"""`runbook forget RUN`: drop a run from the ledger and from the plan's blocks, committed."""

from __future__ import annotations

import click

from runbook.commands._options import forget_and_say, open_plan, unrecord_options
from runbook.commands._output import Output
from runbook.contract import ForgetResult, RunView


@click.command(
    "forget",
    epilog="""\b
Examples:
  runbook forget 20261129-143012-7f3a     # a run of the old text of a rewritten phase
  runbook forget last --json
\b
Exit codes: 0 forgotten, 1 written but not committed, 2 unknown run or refusal, 5 a run is in progress.""",
)
@click.argument("run_ref", metavar="RUN")
@unrecord_options
def command(run_ref: str, plan_opt: str | None, no_commit: bool, as_json: bool) -> Output:
    """Drop RUN (a run id, a unique prefix, `last` or `last~N`) from the ledger and from the plan.

    Its record and logs under state/runs/ are removed, and its phase is written back from the
    runs that remain (status block, checkboxes, results table; or none of them when no run is
    left, so the phase is `not run` again). Plan and ledger are committed together, after the
    plan's uncommitted edits in a commit of their own (so `git revert` of the forget keeps them). Use it for a
    run that no longer speaks for the plan: a phase rewritten from scratch, a mistaken run.
    """

    ws = open_plan(plan_opt)
    run = ws.find_run(run_ref)
    subject = f"runbook: forget run {run.run_id} ({run.phase} {run.verdict})"
    updated, sha, text = forget_and_say(ws, [run], subject, no_commit,
                                        f"forgot run {run.run_id} (Phase {run.phase_label}, {run.verdict})")
    return Output(ForgetResult(forgotten=[RunView.of(run)], plan_updated=updated, commit=sha), 0, text)
