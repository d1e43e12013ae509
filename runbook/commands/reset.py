"""`runbook reset PHASE`: drop every run of a phase; it becomes `not run`."""

from __future__ import annotations

import click

from runbook.commands._options import forget_and_say, open_plan, unrecord_options
from runbook.commands._output import Output
from runbook.contract import ResetResult, RunView


@click.command(
    "reset",
    epilog="""\b
Examples:
  runbook reset 0            # Phase 0 was rewritten from scratch: its old runs go
  runbook reset phase-2 --json
\b
Exit codes: 0 reset, 1 written but not committed, 2 unknown phase or refusal, 5 a run is in progress.""",
)
@click.argument("phase_ref", metavar="PHASE")
@unrecord_options
def command(phase_ref: str, plan_opt: str | None, no_commit: bool, as_json: bool) -> Output:
    """Drop every run of PHASE from the ledger and the plan: the phase is `not run` again.

    Its status block and results table are removed and its steps unticked; the run records and
    logs go from state/runs/; plan and ledger are committed together, after the plan's
    uncommitted edits in a commit of their own (so `git revert` of the reset keeps them). `runbook next` then reaches
    the phase as if it had never run.
    """
    from runbook.errors import unknown_phase

    ws = open_plan(plan_opt)
    phase = ws.plan.find_phase(phase_ref)
    if phase is None:
        raise unknown_phase(ws.plan, phase_ref, ws.plan_display)
    runs = ws.ledger().runs(ws.plan_rel, phase.id)[0]
    subject = f"runbook: reset {phase.id} (forgot {len(runs)} run{'s' * (len(runs) != 1)})"
    updated, sha, text = forget_and_say(ws, runs, subject, no_commit,
                                        f"reset {phase.display_name}: forgot {len(runs)} run{'s' * (len(runs) != 1)}")
    return Output(ResetResult(phase=phase.id, label=phase.display_name, forgotten=[RunView.of(r) for r in runs],
                              plan_updated=updated, commit=sha), 0, text)
