"""A stale verdict is said in the plan itself, the next time runbook writes the plan.

A phase that passed (or failed) under other commands or another `Pass:` than it has now
(runbook/run/select.py `stale_reason`) is shown as stale by status, brief and next; the plan file
must not keep saying `**Status:** pass` with its boxes ticked. Whenever runbook writes the plan (a
run's write-back, `forget`, `reset`), `restate_phases` rewrites the status block of every other
phase whose block names that phase's latest run: `stale (was pass)` and why, with its boxes
unticked (it runs again from its first step), or back to the plain verdict and its ticks when the
edit that made it stale was undone. Results tables are never touched: the runs happened.
"""

from __future__ import annotations

from runbook.model import Plan, RunRecord
from runbook.plan import writeback
from runbook.store.workspace import Workspace

__all__ = ["restate_phases"]


def restate_phases(ws: Workspace, text: str, skip: tuple[str, ...] = (), plan: Plan | None = None) -> str:
    """`text` (the plan as runbook is about to write it) with each phase's status block and ticks
    restated from its latest run (`writeback.restate`), but for the phases in `skip` (those just
    written). `plan`: a parse of the same plan whose other phases read as in `text` (the parse
    before the write-back), so that `text` is parsed again only when a phase must change. A phase
    that no longer parses, has a block edited by hand, or whose block names another run is left as
    it is."""
    from runbook.plan.parse import parse_plan
    from runbook.run.select import RESUMABLE, stale_reason

    if plan is None:
        plan, problems = parse_plan(text, ws.plan_rel)
        if plan is None or any(p.severity == "error" for p in problems):
            return text
    wanted = {p.id: p for p in plan.phases if p.id not in skip and p.status is not None}
    if not wanted:
        return text
    changes: list[tuple[RunRecord, str | None]] = []
    for record in ws.ledger().latest_runs(ws.plan_rel):
        phase = wanted.get(record.phase)
        if phase is None or phase.status is None or record.verdict in RESUMABLE:
            continue
        if phase.status.run_id != record.run_id:
            continue
        stale = stale_reason(plan, phase, record)
        if phase.status.stale != (stale is not None):  # else it already says so (a box a person
            changes.append((record, stale))             # unticked in a phase that is not stale stays so)
    for record, stale in changes:
        current, problems = parse_plan(text, ws.plan_rel)  # offsets move with each change
        if current is None or any(p.severity == "error" for p in problems):
            break
        try:
            text = writeback.restate(text, current, record.phase, record, stale, file=ws.plan_rel)
        except writeback.HandEdited:
            continue
    return text
