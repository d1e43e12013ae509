"""Helpers shared by the read-only verbs: find and load a plan, print problems, print JSON.

Every failure here ends in `fail(...)`: a message on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NoReturn

import click

from runbook.model import Phase, Plan, Problem

__all__ = [
    "display_path",
    "emit_json",
    "fail",
    "load_checked",
    "next_phase",
    "pick_plan_path",
    "plan_option",
    "print_problems",
]

plan_option = click.option(
    "--plan",
    "plan_path",
    metavar="PATH",
    type=click.Path(dir_okay=False),
    help="The plan file to use when the repository has several (default: the only discovered plan).",
)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `message` on stderr and exit with `code` (2: usage or plan error)."""
    click.echo(message, err=True)
    raise click.exceptions.Exit(code)


def display_path(path: str | os.PathLike[str]) -> str:
    """`path` relative to the current directory when it lies below it, for messages."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def print_problems(problems: list[Problem]) -> None:
    """Print problems as `file:line:col: message` on stderr, in file order."""
    for problem in problems:
        click.echo(str(problem), err=True)


def emit_json(data: Any) -> None:
    """Print `data` as indented JSON on stdout (pydantic models are dumped first)."""
    if hasattr(data, "model_dump"):
        data = data.model_dump(mode="json")
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def pick_plan_path(plan_path: str | None) -> str:
    """The plan to use: `--plan`, else the only plan discovered in the repository."""
    if plan_path:
        return plan_path
    from runbook.project import ConfigError, discover_plans, find_repo_root, load_config

    root = find_repo_root()
    try:
        config = load_config(root)
        plans = discover_plans(root)
    except ConfigError as exc:
        fail(str(exc))
    if not plans:
        globs = ", ".join(config.plans)
        fail(
            f"no plan found: looked for {globs} with `runbook: 1` front matter under {display_path(root) or '.'}; "
            "create one with `runbook init`, or name a file with --plan PATH"
        )
    if len(plans) > 1:
        listing = "\n".join(f"  --plan {display_path(p)}" for p in plans)
        fail(f"several plans found; pick one with --plan:\n{listing}")
    return display_path(plans[0])


def load_checked(plan_path: str | None) -> Plan:
    """Find, read and validate the plan; print every problem; exit 2 if any is an error."""
    from runbook.parse import read_plan

    path = pick_plan_path(plan_path)
    plan, problems = read_plan(path)
    print_problems(problems)
    if plan is None or any(p.severity == "error" for p in problems):
        fail(f"{path}: fix the problems above, then run `runbook validate {path}`")
    return plan


def next_phase(plan: Plan) -> Phase | None:
    """The phase `runbook next` would run now (None when there is nothing left to run).

    Decided exactly as `runbook next` decides it: from the run ledger, following `On pass:` /
    `On fail:` transitions (runbook/select.py), not from the status blocks alone.
    """
    from runbook.ledger import load_runs
    from runbook.project import ConfigError, find_repo_root, state_dir
    from runbook.select import select_phase
    from runbook.writeback import phase_text_hash

    plan_path = Path(plan.path).resolve()
    root = Path(find_repo_root(plan_path)).resolve()
    try:
        state = state_dir(root)
    except ConfigError as exc:
        fail(str(exc))
    runs = load_runs(state, plan=plan_path.relative_to(root).as_posix())
    selection = select_phase(plan, runs, current_hash=lambda phase: phase_text_hash(plan.text, phase))
    return selection.phase
