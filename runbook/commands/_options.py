"""The click options and plumbing several verbs share, declared once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import click

from runbook.errors import warning

F = TypeVar("F", bound="Callable[..., Any]")

if TYPE_CHECKING:
    from collections.abc import Callable

    from runbook.model import Plan, RunRecord
    from runbook.store.workspace import Workspace

plan_option = click.option(
    "--plan",
    "plan_opt",
    metavar="PATH",
    help="The plan file to use when the repository has several (default: the only discovered plan).",
)

json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document on stdout (schema: docs/json.md); never asks a question.",
)


def unrecord_options(fn: F) -> F:
    """--plan, --no-commit and --json of the verbs that drop runs (forget, reset)."""
    fn = json_option(fn)
    fn = click.option("--no-commit", is_flag=True,
                      help="Write the plan and remove the ledger files, but do not commit.")(fn)
    return plan_option(fn)


def forget_and_say(ws: Workspace, runs: list[RunRecord], subject: str, no_commit: bool,
                   said: str) -> tuple[bool, str | None, str]:
    """Forget `runs` (committed unless no_commit): (plan rewritten, commit sha, `said` + what was done)."""
    from runbook.run.unrecord import forget_runs

    updated, sha = forget_runs(ws, runs, subject, commit=not no_commit,
                               warn=warning)
    said += f"; {ws.plan_rel} rewritten" if updated else ""
    said += f"; commit {sha[:10]}" if sha else ""
    return updated, sha, said


def open_plan(plan_opt: str | None) -> Workspace:
    """The workspace and its validated plan; warnings (plan problems, unreadable ledger files) on stderr."""
    from runbook.store.workspace import Workspace

    ws = Workspace.open(plan_opt)
    ws.load_plan()
    for problem in ws.warnings:
        click.echo(str(problem), err=True)
    return ws


def open_runs_filter(plan_opt: str | None, phase_ref: str | None) -> tuple[Workspace, Plan | None, str | None]:
    """Where a verb that reads runs looks: with --plan or a PHASE, the plan's workspace, the plan
    (validated) and the phase's id (an unknown phase refused); otherwise the workspace alone, and
    the runs of every plan in it."""
    from runbook.store.workspace import Workspace

    if not (plan_opt or phase_ref):
        return Workspace.at(), None, None
    ws = Workspace.open(plan_opt)
    plan = ws.load_plan()
    if not phase_ref:
        return ws, plan, None
    phase = plan.find_phase(phase_ref)
    if phase is None:
        from runbook.errors import unknown_phase

        raise unknown_phase(plan, phase_ref, ws.plan_display)
    return ws, plan, phase.id


def warn(lines: list[str]) -> None:
    for line in lines:
        warning(line)
