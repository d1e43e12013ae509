"""The click options several verbs share, declared once."""

from __future__ import annotations

import click

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


def open_plan(plan_opt: str | None):  # -> Workspace
    """The workspace and its validated plan; warnings (plan problems, unreadable ledger files) on stderr."""
    from runbook.workspace import Workspace

    ws = Workspace.open(plan_opt)
    ws.load_plan()
    for problem in ws.warnings:
        click.echo(str(problem), err=True)
    return ws


def warn(lines: list[str]) -> None:
    for line in lines:
        click.echo(f"warning: {line}", err=True)
