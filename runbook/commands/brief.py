"""`runbook brief`: the handoff for a new agent or engineer."""

from __future__ import annotations

import click

from runbook.commands._context import open_plan


@click.command(
    "brief",
    epilog="""\b
The brief is made from the plan, its notes document and the run ledger alone, always in this
order: goal, framing, phase table, last run and why it failed, recent milestones, lessons
learned, next steps, then the next phase with its resolved commands and criterion, and the
exact command to continue. Over --max-chars, older milestones go first, then long prose, then
older lessons; the next action is never cut. --json follows the Brief schema (docs/brief.md).""",
)
@click.option("--json", "as_json", is_flag=True, help="Print the brief as JSON (schema: docs/brief.md).")
@click.option("--max-chars", type=click.IntRange(min=200), default=6000, show_default=True, help="Size limit of the text brief.")
@click.option("--plan", "plan_opt", metavar="PATH", help="The plan to brief (default: the only plan in the repo).")
def command(as_json: bool, max_chars: int, plan_opt: str | None) -> None:
    """Print what a newcomer needs to carry the plan on: where it stands and what to run next."""
    from runbook.brief import build_brief, fit_brief
    from runbook.ledger import load_runs

    ctx = open_plan(plan_opt)
    notes_text = None
    notes_path = ctx.notes_path
    if notes_path is not None and notes_path.is_file():
        try:
            notes_text = notes_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            click.echo(f"warning: {ctx.notes_rel}: not read ({exc})", err=True)
    problems: list[str] = []
    runs = load_runs(ctx.state, problems=problems)
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    brief = build_brief(ctx.plan, ctx.plan_rel, runs, notes_text, ctx.notes_rel, ctx.plan_arg)
    fitted, text = fit_brief(brief, max_chars)
    if as_json:
        click.echo(fitted.model_dump_json(indent=2))
    else:
        click.echo(text, nl=False)
