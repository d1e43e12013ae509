"""`runbook show [PHASE]`: one phase exactly as written, plus its commands with vars resolved."""

from __future__ import annotations

import click

from runbook.commands._common import emit_json, fail, load_checked, next_phase, plan_option
from runbook.model import Phase, Plan


def resolved_steps(plan: Plan, phase: Phase) -> list[dict]:
    from runbook.resolve import resolve_command

    return [
        {
            "id": step.id,
            "text": step.text,
            "command": step.command,
            "resolved": resolve_command(step.command, plan.vars),
            "done": step.done,
            "line": step.span.start_line,
        }
        for step in phase.steps
    ]


@click.command("show")
@click.argument("phase_ref", metavar="[PHASE]", required=False)
@plan_option
@click.option("--json", "as_json", is_flag=True, help="Print the phase as JSON on stdout.")
def command(phase_ref: str | None, plan_path: str | None, as_json: bool) -> None:
    """Print a phase exactly as written in the plan, then its commands with `{vars}` resolved.

    PHASE is a label (`1`, `"Phase 1"`), an id (`phase-1`) or an explicit `{#id}`. Without it,
    the first phase that has not passed yet is shown. Nothing runs.

    \b
    Examples:
      runbook show              # the phase `runbook next` would start from
      runbook show 2 --json     # phase 2, for an agent
    """
    plan = load_checked(plan_path)
    if phase_ref is not None:
        phase = plan.find_phase(phase_ref)
        if phase is None:
            known = ", ".join(f"{p.id} ({p.display_name})" for p in plan.phases)
            fail(f"{plan.path}: no phase {phase_ref!r}; phases: {known}")
    else:
        phase = next_phase(plan)
        if phase is None:
            click.echo(f"{plan.path}: every phase has passed; name one to show it, e.g. `runbook show {plan.phases[-1].id}`")
            return
    source = plan.text[phase.span.start : phase.span.end]
    steps = resolved_steps(plan, phase)
    if as_json:
        from runbook.criteria import metric_names

        crit = phase.criterion
        emit_json(
            {
                "plan": plan.path,
                "id": phase.id,
                "label": phase.label,
                "title": phase.title,
                "estimate": phase.estimate,
                "goal": phase.goal,
                "text": source,
                "line": phase.span.start_line,
                "steps": steps,
                "criterion": crit.text if crit else None,
                "metrics": metric_names(crit.expr) if crit else [],
                "on_pass": phase.on_pass,
                "on_fail": phase.on_fail,
                "needs": phase.needs,
                "timeout_s": phase.timeout_s,
                "status": phase.status.model_dump() if phase.status else None,
            }
        )
        return
    click.echo(f"{plan.path}:{phase.span.start_line}", err=True)
    click.echo(source, nl=not source.endswith(("\n", "\r")))
    if steps:
        click.echo("\nResolved commands (run with the repository root as the working directory):")
        for step in steps:
            mark = "x" if step["done"] else " "
            lines = step["resolved"].splitlines() or [""]
            click.echo(f"  [{mark}] {step['id']}: {lines[0]}")
            pad = " " * (len(step["id"]) + 8)
            for more in lines[1:]:
                click.echo(f"{pad}{more}")
