"""`runbook show [PHASE]`: one phase exactly as written, plus its commands with vars resolved."""

from __future__ import annotations

import click

from runbook.commands._options import json_option, open_plan, plan_option
from runbook.commands._output import Output
from runbook.contract import PhaseDetail, ShowResult, ShowStep
from runbook.errors import unknown_phase
from runbook.model import Phase, Plan
from runbook.plan.mdtext import ends_with_newline


def resolved_steps(plan: Plan, phase: Phase) -> list[ShowStep]:
    from runbook.run.select import resolved_commands

    return [
        ShowStep(id=step.id, text=step.text, command=step.command, resolved=cmd, done=step.done,
                 line=step.span.start_line)
        for step, cmd in zip(phase.steps, resolved_commands(plan, phase), strict=True)
    ]


@click.command("show")
@click.argument("phase_ref", metavar="[PHASE]", required=False)
@plan_option
@json_option
def command(phase_ref: str | None, plan_opt: str | None, as_json: bool) -> Output:
    """Print a phase exactly as written in the plan, then its commands with `{vars}` resolved.

    PHASE is a label (`1`, `"Phase 1"`), an id (`phase-1`) or an explicit `{#id}`. Without it,
    the phase the next action acts on is shown (the one `runbook next` runs). Nothing runs.

    \b
    Examples:
      runbook show              # the phase `runbook next` would run
      runbook show 2 --json     # phase 2, for an agent
    """
    from runbook.plan.criteria import metric_names
    from runbook.run.planstate import for_workspace

    ws = open_plan(plan_opt)
    plan = ws.plan
    state = for_workspace(ws)
    nxt = state.view.next
    if phase_ref is not None:
        phase = plan.find_phase(phase_ref)
        if phase is None:
            raise unknown_phase(plan, phase_ref, ws.plan_display)
    else:
        phase = plan.find_phase(nxt.phase) if nxt.phase and nxt.kind != "nothing" else None
        if phase is None:
            from runbook.run.planstate import nothing_text

            text = f"{ws.plan_display}: {nothing_text(nxt)}"
            if plan.phases:
                text += f"\nName a phase to show it, e.g. `runbook show {plan.phases[-1].id}`"
            return Output(ShowResult(plan=ws.plan_rel, phase=None, next=nxt), 0, text)
    source = plan.text[phase.span.start : phase.span.end]
    steps = resolved_steps(plan, phase)
    crit = phase.criterion
    row = next(r for r in state.view.phases if r.id == phase.id)
    detail = PhaseDetail(
        id=phase.id, label=phase.display_name, title=phase.title, estimate=phase.estimate, goal=phase.goal,
        text=source, line=phase.span.start_line, steps=steps, criterion=crit.text if crit else None,
        metrics=metric_names(crit.expr) if crit else [], on_pass=phase.on_pass, on_fail=phase.on_fail,
        needs=phase.needs, timeout_s=phase.timeout_s, state=row,
    )
    if not as_json:
        click.echo(f"{ws.plan_display}:{phase.span.start_line}", err=True)
        click.echo(source, nl=not ends_with_newline(source))
        if steps:
            click.echo("\nResolved commands (run with the repository root as the working directory):")
            for step in steps:
                mark = "x" if step.done else " "
                lines = step.resolved.splitlines() or [""]
                click.echo(f"  [{mark}] {step.id}: {lines[0]}")
                pad = " " * (len(step.id) + 8)
                for more in lines[1:]:
                    click.echo(f"{pad}{more}")
        state_line = row.state.replace("_", " ") + (f" ({row.note})" if row.note else "")
        click.echo(f"\nState: {state_line}")
    return Output(ShowResult(plan=ws.plan_rel, phase=detail, next=nxt), 0, None)
