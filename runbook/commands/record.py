"""`runbook record`: write a milestone, lessons and next steps into the plan's notes document."""

from __future__ import annotations

import datetime as _dt
import os
import re
import sys
from pathlib import Path

import click
from pydantic import BaseModel

from runbook.commands._context import PlanContext, open_plan
from runbook.model import RunRecord
from runbook.notes import Milestone, RecordOutcome

_METRIC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*=\s*(\S+)\s*$")
_EDITOR_SECTIONS = {"metrics": "metrics", "lessons": "lessons", "lessons learned": "lessons", "next steps": "next"}


class Recorded(BaseModel):
    """What `runbook record --json` prints."""

    notes: str  # repo-relative path of the notes document
    created_notes: bool  # the document did not exist before
    milestone: Milestone
    lessons_added: list[str]
    lessons_skipped: list[str]  # already in "Lessons learned"
    next_steps: list[str] | None  # the new "Next steps", None when left as they were
    commit: str | None  # None with --no-commit or when nothing changed


def parse_metric(text: str) -> tuple[str, float]:
    """`accept_len=2.41` -> ("accept_len", 2.41); raises ValueError with the fix."""
    match = _METRIC.match(text)
    value: float | None = None
    if match:
        try:
            value = float(match.group(2))
        except ValueError:
            value = None
    if not match or value is None or value != value:
        raise ValueError(f"{text!r} is not NAME=NUMBER (e.g. --metric accept_len=2.41)")
    return match.group(1), value


def parse_editor_text(text: str) -> tuple[str, str, dict[str, float], list[str], list[str]]:
    """The edited template -> (title, body, metrics, lessons, next steps). Pure."""
    text = re.sub(r"<!--.*?-->", "", text.replace("\r\n", "\n"), flags=re.S)
    title = ""
    body: list[str] = []
    metrics: dict[str, float] = {}
    lists: dict[str, list[str]] = {"lessons": [], "next": []}
    part = "body"
    for line in text.split("\n"):
        heading = re.match(r"^##\s+(.+?)\s*$", line)
        if heading and heading.group(1).casefold() in _EDITOR_SECTIONS:
            part = _EDITOR_SECTIONS[heading.group(1).casefold()]
            continue
        if not title and part == "body":
            if line.strip():
                title = line.strip().lstrip("#").strip()
            continue
        if part == "body":
            body.append(line)
        elif part == "metrics":
            if line.strip():
                name, value = parse_metric(line.strip().lstrip("-* ").replace(":", "=", 1))
                metrics[name] = value
        else:
            item = re.sub(r"^\s*[-*+]\s?", "", line).strip()
            if item:
                lists[part].append(item)
    return title, "\n".join(body).strip("\n"), metrics, lists["lessons"], lists["next"]


def _find_run(ctx: PlanContext, ref: str) -> RunRecord:
    from runbook.ledger import load_runs

    runs = load_runs(ctx.state, plan=ctx.plan_rel)
    if ref == "last":
        if not runs:
            raise click.BadParameter(f"no runs of {ctx.plan_rel} in {ctx.state}/runs yet", param_hint="--run")
        return runs[-1]
    matches = [r for r in runs if r.run_id == ref] or [r for r in runs if r.run_id.startswith(ref)]
    if len(matches) != 1:
        known = ", ".join(r.run_id for r in runs[-5:]) or "none"
        what = "matches several runs" if matches else "is not a run"
        raise click.BadParameter(
            f"{ref!r} {what} of {ctx.plan_rel} (latest: {known}; `runbook history` lists them)",
            param_hint="--run",
        )
    return matches[0]


def _editor_session(title: str | None, ctx: PlanContext, run: RunRecord | None) -> tuple[str, str, dict[str, float], list[str], list[str]]:
    from runbook.templates import render

    template = render(
        "record-editor.md.j2",
        title=title or "",
        plan=ctx.plan_rel,
        notes=ctx.notes_rel,
        run=run,
    )
    edited = click.edit(template, extension=".md")
    if edited is None:
        raise click.ClickException("editor closed without saving: nothing recorded")
    try:
        parsed = parse_editor_text(edited)
    except ValueError as exc:
        raise click.UsageError(f"in the Metrics section: {exc}") from None
    if not parsed[0]:
        raise click.ClickException("empty title: nothing recorded")
    return parsed


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


