"""`runbook validate [PLAN...]`: check plans and print every problem at once."""

from __future__ import annotations

import click

from runbook.commands._common import display_path, emit_json, fail, print_problems


@click.command("validate")
@click.argument("plans", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def command(plans: tuple[str, ...], as_json: bool) -> None:
    """Check plans and print every problem as `file:line:col: message`.

    With no PLAN, every plan of the repository is checked: the files matched by `plans` in
    runbook.toml (default `plans/*.md`) that start with `runbook: 1` front matter. A file named
    explicitly must be a plan.

    Checked: front matter and format version, phase headings, duplicate phase ids, `On pass:` /
    `On fail:` / `Needs:` targets, cycles in `Needs:`, `Pass:` criteria, steps without a command,
    undefined `{vars}`, `Timeout:` values, and the runbook:NAME marker blocks.

    Exit status: 0 when no plan has an error (warnings are printed but do not fail), 2 otherwise.
    """
    from runbook.parse import read_plan

    paths = list(plans)
    if not paths:
        from runbook.project import ConfigError, discover_plans, find_repo_root

        root = find_repo_root()
        try:
            paths = [display_path(p) for p in discover_plans(root)]
        except ConfigError as exc:
            fail(str(exc))
        if not paths:
            fail(
                "no plans found: no plans/*.md (or runbook.toml `plans`) file starts with `runbook: 1` "
                "front matter; name a file, or create a plan with `runbook init`"
            )
    results = []
    errors = 0
    for path in paths:
        plan, problems = read_plan(path)
        n_errors = sum(p.severity == "error" for p in problems)
        errors += n_errors
        results.append(
            {
                "plan": path,
                "ok": plan is not None and n_errors == 0,
                "phases": [p.id for p in plan.phases] if plan is not None else [],
                "problems": [p.model_dump() for p in problems],
            }
        )
        if not as_json:
            print_problems(problems)
            if plan is not None and n_errors == 0:
                warn = sum(p.severity == "warning" for p in problems)
                extra = f", {warn} warning{'s' * (warn != 1)}" if warn else ""
                click.echo(f"{path}: ok ({len(plan.phases)} phase{'s' * (len(plan.phases) != 1)}{extra})")
    if as_json:
        emit_json({"ok": errors == 0, "plans": results})
    elif errors:
        click.echo(f"{errors} error{'s' * (errors != 1)} found", err=True)
    if errors:
        raise click.exceptions.Exit(2)
