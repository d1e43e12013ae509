"""What must be committed before runbook commits its own change: a person's plan edits, then runs a
stopped runbook left uncommitted. One helper, `commit_pending`, for `next`, `forget` and `reset`.

Every commit runbook makes holds one author's change, so that `git revert` of it undoes exactly that:

1. the plan's uncommitted edits (a person's), alone: `runbook: plan edits before <what>`;
2. runs a stopped `runbook next` saved to the ledger but never committed (killed, or its commit
   refused or stopped by a hook), their results written into the plan if they are not there yet:
   `runbook: record run <id> (left uncommitted)`;
3. then the caller's own commit (the run, the forget, the reset).

When such a run's write-back is already in the plan, the person's edits are told apart from it by
taking it out again (the phase written back from the runs before it, as `forget` does: its blocks
must then be those HEAD has); commit 1 holds that text (the work tree is left as it is), so `git
revert` of commit 2 takes out exactly the run. When they cannot be told apart (a block edited by
hand), the warning says so and both go into commit 2, as one change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from runbook.errors import RunbookError
from runbook.files import atomic_write_text, remove_stale_temps
from runbook.model import RunRecord
from runbook.plan import writeback
from runbook.store import gitops, ledger
from runbook.store.workspace import Workspace

__all__ = ["Pending", "commit_pending", "plan_without"]

Say = Callable[[str], None]


@dataclass
class Pending:
    """What `commit_pending` committed."""

    edits: str | None = None  # the commit of the person's plan edits
    runs: list[str] = field(default_factory=list)  # the ids of the runs recovered and committed
    record: str | None = None  # their commit


def plan_without(ws: Workspace, text: str, runs: list[RunRecord]) -> str:
    """`text` with every phase of `runs` written back from the phase's other runs (its blocks and
    ticks gone when none is left); RunbookError `hand_edited` when a block was edited by hand."""
    from runbook.plan.parse import parse_plan

    gone = {r.run_id for r in runs}
    index = ws.ledger()
    for phase_id in dict.fromkeys(r.phase for r in runs):
        plan, _ = parse_plan(text, ws.plan_rel)
        phase = plan.find_phase(phase_id) if plan else None
        if plan is None or phase is None:
            continue
        remaining = [r for r in index.rows(ws.plan_rel, phase_id) if r.run_id not in gone]
        shown = remaining[-writeback.RESULTS_ROWS:]
        history = index.load(shown)
        try:
            if history:
                text = writeback.apply_run(text, plan, phase_id, history[-1], history, file=ws.plan_rel,
                                           earlier=len(remaining) - len(shown))
            else:
                text = writeback.clear_phase(text, plan, phase_id, file=ws.plan_rel)
        except writeback.HandEdited as exc:
            raise RunbookError(f"refusing: {exc}", "hand_edited", file=ws.plan_rel) from None
    return text


def _unrecorded(ws: Workspace) -> list[RunRecord]:
    """Runs of this plan whose ledger file is in the work tree but not committed as it is."""
    dirty = gitops.dirty_paths(ws.root, ws.rel(ledger.runs_dir(ws.state)))
    if not dirty:
        return []
    ws.ledger_changed()
    index = ws.ledger()
    return index.load([
        r for r in index.rows(ws.plan_rel)
        if "/" not in r.run_id and ws.rel(ledger.run_path(ws.state, r.run_id)) in dirty
        and ledger.run_path(ws.state, r.run_id).is_file()
    ])


def _shown(ws: Workspace, text: str, record: RunRecord) -> bool:
    """Whether the run's id is in its phase's text (its write-back was made)."""
    from runbook.plan.parse import parse_plan

    plan, _ = parse_plan(text, ws.plan_rel)
    phase = plan.find_phase(record.phase) if plan is not None else None
    return phase is not None and record.run_id in text[phase.span.start : phase.span.end]


def _plan_with(ws: Workspace, text: str, records: list[RunRecord]) -> str:
    """`text` with the results of each of `records` not shown in its phase yet written back (the
    phase's runs up to it in the table); a phase gone or edited by hand is left as it is."""
    from runbook.plan.parse import parse_plan

    index = ws.ledger()
    rows = index.rows(ws.plan_rel)
    for record in records:
        current, _ = parse_plan(text, ws.plan_rel)
        if current is None or current.find_phase(record.phase) is None or _shown(ws, text, record):
            continue
        before = [r for r in rows if r.phase == record.phase and (r.started, r.run_id) <= (record.started, record.run_id)]
        shown = before[-writeback.RESULTS_ROWS:]
        try:
            text = writeback.apply_run(text, current, record.phase, record, index.load(shown), file=ws.plan_rel,
                                       earlier=len(before) - len(shown))
        except writeback.HandEdited:
            continue
    return text


def _blocks(ws: Workspace, text: str, phase_ids: list[str]) -> list[list[str]] | None:
    """The text of each tool-owned block of each phase (None when a phase is not in `text`)."""
    from runbook.plan.parse import parse_plan

    plan, _ = parse_plan(text, ws.plan_rel)
    found = []
    for phase_id in phase_ids:
        phase = plan.find_phase(phase_id) if plan is not None else None
        if phase is None:
            return None
        found.append([text[b.span.start : b.span.end] for _, b in sorted(phase.blocks.items())])
    return found


def _edits_alone(ws: Workspace, text: str, records: list[RunRecord]) -> str | None:
    """The plan as the person left it, without the write-back of `records` that is in `text`: their
    phases written back from the runs before them. None when that does not give back the blocks
    those phases have in HEAD (a run the ledger lacks, a block edited by hand)."""
    written = [r for r in records if _shown(ws, text, r)]
    if not written:
        return text
    try:
        mine = plan_without(ws, text, written)
    except RunbookError:
        return None
    head = gitops.show_blob(ws.root, f"{gitops.record_ref(ws.root)}:{ws.plan_rel}")
    phase_ids = list(dict.fromkeys(r.phase for r in written))
    if head is None or _blocks(ws, mine, phase_ids) != _blocks(ws, head, phase_ids):
        return None
    return mine


def commit_pending(ws: Workspace, before: str, *, stop: Callable[[], bool] | None, say: Say, warn: Say,
                   edits: bool = True) -> Pending:
    """Commit, each alone, the plan's uncommitted edits (`runbook: plan edits before <before>`) and
    the runs a stopped runbook left uncommitted, before the caller's own commit.

    Call under the write lock, in a git work tree, when committing. `edits=False`: the plan's edits
    are committed only when such a run is (its commit must not hold them). `stop`: what stops a git
    command (a hook) that hangs, as in `gitops.commit_paths`. Raises GitStateError when git refuses
    (a commit already made stays made)."""
    from runbook.plan.parse import read_text

    remove_stale_temps(ws.plan_file)
    if ws.notes_path is not None:
        remove_stale_temps(ws.notes_path)
    done = Pending()
    records = _unrecorded(ws)
    if not (edits or records):
        return done
    text, problem = read_text(str(ws.plan_path))
    if problem is not None:
        records = []  # the runs stay on disk; committing them would need the plan
        if not edits:
            return done
    mine = _edits_alone(ws, text, records) if records else text
    if mine is None:
        warn(f"the uncommitted edits of {ws.plan_rel} cannot be told apart from the results of run "
             f"{', '.join(r.run_id for r in records)} written into it (a block edited by hand?): they are "
             "committed together with the run")
    elif gitops.is_dirty(ws.root, ws.plan_rel):
        subject = f"runbook: plan edits before {before}"
        given = {ws.plan_rel: mine.encode("utf-8")} if mine != text else None
        done.edits = gitops.commit_paths(ws.root, [ws.plan_rel], subject, stop=stop, contents=given)
        if done.edits:
            say(f"committed the plan's uncommitted edits first ({subject})")
    if not records:
        return done
    new_text = _plan_with(ws, text, records)
    if new_text != text:
        atomic_write_text(ws.plan_file, new_text)
    kept = [ledger.series_path(ws.state, r.run_id) for r in records]
    paths = [ws.rel(ledger.run_path(ws.state, r.run_id)) for r in records] + [ws.rel(p) for p in kept if p.is_file()]
    done.runs = [r.run_id for r in records]
    subject = f"runbook: record run {', '.join(done.runs)} (left uncommitted)"
    done.record = gitops.commit_paths(ws.root, [ws.plan_rel, *paths], subject, stop=stop)
    warn(f"committed run {', '.join(done.runs)}, which an interrupted runbook recorded but left uncommitted "
         f"({subject})")
    return done
