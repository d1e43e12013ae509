"""The notes document: hand-written prose plus a few sections that `runbook record` owns.

Owned parts, each created on first use and found again by its marker or heading:

- the status block `<!-- runbook:notes-status -->` ... `<!-- /runbook:notes-status -->`
  (current phase, last verdicts, headline metrics against the goal);
- `## Milestones`: dated `### ` entries, newest last; the tool only appends; an entry's body cannot
  open a section of its own (its headings of levels 1-3 move down three levels, status markers are
  neutralised, an open fence is closed: `contain_body`);
- `## Lessons learned`: bullets; a lesson already there (same normalised text) is not added again;
- `## Next steps`: bullets; new ones are added after those there (one already there is not added
  again), or replace them all when asked (`record --replace-next`).

Every byte outside the owned parts stays as written (CRLF documents stay CRLF). All functions
here are pure: text in, text out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from runbook.formatting import format_value
from runbook.model import Metrics
from runbook.plan.mdtext import (
    NEWLINE_RE,
    Fences,
    Line,
    detect_newline,
    ends_with_newline,
    lines,
    with_newlines,
)
from runbook.report.templates import render

STATUS_BLOCK = "notes-status"
MILESTONES = "Milestones"
LESSONS = "Lessons learned"
NEXT_STEPS = "Next steps"
# Canonical order of the owned parts, used when a missing one has to be created.
_ORDER = (STATUS_BLOCK, MILESTONES, LESSONS, NEXT_STEPS)

_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_BLANK_LINE = re.compile(r"[ \t]*(?:\r\n|\r|\n)")
_BULLET = re.compile(r"^ {0,3}(?:[-*+]|\d{1,9}[.)])[ \t]+(.*)$")
_OPEN = f"<!-- runbook:{STATUS_BLOCK} -->"
_CLOSE = f"<!-- /runbook:{STATUS_BLOCK} -->"


class Milestone(BaseModel):
    """One milestone entry as `runbook record` writes it."""

    title: str
    when: str  # "2026-11-29 14:30 UTC"
    body: str = ""
    metrics: Metrics = {}
    run_id: str | None = None
    phase: str | None = None  # phase id
    phase_label: str | None = None
    verdict: str | None = None
    commit: str | None = None


class MilestoneEntry(BaseModel):
    """A milestone read back from a notes document (any hand-written `###` entry counts)."""

    heading: str
    text: str  # the entry's source, heading included, trailing blank lines stripped


class RecordOutcome(BaseModel):
    lessons_added: list[str] = []
    lessons_skipped: list[str] = []  # already in "Lessons learned"
    next_steps_replaced: bool = False
    next_steps_added: list[str] = []
    next_steps_skipped: list[str] = []  # already in "Next steps"
    created: list[str] = []  # owned parts created by this edit


@dataclass(frozen=True)
class Section:
    """An owned level-2 section: heading line start, body start, end (next heading or EOF)."""

    name: str
    start: int
    body_start: int
    end: int


# ---- small text helpers -------------------------------------------------------------------------


def normalise_lesson(text: str) -> str:
    """Comparison key for lessons: case, whitespace, Markdown emphasis and final stops ignored."""
    key = re.sub(r"[`*_]", "", text).casefold()
    key = re.sub(r"\s+", " ", key).strip()
    return key.rstrip(" .;:!")


def _structure(text: str) -> tuple[list[tuple[Line, int, str]], tuple[int, int] | None]:
    """Headings outside fenced code and the status block: ([(line, level, title)], block span)."""
    headings: list[tuple[Line, int, str]] = []
    block: tuple[int, int] | None = None
    fences = Fences()
    block_start: int | None = None
    for line in lines(text):
        stripped = line.content.strip()
        if block_start is not None:
            if stripped == _CLOSE:
                block = (block_start, line.end)
                block_start = None
            continue
        if fences.step(line.content):
            continue
        if stripped == _OPEN and block is None:
            block_start = line.start
            continue
        heading = _HEADING.match(line.content)
        if heading:
            headings.append((line, len(heading.group(1)), (heading.group(2) or "").strip()))
    if block_start is not None:  # unclosed marker: see problems(); read the rest as ordinary text
        return _structure(text[:block_start] + " " * (len(_OPEN)) + text[block_start + len(_OPEN) :])
    return headings, block


def problems(text: str) -> list[tuple[int, str]]:
    """(line, message) for what stops `runbook record` from editing the document safely."""
    found: list[tuple[int, str]] = []
    opens = [i for i, line in enumerate(lines(text), 1) if line.content.strip() == _OPEN]
    closes = [i for i, line in enumerate(lines(text), 1) if line.content.strip() == _CLOSE]
    if len(opens) > 1:
        found.append((opens[1], f"a second {_OPEN}; keep one status block and delete the other"))
    if opens and (not closes or closes[0] < opens[0]):
        found.append((opens[0], f"{_OPEN} is never closed; add {_CLOSE} after it or delete the marker"))
    return found


def find_sections(text: str) -> dict[str, Section]:
    """The owned `##` sections present in `text` (first occurrence of each name)."""
    headings, _ = _structure(text)
    wanted = {name.casefold(): name for name in (MILESTONES, LESSONS, NEXT_STEPS)}
    sections: dict[str, Section] = {}
    for index, (line, level, title) in enumerate(headings):
        name = wanted.get(title.casefold())
        if level != 2 or name is None or name in sections:
            continue
        end = len(text)
        for later, later_level, _title in headings[index + 1 :]:
            if later_level <= 2:
                end = later.start
                break
        sections[name] = Section(name, line.start, line.end, end)
    return sections


def find_status_block(text: str) -> tuple[int, int] | None:
    """(start, end) of the status block, markers and the closing marker's newline included."""
    return _structure(text)[1]


