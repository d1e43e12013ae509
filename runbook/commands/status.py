"""`runbook status`: the phase table of a plan, read from the plan's own status blocks."""

from __future__ import annotations

import click

from runbook.commands._common import emit_json, load_checked, next_phase, plan_option
from runbook.model import Phase, Plan

_STATE = {"pass": "passed", "fail": "failed", "inconclusive": "inconclusive"}


def phase_state(phase: Phase) -> str:
    """One word for where a phase stands: passed, failed, inconclusive, stopped, in progress, not run."""
    if phase.status is not None:
        return _STATE.get(phase.status.verdict, "stopped")
    if any(step.done for step in phase.steps):
        return "in progress"
    return "not run"


def last_verdict(phase: Phase) -> str:
    status = phase.status
    if status is None:
        return "-"
    return " · ".join(x for x in (status.verdict, status.when, status.summary) if x)


def status_rows(plan: Plan) -> list[dict]:
    upcoming = next_phase(plan)
    rows = []
    for phase in plan.phases:
        status = phase.status
        rows.append(
            {
                "id": phase.id,
                "label": phase.label,
                "title": phase.title,
                "estimate": phase.estimate,
                "status": phase_state(phase),
                "verdict": status.verdict if status else None,
                "when": status.when if status else None,
                "run_id": status.run_id if status else None,
                "summary": status.summary if status else None,
                "steps_done": sum(step.done for step in phase.steps),
                "steps_total": len(phase.steps),
                "next": upcoming is not None and phase.id == upcoming.id,
            }
        )
    return rows


@click.command("status")
@plan_option
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON on stdout.")
def command(plan_path: str | None, as_json: bool) -> None:
    """Show the phase table: id, title, estimate, status and last verdict.

    Status comes from each phase's `<!-- runbook:status -->` block in the plan (written by
    `runbook next`) and its ticked steps; nothing is run and nothing is written. `>` marks the
    first phase that has not passed yet (what `runbook show` prints by default).
    """
    plan = load_checked(plan_path)
    rows = status_rows(plan)
    upcoming = next_phase(plan)
    if as_json:
        emit_json(
            {
                "plan": plan.path,
                "title": plan.title,
                "next": upcoming.id if upcoming else None,
                "phases": rows,
            }
        )
        return
    if plan.title:
        click.echo(f"{plan.title}  ({plan.path})")
    else:
        click.echo(plan.path)
    table = [["", "ID", "TITLE", "ESTIMATE", "STEPS", "STATUS", "LAST VERDICT"]]
    for row in rows:
        title = row["title"] if len(row["title"]) <= 40 else row["title"][:39] + "…"
        table.append(
            [
                ">" if row["next"] else "",
                row["id"],
                title,
                row["estimate"] or "-",
                f"{row['steps_done']}/{row['steps_total']}",
                row["status"],
                last_verdict(next(p for p in plan.phases if p.id == row["id"])),
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    if upcoming is None:
        click.echo("\nevery phase has passed")
    else:
        click.echo(f"\nnext: {upcoming.id} (`runbook show` prints it, `runbook next` runs it)")
