"""`runbook validate [PLAN...]`: check plans and print every problem at once."""

from __future__ import annotations

import click

from runbook.commands._options import json_option
from runbook.commands._output import Output
from runbook.contract import PlanCheck, ProblemView, ValidateResult
from runbook.errors import RunbookError
from runbook.model import Plan, Problem


def flow_warnings(plan: Plan) -> list[Problem]:
    """Phases no `On pass:` / `On fail:` leads to: `runbook next` never runs them on its own."""
    from runbook.run.select import unreachable

    return [
        Problem(
            file=plan.path, line=phase.span.start_line, col=1, severity="warning",
            message=f"nothing leads to {phase.display_name}: no On pass: / On fail: names it and it does not "
            f"follow a phase that passes into it, so `runbook next` runs it only with --phase {phase.id}",
        )
        for phase in unreachable(plan)
    ]


@click.command("validate")
@click.argument("plans", nargs=-1, type=click.Path(dir_okay=False))
@json_option
def command(plans: tuple[str, ...], as_json: bool) -> Output:
    """Check plans and print every problem as `file:line:col: message`.

    With no PLAN, every plan of the repository is checked: the files matched by `plans` in
    runbook.toml (default `plans/*.md`) that start with `runbook: 1` front matter. A file named
    explicitly must be a plan.

    Checked: front matter and format version, phase headings, duplicate phase ids, `On pass:` /
    `On fail:` / `Needs:` targets, cycles in `Needs:`, `Pass:` criteria, steps without a command,
    undefined `{vars}`, `Timeout:` values, and the runbook:NAME marker blocks, each of which must
    still hash to the `sha=` its opening marker carries (an error names a block edited by hand:
    `runbook next`, `forget` and `reset` refuse while there is one). Warned: phases
    nothing leads to (`runbook next` reaches them only with --phase).

    Exit status: 0 when no plan has an error (warnings are printed but do not fail), 2 otherwise.
    """
    from runbook.plan.parse import read_plan
    from runbook.store.workspace import Workspace, display_path

    paths = list(plans)
    if not paths:
        from runbook.store.project import ConfigError, discover_plans

        ws = Workspace.at()
        try:
            paths = [display_path(p) for p in discover_plans(ws.root)]
        except ConfigError as exc:
            raise RunbookError(str(exc), "config") from None
        if not paths:
            raise RunbookError(
                "no plans found: no plans/*.md (or runbook.toml `plans`) file starts with `runbook: 1` front matter",
                "no_plan",
                hint="name a file, or create a plan with `runbook init`",
            )
    results = []
    errors = 0
    for path in paths:
        plan, problems = read_plan(path)
        if plan is not None:
            from runbook.plan.writeback import hand_edits

            problems = sorted([*problems, *flow_warnings(plan), *hand_edits(plan, path, "error")],
                              key=lambda p: (p.line, p.col))
        n_errors = sum(p.severity == "error" for p in problems)
        errors += n_errors
        results.append(PlanCheck(
            plan=path,
            valid=plan is not None and n_errors == 0,
            phases=[p.id for p in plan.phases] if plan is not None else [],
            problems=[ProblemView.of(p) for p in problems],
        ))
        if not as_json:
            for problem in problems:
                click.echo(str(problem), err=True)
            if plan is not None and n_errors == 0:
                warn = sum(p.severity == "warning" for p in problems)
                extra = f", {warn} warning{'s' * (warn != 1)}" if warn else ""
                click.echo(f"{path}: ok ({len(plan.phases)} phase{'s' * (len(plan.phases) != 1)}{extra})")
    if errors and not as_json:
        click.echo(f"{errors} error{'s' * (errors != 1)} found", err=True)
    return Output(ValidateResult(valid=errors == 0, plans=results), 2 if errors else 0, None)