def _content_end(text: str, start: int, end: int) -> int:
    """Offset just after the last non-blank line in text[start:end] (start if all blank)."""
    last = start
    for line in lines(text[start:end]):
        if line.content.strip():
            last = start + line.end
    return last


def _insert(text: str, pos: int, block: str, newline: str) -> str:
    """Insert `block` (ending in a newline) at line start `pos`, with a blank line on each side."""
    before, after = text[:pos], text[pos:]
    prefix = ""
    if before and not ends_with_newline(before):
        prefix = newline + newline
    elif before.strip() and not _ends_with_blank_line(before):
        prefix = newline
    suffix = "" if not after or _opens_with_blank_line(after) else newline
    return before + prefix + block + suffix + after


def _opens_with_blank_line(text: str) -> bool:
    """Whether the first line of `text` is blank and ends in a newline."""
    return _BLANK_LINE.match(text) is not None


def _ends_with_blank_line(text: str) -> bool:
    """Whether the last complete line of `text` (which ends in a newline) is blank."""
    body = re.sub(r"(?:\r\n|\r|\n)$", "", text, count=1)
    last = NEWLINE_RE.split(body)[-1]
    return not last.strip() and body != ""


def _anchor(text: str, part: str) -> int:
    """Where a missing owned part goes: after the previous owned part, before the next, or at EOF."""
    sections = find_sections(text)
    block = find_status_block(text)
    spans: dict[str, tuple[int, int]] = {name: (s.start, s.end) for name, s in sections.items()}
    if block:
        spans[STATUS_BLOCK] = block
    index = _ORDER.index(part)
    for earlier in reversed(_ORDER[:index]):
        if earlier in spans:
            start, end = spans[earlier]
            return _content_end(text, start, end) if earlier != STATUS_BLOCK else end
    for later in _ORDER[index + 1 :]:
        if later in spans:
            return spans[later][0]
    return len(text)


def _ensure_section(text: str, name: str, created: list[str]) -> tuple[str, Section]:
    sections = find_sections(text)
    if name not in sections:
        newline = detect_newline(text)
        text = _insert(text, _anchor(text, name), f"## {name}{newline}", newline)
        created.append(name)
        sections = find_sections(text)
    return text, sections[name]


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


# ---- reading ------------------------------------------------------------------------------------


def _bullets(body: str) -> list[str]:
    items: list[str] = []
    fences = Fences()
    for line in lines(body):
        if fences.step(line.content):
            continue
        bullet = _BULLET.match(line.content)
        if bullet:
            items.append(bullet.group(1).strip())
        elif items and line.content.strip() and line.content[:1] in (" ", "\t"):
            items[-1] = f"{items[-1]} {line.content.strip()}"
    return items


def read_lessons(text: str) -> list[str]:
    section = find_sections(text).get(LESSONS)
    return _bullets(text[section.body_start : section.end]) if section else []


def read_next_steps(text: str) -> list[str]:
    """Next steps as bullets; a section of plain prose comes back as one item."""
    section = find_sections(text).get(NEXT_STEPS)
    if not section:
        return []
    body = text[section.body_start : section.end]
    items = _bullets(body)
    if not items and body.strip():
        return [body.strip()]
    return items


