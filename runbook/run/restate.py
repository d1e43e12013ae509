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

from runbook.plan import writeback
from runbook.store.workspace import Workspace

__all__ = ["restate_phases"]


def restate_phases(ws: Workspace, text: str, skip: tuple[str, ...] = ()) -> str:
    """`text` (the plan as runbook is about to write it) with each phase's status block and ticks
    restated from its latest run (`writeback.restate`), but for the phases in `skip` (those just
    written). A phase that no longer parses, has a block edited by hand, or whose block names
    another run is left as it is."""
    from runbook.plan.parse import parse_plan
    from runbook.run.select import RESUMABLE, stale_reason

    plan, problems = parse_plan(text, ws.plan_rel)
    if plan is None or any(p.severity == "error" for p in problems):
        return text
    wanted = {p.id: p for p in plan.phases if p.id not in skip and p.status is not None}
    if not wanted:
        return text
    for record in ws.ledger().latest_runs(ws.plan_rel):
        phase = wanted.get(record.phase)
        if phase is None or record.verdict in RESUMABLE or phase.status is None:
            continue
        if phase.status.run_id != record.run_id:
            continue
        stale = stale_reason(plan, phase, record)
        if phase.status.stale == (stale is not None):
            continue  # already says so (a box a person unticked in a phase that is not stale stays so)
        try:
            new_text = writeback.restate(text, plan, phase.id, record, stale, file=ws.plan_rel)
        except writeback.HandEdited:
            continue
        if new_text != text:
            text = new_text
            plan, _ = parse_plan(text, ws.plan_rel)  # offsets moved
            if plan is None:
                break
            wanted = {p.id: p for p in plan.phases if p.id in wanted}
    return text
