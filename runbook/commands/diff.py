"""`runbook diff [RUN_A] [RUN_B]`: what differs between two runs (runbook/report/compare.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from runbook.commands._options import json_option, warn
from runbook.commands._output import Output
from runbook.errors import RunbookError
from runbook.model import RunRecord

if TYPE_CHECKING:
    from runbook.store.index import Row


@click.command("diff")
@click.argument("run_a", metavar="[RUN_A]", required=False)
@click.argument("run_b", metavar="[RUN_B]", required=False)
@click.option("--plan", "plan_opt", metavar="PATH",
              help="Runs of this plan file (default: the runs of every plan in the ledger).")
@click.option("--all", "show_all", is_flag=True, help="Also list the vars, metrics and settings that did not change.")
@json_option
def command(run_a: str | None, run_b: str | None, plan_opt: str | None, show_all: bool, as_json: bool) -> Output:
    """Compare two runs: vars, commands, metrics (with deltas), verdicts, code commit, environment.

    A run is named by its id, a unique prefix of it, `last`, or `last~N` (the N-th run before the
    last). With one run, it is compared with the run of the same phase before it; with none, the
    last run with the run of its phase before it. Reads only the ledger (and git for the files
    changed between the two commits).

    \b
    Examples:
      runbook diff                                   # the last run against the one before it
      runbook diff 20261130-101500-ab12 last
      runbook diff last~1 last --json | jq '.result.metrics[] | select(.changed)'
    """
    from runbook.report.compare import diff, render_diff
    from runbook.store.workspace import Workspace

    ws = Workspace.open(plan_opt) if plan_opt else Workspace.at()
    index = ws.ledger()  # only the two runs compared are read
    problems = list(index.problems)
    rows = index.rows(ws.plan_rel if plan_opt else None)
    warn(problems)
    if not rows:
        raise RunbookError(f"no runs in {ws.rel(ws.state)}/runs yet", "unknown_run",
                           hint="run a phase first (`runbook next`)")
    b = ws.find_run(run_b or run_a or "last", rows)
    a = ws.find_run(run_a, rows) if run_a and run_b else ws.find_run(_before(b, rows).run_id, rows)
    changed = None
    if ws.git and a.commit_before and b.commit_before and a.commit_before != b.commit_before:
        from runbook.store.gitops import changed_files

        files = changed_files(ws.root, a.commit_before, b.commit_before)
        if files is not None:
            own = {a.plan, b.plan}
            state = ws.rel(ws.state).rstrip("/") + "/"
            changed = [p for p in files if p not in own and not p.startswith(state)]
    result = diff(a, b, changed)
    return Output(result, 0, render_diff(result, show_all))


def _before(run: RunRecord, rows: list[Row]) -> Row:
    """The run of `run`'s phase (and plan) just before it."""
    earlier = [r for r in rows if (r.plan, r.phase) == (run.plan, run.phase) and (r.started, r.run_id) < (run.started, run.run_id)]
    if not earlier:
        raise RunbookError(f"run {run.run_id} is the first run of {run.phase}: nothing before it to compare with",
                           "unknown_run", hint="name both runs: runbook diff RUN_A RUN_B")
    return earlier[-1]