def read_milestones(text: str) -> list[MilestoneEntry]:
    """The `###` entries of "Milestones", oldest first (text before the first entry is ignored)."""
    section = find_sections(text).get(MILESTONES)
    if not section:
        return []
    body_start, end = section.body_start, section.end
    headings = [h for h in _structure(text)[0] if body_start <= h[0].start < end and h[1] >= 3]
    entries: list[MilestoneEntry] = []
    tops = [h for h in headings if h[1] == 3]
    for index, (line, _level, title) in enumerate(tops):
        stop = tops[index + 1][0].start if index + 1 < len(tops) else end
        source = text[line.start : _content_end(text, line.start, stop)]
        entries.append(MilestoneEntry(heading=title, text=with_newlines(source, "\n").rstrip()))
    return entries


def read_framing(text: str) -> str:
    """The hand-written prose before the first owned part, without the front matter and H1 title."""
    stops = [s.start for s in find_sections(text).values()]
    block = find_status_block(text)
    if block:
        stops.append(block[0])
    head = text[: min(stops)] if stops else text
    head = with_newlines(head, "\n")
    if head.startswith("---\n"):
        close = head.find("\n---\n", 4)
        if close != -1:
            head = head[close + 5 :]
    rows = head.lstrip("\n").split("\n")
    if rows and re.match(r"^ {0,3}# ", rows[0]):
        rows = rows[1:]
    return "\n".join(rows).strip()


def read_status(text: str) -> str:
    """The status block's inner text, "" when there is none."""
    block = find_status_block(text)
    if not block:
        return ""
    inner = text[block[0] : block[1]]
    inner = inner[inner.index(_OPEN) + len(_OPEN) :]
    return with_newlines(inner[: inner.rindex(_CLOSE)], "\n").strip()


# ---- editing ------------------------------------------------------------------------------------


def contain_body(body: str) -> str:
    """A milestone body that cannot take over the document around it ("\\n" newlines in and out).

    Outside fenced code, headings of levels 1-3 move down three levels (`## Next steps` becomes
    `##### Next steps`: it stays a heading inside the entry, never an owned section or a new
    milestone), status-block markers are neutralised, and a fence left open is closed."""
    out: list[str] = []
    fences = Fences()
    for line in body.split("\n"):
        if fences.step(line):
            out.append(line)
            continue
        heading = _HEADING.match(line)
        if heading and len(heading.group(1)) <= 3:
            hashes = heading.group(1)
            at = line.index(hashes)
            line = line[:at] + "#" * (len(hashes) + 3) + line[at + len(hashes):]
        elif line.strip() in (_OPEN, _CLOSE):
            line = line.replace("<!--", "&lt;!--")
        out.append(line)
    if fences.open is not None:
        out.append(fences.open)
    return "\n".join(out)


def render_milestone(milestone: Milestone) -> str:
    """The entry's Markdown with "\\n" newlines, ending in one newline."""
    body = contain_body(with_newlines(milestone.body, "\n").strip("\n"))
    metrics = [f"{name} {format_value(value)}" for name, value in milestone.metrics.items()]
    run_parts: list[str] = []
    if milestone.run_id:
        run_parts.append(f"Run `{milestone.run_id}`")
        if milestone.phase_label:
            run_parts.append(f"Phase {milestone.phase_label} (`{milestone.phase}`)")
        elif milestone.phase:
            run_parts.append(f"`{milestone.phase}`")
        if milestone.verdict:
            run_parts.append(milestone.verdict)
        if milestone.commit:
            run_parts.append(f"commit `{milestone.commit[:10]}`")
    rendered = render(
        "milestone.md.j2",
        m=milestone,
        title=_one_line(milestone.title),
        run_line=" · ".join(run_parts),
        body=body,
        metrics=metrics,
    )
    return rendered.rstrip("\n") + "\n"


def append_milestone(text: str, milestone: Milestone, created: list[str] | None = None) -> str:
    created = created if created is not None else []
    text, section = _ensure_section(text, MILESTONES, created)
    newline = detect_newline(text)
    entry = with_newlines(render_milestone(milestone), newline)
    return _insert(text, _content_end(text, section.body_start, section.end), entry, newline)


def add_lessons(text: str, lessons: list[str], created: list[str] | None = None) -> tuple[str, list[str], list[str]]:
    """Append new lessons as bullets; returns (text, added, skipped as already present)."""
    created = created if created is not None else []
    seen = {normalise_lesson(item) for item in read_lessons(text)}
    added: list[str] = []
    skipped: list[str] = []
    for lesson in lessons:
        lesson = _one_line(lesson)
        key = normalise_lesson(lesson)
        if not key:
            continue
        if key in seen:
            skipped.append(lesson)
            continue
        seen.add(key)
        added.append(lesson)
    if not added:
        return text, added, skipped
    text, section = _ensure_section(text, LESSONS, created)
    newline = detect_newline(text)
    bullets = "".join(f"- {lesson}{newline}" for lesson in added)
    pos = _content_end(text, section.body_start, section.end)
    if pos == section.body_start:
        return _insert(text, pos, bullets, newline), added, skipped
    if not ends_with_newline(text[:pos]):
        bullets = newline + bullets
    return text[:pos] + bullets + text[pos:], added, skipped


