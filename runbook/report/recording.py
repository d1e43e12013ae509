"""The `runbook record` service: write a milestone, lessons and next steps into the notes, commit.

The click command (runbook/commands/record.py) parses options and prints; this module does the
work for a `Workspace`, under the short write lock, and refuses with `RunbookError`s: notes that
cannot be edited safely (notes_invalid), git in a state where it will not commit (git_state), a
write that fails (io), the write lock busy (locked), a commit git refused after writing
(commit_failed). The notes' status block comes from runbook/run/planstate.py, like every other
reader's view of where the plan stands.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from runbook.contract import MilestoneView, RecordResult, phase_label
from runbook.errors import RunbookError
from runbook.formatting import format_value, iso, iso_utc, minute_text, utc_now
from runbook.model import RunRecord
from runbook.report.notes import Milestone, RecordOutcome
from runbook.store.workspace import Workspace

__all__ = ["milestone_for", "write_record"]


def now_text() -> str:
    """The milestone time as the notes show it: "2026-11-29 14:30 UTC"."""
    return minute_text(utc_now()) + " UTC"


def milestone_for(title: str, body: str, metrics: dict[str, float], run: RunRecord | None) -> Milestone:
    """A milestone entry; with a run: its id, phase, verdict, the commit its code ran on, and its
    metrics (without the per-step copies; `metrics` win)."""
    from runbook.contract import top_metrics

    merged: dict[str, float] = {}
    if run is not None:
        merged.update({k: v for k, v in top_metrics(run.metrics).items() if isinstance(v, (int, float))})
    merged.update(metrics)
    return Milestone(
        title=title,
        when=now_text(),
        body=body,
        metrics=merged,
        run_id=run.run_id if run else None,
        phase=run.phase if run else None,
        phase_label=run.phase_label if run else None,
        verdict=run.verdict if run else None,
        commit=run.commit_before if run else None,
    )


def write_record(
    ws: Workspace,
    milestone: Milestone,
    lessons: list[str],
    next_steps: list[str] | None,
    commit: bool = True,
    warn: Callable[[str], None] = lambda _msg: None,
    attachments: list[Path] | None = None,
    replace_next: bool = False,
) -> RecordResult:
    """Under the write lock: read the notes, apply the record, write atomically, commit.
    `attachments`: files the milestone links to (its plots), committed with the notes. `next_steps`
    are added to the notes' "Next steps"; with `replace_next` they replace them."""
    from runbook.files import atomic_write_text, remove_stale_temps
    from runbook.report.brief import status_block
    from runbook.report.notes import apply_record, new_notes, problems
    from runbook.run.planstate import for_workspace
    from runbook.store.lock import LockError, write_lock

    notes_path, notes_rel = ws.notes_path, ws.notes_rel
    if notes_path is None or notes_rel is None:
        raise RunbookError(f"{ws.plan_rel} names no notes document", "config", file=ws.plan_rel,
                           hint="add `notes: notes.md` (relative to the plan) to its front matter")
    ws.check_notes_inside()
    if commit:
        from runbook.store.gitops import GitStateError, check_can_commit

        try:
            check_can_commit(ws.root, ([notes_rel] if notes_path.exists() else [])
                             + [ws.rel(p) for p in attachments or []])
        except GitStateError as exc:
            raise RunbookError(f"{exc} (or pass --no-commit)", "git_state") from None
    try:
        with write_lock(ws.state):
            ws.ledger_changed()  # a run may have been recorded since the caller looked
            remove_stale_temps(notes_path)  # of a record killed mid-write
            created = not notes_path.exists()
            if created:
                assert ws.plan_path is not None
                link = Path(os.path.relpath(ws.plan_path, notes_path.parent)).as_posix()
                text = new_notes(ws.plan.title or ws.plan_rel, link)
            else:
                try:
                    text = notes_path.read_bytes().decode("utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    raise RunbookError(f"{notes_rel}: cannot read it as UTF-8 text ({exc})", "notes_invalid",
                                       file=notes_rel) from None
            found = problems(text)
            if found:
                from runbook.model import Problem

                listed = [Problem(file=notes_rel, line=line, message=message) for line, message in found]
                raise RunbookError(f"{notes_rel} needs fixing before runbook can edit it", "notes_invalid",
                                   file=notes_rel, line=found[0][0], col=1, problems=listed)
            unreadable: list[str] = []
            state = for_workspace(ws, problems=unreadable)
            # the moment taken under the write lock, which run records are written under too: brief
            # tells the runs that ended before these notes from those that ended after, to the microsecond
            status = status_block(ws.plan, ws.plan_rel, ws.ledger(), milestone.when, state, iso(utc_now()))
            new_text, outcome = apply_record(text, milestone, lessons, next_steps, status, replace_next=replace_next)
            try:
                notes_path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(notes_path, new_text)
            except OSError as exc:
                raise RunbookError(
                    f"runbook record: {notes_rel}: cannot write it ({exc.strerror or exc}); it is unchanged and "
                    "nothing was recorded", "io", file=notes_rel) from None
            sha = _commit(ws, notes_rel, milestone, outcome, [ws.rel(p) for p in attachments or []]) if commit else None
    except LockError as exc:
        raise RunbookError(f"runbook record: {exc}", "locked") from None
    return RecordResult(
        notes=notes_rel,
        created_notes=created,
        milestone=MilestoneView(
            title=milestone.title, when=iso_utc(milestone.when) or milestone.when, body=milestone.body,
            metrics=milestone.metrics, run_id=milestone.run_id, phase=milestone.phase,
            label=phase_label(milestone.phase_label) if milestone.phase_label else None,
            verdict=milestone.verdict, commit=milestone.commit,
        ),
        lessons_added=outcome.lessons_added,
        lessons_skipped=outcome.lessons_skipped,
        next_steps=next_steps,
        next_steps_replaced=outcome.next_steps_replaced,
        next_steps_skipped=outcome.next_steps_skipped,
        commit=sha,
        plots=[ws.rel(p) for p in attachments or []],
    )