@click.command(
    "record",
    epilog="""\b
Examples:
  runbook record "Pipeline validated end to end" --metric extract_tok_s=2912 \\
      --lesson "batch 4, not 2000, or extraction OOMs" --next "Phase 1: fine-tune"
  runbook record "Phase 0 judged" --run last --body notes.txt
  echo "what happened" | runbook record "Probe done" --body - --json

\b
Exit codes: 0 recorded, 1 written but the commit failed (or cancelled in the editor),
2 usage or plan/notes errors, 5 the write lock stayed busy.""",
)
@click.argument("title", required=False)
@click.option("--metric", "-m", "metric_args", multiple=True, metavar="NAME=NUMBER", help="A number to record; repeatable. Wins over the run's value of the same name.")
@click.option("--lesson", "-l", "lessons", multiple=True, metavar="TEXT", help="Append to 'Lessons learned' unless already there (case, spacing, backticks and final stops ignored); repeatable.")
@click.option("--next", "-n", "next_steps", multiple=True, metavar="TEXT", help="Replace 'Next steps' with these items (all --next flags together); repeatable.")
@click.option("--run", "run_ref", metavar="RUN_ID|last", help="Attach a run of this plan: its id, phase, verdict, commit and metrics go into the milestone.")
@click.option("--body", type=click.File("r", encoding="utf-8"), metavar="FILE|-", help="Milestone text (Markdown) from a file, or '-' for stdin.")
@click.option("--plan", "plan_opt", metavar="PATH", help="The plan whose notes to write (default: the only plan in the repo).")
@click.option("--no-commit", is_flag=True, help="Write the notes but do not commit them.")
@click.option("--json", "as_json", is_flag=True, help="Print what was recorded as JSON.")
def command(
    title: str | None,
    metric_args: tuple[str, ...],
    lessons: tuple[str, ...],
    next_steps: tuple[str, ...],
    run_ref: str | None,
    body,
    plan_opt: str | None,
    no_commit: bool,
    as_json: bool,
) -> None:
    """Write a milestone into the notes document named by the plan's `notes:` front matter.

    Appends a dated entry (TITLE, body, metrics and, with --run, the run's id, phase, verdict and
    commit) to "## Milestones", adds new lessons to "## Lessons learned", replaces "## Next steps"
    when --next is given, refreshes the status block, and commits the notes file alone. Sections
    are created on first use; text outside them is never touched. Only the short write lock is
    taken, so this works while `runbook next` runs a long phase.

    Run with no TITLE and no options in a terminal to write the milestone in $EDITOR.
    """
    metrics: dict[str, float] = {}
    for arg in metric_args:
        try:
            name, value = parse_metric(arg)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--metric") from None
        metrics[name] = value
    body_text = body.read() if body is not None else ""

    ctx = open_plan(plan_opt)
    notes_path, notes_rel = ctx.notes_path, ctx.notes_rel
    if notes_path is None or notes_rel is None:
        raise click.UsageError(
            f"{ctx.plan_rel} names no notes document: add `notes: notes.md` (relative to the plan) to its front matter"
        )
    run = _find_run(ctx, run_ref) if run_ref else None

    no_flags = not (metric_args or lessons or next_steps or body is not None)
    if title is None:
        if no_flags and sys.stdin.isatty() and sys.stdout.isatty():
            title, body_text, metrics, lessons_list, next_list = _editor_session(None, ctx, run)
            lessons, next_steps = tuple(lessons_list), tuple(next_list)
        else:
            raise click.UsageError("give the milestone's TITLE (or run with no arguments in a terminal to use $EDITOR)")

    merged: dict[str, float] = {}
    if run is not None:
        from runbook.brief import top_metrics

        merged.update(top_metrics(run.metrics))
    merged.update(metrics)
    milestone = Milestone(
        title=title,
        when=_now(),
        body=body_text,
        metrics=merged,
        run_id=run.run_id if run else None,
        phase=run.phase if run else None,
        phase_label=run.phase_label if run else None,
        verdict=run.verdict if run else None,
        commit=(run.commit or run.commit_before) if run else None,
    )
    recorded = write_record(ctx, milestone, list(lessons), list(next_steps) or None, commit=not no_commit)
    if as_json:
        click.echo(recorded.model_dump_json(indent=2))
        return
    parts = [f"recorded '{milestone.title}' in {recorded.notes}"]
    if recorded.created_notes:
        parts.append("(new file)")
    click.echo(" ".join(parts))
    if recorded.lessons_added:
        click.echo(f"  lessons added: {len(recorded.lessons_added)}")
    for lesson in recorded.lessons_skipped:
        click.echo(f"  lesson already there, not added again: {lesson}")
    if recorded.next_steps is not None:
        click.echo(f"  next steps replaced: {len(recorded.next_steps)} item(s)")
    if recorded.commit:
        click.echo(f"  commit {recorded.commit[:10]}")
    elif not no_commit:
        click.echo("  nothing to commit")


