"""The run lock as the verbs that change a plan hold it (`next`, `sweep`, `choose`): its refusals as
RunbookErrors, one wording everywhere; and the refusal of a plan whose blocks were edited by hand.

A lock held by a live run is `locked` with the holder's view (run id, phase, pid, how long); a write
lock that stays busy is `locked`; a damaged or unreadable lock file is `io`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from runbook.errors import RunbookError

if TYPE_CHECKING:
    from runbook.model import Plan
    from runbook.store.lock import RunLock
    from runbook.store.workspace import Workspace


def may_commit(ws: Workspace, no_commit: bool, warn: Callable[[str], None]) -> bool:
    """Whether a run commits its results: not with --no-commit, not outside git (warned); a git state
    that cannot take a commit (a merge in progress, a detached HEAD ...) is refused (`git_state`)."""
    if no_commit:
        return False
    if not ws.git:
        warn(f"{ws.root} is not a git repository: results are written but not committed")
        return False
    from runbook.store.gitops import GitStateError, check_can_commit

    try:
        check_can_commit(ws.root, [ws.plan_rel])
    except GitStateError as exc:
        raise RunbookError(f"refusing to run: {exc}", "git_state") from None
    return True


@contextlib.contextmanager
def holding_run_lock(ws: Workspace, warn: Callable[[str], None], plan: Plan | None = None,
                     refusal: str = "refusing while a run is in progress: ") -> Iterator[RunLock]:
    """Hold the workspace's run lock for the `with` body; refusals raised as RunbookErrors. `plan`
    (default the workspace's) names the holder's phase; `refusal` leads the `locked` message."""
    from runbook.store.lock import LockBusy, LockCorrupt, LockError, LockHeld, WriteLockTimeout, run_lock

    try:
        with run_lock(ws.state, git_dir=ws.git_dir, warn=warn) as lock:
            yield lock
    except LockHeld as exc:
        from runbook.run.planstate import holder_view

        raise RunbookError(f"{refusal}{exc}", "locked", file=ws.rel(exc.path),
                           lock=holder_view(exc.info, ws.plan if plan is None else plan, ws.rel(ws.state),
                                            live=ws.live_of(exc.info.run_id), root=ws.root,
                                            state_dir=ws.state)) from None
    except (WriteLockTimeout, LockBusy) as exc:
        raise RunbookError(str(exc), "locked", file=ws.rel(exc.path)) from None
    except LockCorrupt as exc:
        raise RunbookError(str(exc), "io", file=ws.rel(exc.path)) from None
    except LockError as exc:
        raise RunbookError(str(exc), "io") from None


def refuse_hand_edits(ws: Workspace, plan: Plan) -> None:
    """Refuse (`hand_edited`, nothing run, written or committed) while any block of the plan, in
    any phase, was edited by hand: a run's commit holds the whole plan, and such an edit must
    not go into git as runbook's record."""
    from runbook.plan.writeback import HandEdited, check_plan

    try:
        check_plan(plan, ws.plan_rel)
    except HandEdited as exc:
        raise RunbookError(f"refusing to run: {exc}", "hand_edited", file=ws.plan_rel) from None
