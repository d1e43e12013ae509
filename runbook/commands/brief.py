"""`runbook brief`: the handoff for a new agent or engineer."""

from __future__ import annotations

import click

from runbook.commands._options import json_option, open_plan, plan_option, warn
from runbook.commands._output import Output


@click.command(
    "brief",
    epilog="""\b
The brief is made from the plan, its notes document and the run ledger alone, always in this
order: goal, framing, phase table, the run in progress, the last run and why it failed, recent
milestones, lessons learned, the notes' next steps (marked when a later run may have done them),
then the next action with its resolved commands and criterion, and the exact command to continue
(the same as `runbook status` and `runbook next --dry-run`). Over --max-chars, older milestones
go first, then long prose, then the notes' next steps, then older lessons; the next action is
never cut. --json gives the whole brief (cut only when --max-chars is given), schema docs/brief.md.""",
)
@json_option
@click.option("--max-chars", type=click.IntRange(min=200), default=None,
              help="Size limit of the text brief (default 6000; with --json: no limit unless given).")
@click.option("--short", is_flag=True,
              help="A primer of a few lines (goal, where the plan stands, the last run, the exact next command), "
                   "for an agent host's session-start hook. --json still gives the whole brief.")
@plan_option
def command(as_json: bool, max_chars: int | None, short: bool, plan_opt: str | None) -> Output:
    """Print what a newcomer needs to carry the plan on: where it stands and what to run next."""
    from runbook.report.brief import DEFAULT_MAX_CHARS, build_brief, fit_brief, render_short
    from runbook.run.planstate import for_workspace

    ws = open_plan(plan_opt)
    ws.check_notes_inside()
    problems: list[str] = []
    state = for_workspace(ws, problems=problems)
    notes_text = ws.read_notes(problems)
    warn(problems)
    brief = build_brief(ws, state, notes_text)
    if as_json:
        fitted = fit_brief(brief, max_chars)[0] if max_chars else brief
        return Output(fitted)
    if short:
        return Output(brief, 0, render_short(brief))
    fitted, text = fit_brief(brief, max_chars or DEFAULT_MAX_CHARS)
    return Output(fitted, 0, text)