def write_record(
    ctx: PlanContext,
    milestone: Milestone,
    lessons: list[str],
    next_steps: list[str] | None,
    commit: bool = True,
) -> Recorded:
    """Under the write lock: read the notes, apply the record, write atomically, commit."""
    from runbook.atomic import atomic_write_text
    from runbook.brief import status_block
    from runbook.ledger import load_runs
    from runbook.lock import LockError, write_lock
    from runbook.notes import apply_record, new_notes, problems

    notes_path, notes_rel = ctx.notes_path, ctx.notes_rel
    assert notes_path is not None and notes_rel is not None
    if commit:
        from runbook.gitops import GitStateError, check_can_commit

        try:
            check_can_commit(ctx.root)
        except GitStateError as exc:
            raise click.UsageError(f"{exc} (or pass --no-commit)") from None
    try:
        with write_lock(ctx.state):
            created = not notes_path.exists()
            if created:
                link = Path(os.path.relpath(ctx.plan_path, notes_path.parent)).as_posix()
                text = new_notes(ctx.plan.title or ctx.plan_rel, link)
            else:
                try:
                    raw = notes_path.read_bytes()
                    text = raw.decode("utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    raise click.UsageError(f"{notes_rel}: cannot read it as UTF-8 text ({exc})") from None
            found = problems(text)
            if found:
                for line, message in found:
                    click.echo(f"{notes_rel}:{line}:1: {message}", err=True)
                raise click.UsageError(f"{notes_rel} needs fixing before runbook can edit it")
            status = status_block(ctx.plan, ctx.plan_rel, load_runs(ctx.state), milestone.when)
            new_text, outcome = apply_record(text, milestone, lessons, next_steps, status)
            try:
                notes_path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(notes_path, new_text)
            except OSError as exc:
                click.echo(f"runbook record: {notes_rel}: cannot write it ({exc.strerror or exc}); "
                           "it is unchanged and nothing was recorded", err=True)
                sys.exit(2)
            sha = _commit(ctx, notes_rel, milestone, outcome) if commit else None
    except LockError as exc:
        click.echo(f"runbook record: {exc}", err=True)
        sys.exit(5)
    return Recorded(
        notes=notes_rel,
        created_notes=created,
        milestone=milestone,
        lessons_added=outcome.lessons_added,
        lessons_skipped=outcome.lessons_skipped,
        next_steps=next_steps,
        commit=sha,
    )


def _headline_metrics(ctx: PlanContext, milestone: Milestone) -> list[str]:
    """Metric names for the commit subject: those the run's `Pass:` names first, then the rest."""
    from runbook.criteria import metric_names

    phase = ctx.plan.find_phase(milestone.phase) if milestone.phase else None
    judged = metric_names(phase.criterion.expr) if phase is not None and phase.criterion is not None else []
    first = [name for name in judged if name in milestone.metrics]
    return first + [name for name in milestone.metrics if name not in first]


def _commit(ctx: PlanContext, notes_rel: str, milestone: Milestone, outcome: RecordOutcome) -> str | None:
    from runbook.gitops import GitStateError, commit_paths

    shown = ", ".join(f"{k}={milestone.metrics[k]:g}" for k in _headline_metrics(ctx, milestone)[:3])
    subject = f"runbook: record {milestone.title}" + (f" ({shown})" if shown else "")
    details = [f"Notes: {notes_rel}"]
    if milestone.run_id:
        details.append(f"Run: {milestone.run_id} ({milestone.phase}, {milestone.verdict})")
    details += [f"Lesson: {lesson}" for lesson in outcome.lessons_added]
    try:
        return commit_paths(ctx.root, [notes_rel], subject + "\n\n" + "\n".join(details) + "\n")
    except GitStateError as exc:
        click.echo(
            f"runbook record: {notes_rel} is written but not committed: {exc}\n"
            f"  commit it yourself (git add {notes_rel} && git commit) or use --no-commit",
            err=True,
        )
        sys.exit(1)
