"""`runbook record`: write a milestone, lessons and next steps into the plan's notes document."""

from __future__ import annotations

import re
import sys
from typing import IO, TYPE_CHECKING

import click

from runbook.commands._options import json_option, open_plan, plan_option
from runbook.commands._output import Output
from runbook.errors import RunbookError
from runbook.model import RunRecord
from runbook.plan.mdtext import to_lf

if TYPE_CHECKING:
    from runbook.store.workspace import Workspace

_METRIC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*=\s*(\S+)\s*$")
_EDITOR_SECTIONS = {"metrics": "metrics", "lessons": "lessons", "lessons learned": "lessons", "next steps": "next"}


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
    text = re.sub(r"<!--.*?-->", "", to_lf(text), flags=re.S)
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


def _editor_session(title: str | None, ws: Workspace, run: RunRecord | None) -> tuple[str, str, dict[str, float], list[str], list[str]]:
    from runbook.report.templates import render

    template = render("record-editor.md.j2", title=title or "", plan=ws.plan_rel, notes=ws.notes_rel, run=run)
    edited = click.edit(template, extension=".md")
    if edited is None:
        raise RunbookError("editor closed without saving: nothing recorded", "not_confirmed", exit_code=1)
    try:
        parsed = parse_editor_text(edited)
    except ValueError as exc:
        raise RunbookError(f"in the Metrics section: {exc}", "usage") from None
    if not parsed[0]:
        raise RunbookError("empty title: nothing recorded", "not_confirmed", exit_code=1)
    return parsed


@click.command(
    "record",
    epilog="""\b
Examples:
  runbook record "Pipeline validated end to end" --metric extract_tok_s=2912 \\
      --lesson "batch 4, not 2000, or extraction OOMs" --next "Phase 1: fine-tune"
  runbook record "Phase 0 judged" --run last --body notes.txt
  echo "what happened" | runbook record "Probe done" --body - --json
  runbook record "Drafter trained" --run last --plot train_loss --plot val_loss
  runbook record "Plan changed" --next "Phase 2: more data" --replace-next

\b
Exit codes: 0 recorded, 1 written but the commit failed (or cancelled in the editor),
2 usage or plan/notes errors, 5 the write lock stayed busy.""",
)
@click.argument("title", required=False)
@click.option("--metric", "-m", "metric_args", multiple=True, metavar="NAME=NUMBER", help="A number to record; repeatable. Wins over the run's value of the same name.")
@click.option("--lesson", "-l", "lessons", multiple=True, metavar="TEXT", help="Append to 'Lessons learned' unless already there (case, spacing, backticks and final stops ignored); repeatable.")
@click.option("--next", "-n", "next_steps", multiple=True, metavar="TEXT", help="Add an item to 'Next steps', after those there (one already there is not added again); repeatable.")
@click.option("--replace-next", is_flag=True, help="The --next items replace every item of 'Next steps' instead of being added.")
@click.option("--run", "run_ref", metavar="RUN", help="Attach a run of this plan (its id, a unique prefix, `last`, `last~N`): its id, phase, verdict, commit and metrics go into the milestone.")
@click.option("--body", type=click.File("r", encoding="utf-8"), metavar="FILE|-", help="Milestone text (Markdown) from a file, or '-' for stdin.")
@click.option("--plot", "plot_metrics", multiple=True, metavar="METRIC",
              help="Show METRIC as a chart in the milestone (repeatable): the run's series of it (e.g. the training "
                   "curve), else its value across the phase's runs. A PNG under plots/ beside the notes, committed "
                   "with them. The run: --run, else the last.")
@plan_option
@click.option("--no-commit", is_flag=True, help="Write the notes but do not commit them.")
@json_option
def command(
    title: str | None,
    metric_args: tuple[str, ...],
    lessons: tuple[str, ...],
    next_steps: tuple[str, ...],
    run_ref: str | None,
    body: IO[str] | None,
    plan_opt: str | None,
    no_commit: bool,
    as_json: bool,
    plot_metrics: tuple[str, ...] = (),
    replace_next: bool = False,
) -> Output:
    """Write a milestone into the notes document named by the plan's `notes:` front matter.

    Appends a dated entry (TITLE, body, metrics and, with --run, the run's id, phase, verdict and
    commit) to "## Milestones", adds new lessons to "## Lessons learned", adds the --next items to
    "## Next steps" (with --replace-next they replace them), refreshes the status block, and
    commits the notes file alone. Sections
    are created on first use; text outside them is never touched. Only the short write lock is
    taken, so this works while `runbook next` runs a long phase.

    Run with no TITLE and no options in a terminal to write the milestone in $EDITOR.
    """
    from runbook.report.recording import draw_plots, milestone_for, write_record

    metrics: dict[str, float] = {}
    for arg in metric_args:
        try:
            name, value = parse_metric(arg)
        except ValueError as exc:
            raise RunbookError(f"--metric: {exc}", "usage") from None
        metrics[name] = value
    body_text = body.read() if body is not None else ""

    ws = open_plan(plan_opt)
    ws.check_notes_inside()
    if ws.notes_path is None:
        raise RunbookError(f"{ws.plan_rel} names no notes document", "config", file=ws.plan_rel,
                           hint="add `notes: notes.md` (relative to the plan) to its front matter")
    run = ws.find_run(run_ref) if run_ref else None

    no_flags = not (metric_args or lessons or next_steps or body is not None)
    if title is None:
        if no_flags and not as_json and sys.stdin.isatty() and sys.stdout.isatty():
            title, body_text, metrics, lessons_list, next_list = _editor_session(None, ws, run)
            lessons, next_steps = tuple(lessons_list), tuple(next_list)
        else:
            raise RunbookError("give the milestone's TITLE", "usage",
                               hint="runbook record TITLE [--lesson ...]; in a terminal, no arguments open $EDITOR")

    plots = draw_plots(ws, run, list(plot_metrics))
    if plots:
        body_text = "\n\n".join([body_text.rstrip("\n"), *(line for _, line in plots)]).lstrip("\n")
    milestone = milestone_for(title, body_text, metrics, run)
    try:
        recorded = write_record(ws, milestone, list(lessons), list(next_steps) or None, commit=not no_commit,
                                attachments=[path for path, _ in plots], replace_next=replace_next)
    except BaseException:
        for path, _ in plots:  # nothing recorded: no chart left behind
            path.unlink(missing_ok=True)
        raise
    parts = [f"recorded '{milestone.title}' in {recorded.notes}"]
    if recorded.created_notes:
        parts.append("(new file)")
    lines = [" ".join(parts)]
    if recorded.lessons_added:
        lines.append(f"  lessons added: {len(recorded.lessons_added)}")
    for lesson in recorded.lessons_skipped:
        lines.append(f"  lesson already there, not added again: {lesson}")
    if recorded.next_steps is not None and recorded.next_steps_replaced:
        lines.append(f"  next steps replaced: {len(recorded.next_steps)} item(s)")
    elif recorded.next_steps is not None:
        added = len(recorded.next_steps) - len(recorded.next_steps_skipped)
        lines.append(f"  next steps added: {added} item(s)")
        for step in recorded.next_steps_skipped:
            lines.append(f"  next step already there, not added again: {step}")
    for chart in recorded.plots:
        lines.append(f"  chart: {chart}")
    if recorded.commit:
        lines.append(f"  commit {recorded.commit[:10]}")
    elif not no_commit:
        lines.append("  nothing to commit")
    return Output(recorded, 0, "\n".join(lines))