def draw_plots(ws: Workspace, run: RunRecord | None, metrics: list[str]) -> list[tuple[Path, str]]:
    """Charts for a milestone: each metric's series in `run` when it has one (a choice's: the chosen
    run's, `runbook choose` / a sweep's pick), else the metric across the runs of its phase up to it;
    PNG files under `plots/` beside the notes, each with the Markdown image line that shows it (a
    path relative to the notes). RunbookError when a metric has neither."""
    from runbook.report.plotting import draw, plan_chart
    from runbook.store.series import find, load

    if not metrics:
        return []
    index = ws.ledger()
    if run is None:
        run = index.last(ws.plan_rel)
        if run is None:
            raise RunbookError(f"--plot: no runs of {ws.plan_rel} yet to plot", "unknown_run",
                               hint="run a phase first, or leave --plot out")
    notes_path = ws.notes_path
    assert notes_path is not None
    folder = notes_path.parent / "plots"
    curves = run
    if run.decision is not None and not run.series:  # a choice: its curves are those of the run it chose
        curves = index.find(run.decision.run, ws.plan_rel) or run
    out: list[tuple[Path, str]] = []
    for metric in metrics:
        if curves.series and find(load(ws.state, curves.run_id), metric) is not None:
            chart = plan_chart(metric, [curves], ws.state)
        else:
            upto = index.load([r for r in index.rows(ws.plan_rel, run.phase)
                               if (r.started, r.run_id) <= (run.started, run.run_id)])
            chart = plan_chart(metric, upto or [run], ws.state)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", metric)
        png = folder / f"{run.run_id}-{slug}.png"
        draw(chart, png)
        what = f"{metric} by step, run {curves.run_id}" if chart.kind == "series" else chart.title
        out.append((png, f"![{what}](plots/{png.name})"))
    return out


def _headline_metrics(ws: Workspace, milestone: Milestone) -> list[str]:
    """Metric names for the commit subject: those the run's `Pass:` names first, then the rest."""
    from runbook.plan.criteria import metric_names

    phase = ws.plan.find_phase(milestone.phase) if milestone.phase else None
    judged = metric_names(phase.criterion.expr) if phase is not None and phase.criterion is not None else []
    first = [name for name in judged if name in milestone.metrics]
    return first + [name for name in milestone.metrics if name not in first]


def _commit(ws: Workspace, notes_rel: str, milestone: Milestone, outcome: RecordOutcome,
            attachments: list[str] | None = None) -> str | None:
    from runbook.store.gitops import GitStateError, commit_paths

    shown = ", ".join(f"{k}={format_value(milestone.metrics[k])}" for k in _headline_metrics(ws, milestone)[:3])
    subject = f"runbook: record {milestone.title}" + (f" ({shown})" if shown else "")
    details = [f"Notes: {notes_rel}"]
    if milestone.run_id:
        details.append(f"Run: {milestone.run_id} ({milestone.phase}, {milestone.verdict})")
    details += [f"Lesson: {lesson}" for lesson in outcome.lessons_added]
    try:
        return commit_paths(ws.root, [notes_rel, *(attachments or [])], subject + "\n\n" + "\n".join(details) + "\n")
    except GitStateError as exc:
        raise RunbookError(
            f"runbook record: {notes_rel} is written but not committed: {exc}", "commit_failed", file=notes_rel,
            hint=f"commit it yourself (git add {notes_rel} && git commit) or use --no-commit",
        ) from None