def replace_next_steps(text: str, steps: list[str], created: list[str] | None = None) -> str:
    """Replace the body of "Next steps" with `steps` as bullets (blank lines after it are kept)."""
    created = created if created is not None else []
    text, section = _ensure_section(text, NEXT_STEPS, created)
    newline = detect_newline(text)
    bullets = "".join(f"- {_one_line(step)}{newline}" for step in steps if step.strip())
    pos = _content_end(text, section.body_start, section.end)
    head = text[: section.body_start]
    if not ends_with_newline(head):
        head += newline
    rest = text[pos:]
    middle = newline + bullets
    if rest and not _opens_with_blank_line(rest):
        middle += newline
    return head + middle + rest


def add_next_steps(text: str, steps: list[str], created: list[str] | None = None) -> tuple[str, list[str], list[str]]:
    """Append `steps` as bullets after the items "Next steps" holds (a step already there, by the
    lessons' normalised text, is not added again); returns (text, added, skipped)."""
    created = created if created is not None else []
    seen = {normalise_lesson(item) for item in read_next_steps(text)}
    added: list[str] = []
    skipped: list[str] = []
    for step in steps:
        step = _one_line(step)
        key = normalise_lesson(step)
        if not key:
            continue
        (skipped if key in seen else added).append(step)
        seen.add(key)
    if not added:
        return text, added, skipped
    text, section = _ensure_section(text, NEXT_STEPS, created)
    newline = detect_newline(text)
    bullets = "".join(f"- {step}{newline}" for step in added)
    pos = _content_end(text, section.body_start, section.end)
    if pos == section.body_start:
        return _insert(text, pos, bullets, newline), added, skipped
    if not ends_with_newline(text[:pos]):
        bullets = newline + bullets
    elif not _bullets(text[section.body_start : pos]):
        bullets = newline + bullets  # after prose, a list starts after a blank line
    return text[:pos] + bullets + text[pos:], added, skipped


def set_status(text: str, inner: str, created: list[str] | None = None) -> str:
    """Replace (or create) the status block with `inner` (Markdown, any newlines)."""
    created = created if created is not None else []
    newline = detect_newline(text)
    body = with_newlines(inner.strip("\r\n"), newline)
    block = find_status_block(text)
    if block:
        start, end = block
        old = text[start:end]
        indent = old[: old.index(_OPEN)]
        tail = newline if ends_with_newline(old) else ""
        return text[:start] + f"{indent}{_OPEN}{newline}{body}{newline}{_CLOSE}{tail}" + text[end:]
    created.append(STATUS_BLOCK)
    rendered = f"{_OPEN}{newline}{body}{newline}{_CLOSE}{newline}"
    return _insert(text, _anchor(text, STATUS_BLOCK), rendered, newline)


def apply_record(
    text: str,
    milestone: Milestone,
    lessons: Sequence[str] = (),
    next_steps: list[str] | None = None,
    status: str | None = None,
    replace_next: bool = False,
) -> tuple[str, RecordOutcome]:
    """Everything `runbook record` changes in one pure step. `next_steps` are added to "Next steps"
    (`replace_next`: they replace what is there)."""
    created: list[str] = []
    if status is not None:
        text = set_status(text, status, created)
    text = append_milestone(text, milestone, created)
    text, added, skipped = add_lessons(text, list(lessons), created)
    steps_added: list[str] = []
    steps_skipped: list[str] = []
    if next_steps and replace_next:
        text = replace_next_steps(text, next_steps, created)
    elif next_steps:
        text, steps_added, steps_skipped = add_next_steps(text, next_steps, created)
    outcome = RecordOutcome(
        lessons_added=added,
        lessons_skipped=skipped,
        next_steps_replaced=bool(next_steps) and replace_next,
        next_steps_added=steps_added,
        next_steps_skipped=steps_skipped,
        created=created,
    )
    return text, outcome


def new_notes(title: str, plan_path: str, framing: str = "") -> str:
    """A fresh notes document (from templates/notes.md.j2), "\\n" newlines."""
    return render("notes.md.j2", title=title, plan_path=plan_path, framing=framing.strip())
