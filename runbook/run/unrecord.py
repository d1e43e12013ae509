"""`runbook forget RUN` and `runbook reset PHASE`: drop runs from the ledger, keep the plan true.

A forgotten run's ledger file (`state/runs/<id>.json`), its metric series
(`state/runs/<id>.series.jsonl`) and its logs (`state/runs/<id>/`) are removed; every phase it
belonged to is written back from the runs that remain (status block, checkboxes and results table
from the latest remaining run, or no blocks and no ticks when none remains); plan and ledger go
into one commit (`runbook: forget run <id>` / `runbook: reset <phase>`) that holds nothing else:
the plan's uncommitted edits, and runs a stopped runbook left uncommitted, are committed before it,
each alone (`runbook.run.pending`), so `git revert` of it brings back exactly the runs it dropped
and keeps the edits. A signal while git runs stops a hook that hangs (3 s later), as in `next`. Both take the run lock
(they refuse while a run is in progress) and then the write lock. The plan is written before the
ledger files are removed: a crash in between leaves runs the next write-back puts back into the
plan, never a plan naming runs that are gone.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import threading
from collections.abc import Callable

from runbook.errors import RunbookError
from runbook.model import Plan, RunRecord
from runbook.run.pending import commit_pending, plan_without
from runbook.store import gitops, ledger
from runbook.store.workspace import Workspace

__all__ = ["forget_runs"]


def _plan_text(ws: Workspace) -> str:
    from runbook.plan.parse import read_text

    text, problem = read_text(str(ws.plan_file))
    if problem is not None:
        raise RunbookError(str(problem), "io", file=ws.plan_rel)
    return text


def _refuse_hand_edits(ws: Workspace, text: str) -> Plan | None:
    """A block edited by hand anywhere in the plan: refused (`hand_edited`), nothing written or
    committed; the plan's edits are committed before a forget, and such an edit must not be.
    The parse of `text` (None when it does not parse)."""
    from runbook.plan import writeback
    from runbook.plan.parse import parse_plan

    plan, _ = parse_plan(text, ws.plan_rel)
    if plan is not None:
        try:
            writeback.check_plan(plan, ws.plan_rel)
        except writeback.HandEdited as exc:
            raise RunbookError(f"refusing: {exc}", "hand_edited", file=ws.plan_rel) from None
    return plan


def forget_runs(ws: Workspace, forgotten: list[RunRecord], subject: str, *, commit: bool = True,
                warn: Callable[[str], None] = lambda _msg: None) -> tuple[bool, str | None]:
    """Drop `forgotten` (runs of the workspace's plan); returns (plan rewritten, commit or None)."""
    from runbook.files import atomic_write_text
    from runbook.run.executor import Interrupts
    from runbook.store.lock import LockError, LockHeld, run_lock, write_lock

    for record in forgotten:
        if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z_.-]*", record.run_id) or ".." in record.run_id:
            raise RunbookError(f"run id {record.run_id!r} is not one runbook writes; remove its file by hand",
                               "unknown_run")
    if commit and ws.git:
        try:
            gitops.check_can_commit(ws.root)
        except gitops.GitStateError as exc:
            raise RunbookError(f"refusing: {exc}", "git_state") from None
    try:
        # a signal becomes a flag that stops a git hook that hangs (signals are the main thread's:
        # the MCP server calls this in a worker thread, where its own time limit applies)
        signals = Interrupts() if threading.current_thread() is threading.main_thread() else None
        with (run_lock(ws.state, git_dir=ws.git_dir, warn=warn), write_lock(ws.state),
              signals or contextlib.nullcontext()):
            stop = (lambda: signals.count > 0) if signals is not None else None
            text = _plan_text(ws)
            ws.ledger_changed()  # under the locks now: look at state/runs/ afresh
            _refuse_hand_edits(ws, text)
            new_text = plan_without(ws, text, forgotten)  # a hand-edited block: refused, nothing committed
            if commit and ws.git:
                try:  # so that this commit holds only the forget, and `git revert` of it keeps the edits
                    what = subject.removeprefix("runbook: ").split(" (", 1)[0]
                    if commit_pending(ws, what, stop=stop, say=warn, warn=warn).runs:
                        text = _plan_text(ws)  # the recovered runs are written into it now
                        new_text = plan_without(ws, text, forgotten)
                except gitops.GitStateError as exc:
                    raise RunbookError(f"refusing: could not commit the plan's own edits first: {exc}",
                                       "git_state") from None
            from runbook.run.restate import restate_phases

            new_text = restate_phases(ws, new_text, skip=tuple(r.phase for r in forgotten))
            if new_text != text:
                atomic_write_text(ws.plan_file, new_text)
            paths = []
            for record in forgotten:
                path = ledger.run_path(ws.state, record.run_id)
                path.unlink(missing_ok=True)
                kept = ledger.series_path(ws.state, record.run_id)
                if kept.is_file():
                    kept.unlink()
                    paths.append(ws.rel(kept))
                logs = ledger.run_dir(ws.state, record.run_id)
                if logs.is_dir():
                    shutil.rmtree(logs, ignore_errors=True)
                paths.append(ws.rel(path))
            ws.ledger_changed()
            sha = None
            if commit and ws.git:
                try:
                    sha = gitops.commit_paths(ws.root, [ws.plan_rel, *paths], subject, stop=stop)
                except gitops.GitStateError as exc:
                    raise RunbookError(f"written but not committed: {exc}", "commit_failed",
                                       hint="commit the plan and state/runs/ yourself") from None
    except LockHeld as exc:
        from runbook.run.planstate import holder_view

        raise RunbookError(f"refusing while a run is in progress: {exc}", "locked", file=ws.rel(exc.path),
                           lock=holder_view(exc.info, ws.plan, ws.rel(ws.state), state_dir=ws.state)) from None
    except LockError as exc:
        raise RunbookError(str(exc), "locked") from None
    return new_text != text, sha
