"""Markdown plan -> `Plan` (pure), plus the checks `runbook validate` reports.

One markdown-it-py block parse of the whole file (CommonMark block rules plus the front matter
plugin; no inline pass) gives the structure: front matter, headings, top-level paragraphs, lists
and fenced code, each with its line range. Everything else is done here in a single walk over
those tokens and over our own line table of the *original* text, so every span is an offset into
the text exactly as it was read (BOM and `\\r\\n` included) and
`front matter + preamble + phase spans == text` holds for every plan.

The format is specified in docs/plan-format.md.
"""

from __future__ import annotations

import gc
import os
import re
from dataclasses import dataclass, field
from typing import Any

from runbook.files import NotReadable, read_bounded
from runbook.model import (
    FORMAT_VERSION,
    VERDICTS,
    Block,
    Criterion,
    Phase,
    PhaseStatus,
    Plan,
    Problem,
    Span,
    Step,
)
from runbook.plan import criteria, markers, resolve
from runbook.plan.mdtext import LineTable, count_newlines, to_lf

__all__ = [
    "PLAN_MAX_BYTES",
    "PlanError",
    "is_plan_text",
    "load_plan",
    "parse_duration",
    "parse_plan",
    "parse_status_line",
    "read_plan",
    "read_text",
    "reassemble",
]


class PlanError(Exception):
    """A plan that cannot be used; `problems` lists every error (and warning) found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        errors = [p for p in problems if p.severity == "error"] or problems
        super().__init__("\n".join(str(p) for p in errors))


# ---- I/O edges -----------------------------------------------------------------------------


def read_plan(path: str | os.PathLike[str]) -> tuple[Plan | None, list[Problem]]:
    """Read and parse a plan file. Undecodable or unreadable files come back as problems."""
    name = os.fspath(path)
    text, problem = read_text(name)
    if problem is not None:
        return None, [problem]
    return parse_plan(text, name)


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read and parse a plan; raise `PlanError` if it is not a plan or has any error."""
    plan, problems = read_plan(path)
    if plan is None or any(p.severity == "error" for p in problems):
        raise PlanError(problems)
    return plan


PLAN_MAX_BYTES = 32 * 1024 * 1024


def read_text(path: str, max_bytes: int = PLAN_MAX_BYTES) -> tuple[str, Problem | None]:
    """Decode a file as UTF-8 without newline translation; a failure becomes a Problem.

    Only a regular file of at most `max_bytes` is read: a FIFO, a device (`/dev/zero`) or a
    runaway file is a Problem, never a hang or an unbounded read."""
    try:
        data = read_bounded(path, max_bytes)
    except OSError as exc:
        return "", Problem(file=path, line=1, col=1, message=f"cannot read the file: {exc.strerror or exc}")
    except NotReadable as exc:
        return "", Problem(file=path, line=1, col=1, message=f"cannot read the plan: {exc}; give the path of a text file")
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        return "", Problem(
            file=path,
            line=line,
            col=col,
            message=f"not UTF-8 text (byte 0x{data[exc.start]:02x}); save the plan as UTF-8",
        )


# ---- markdown-it, configured once ----------------------------------------------------------

_MD: Any = None


def _markdown() -> Any:
    global _MD
    if _MD is None:
        from markdown_it import MarkdownIt
        from mdit_py_plugins.front_matter import front_matter_plugin

        md = MarkdownIt("commonmark").use(front_matter_plugin)
        # Block structure is all we need; code spans in steps are scanned by _code_spans.
        md.disable(["inline", "text_join"], ignoreInvalid=True)
        _MD = md
    return _MD


def _yaml_load(text: str) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader


# ---- regular expressions of the format -----------------------------------------------------

_EXPLICIT_ID_RE = re.compile(r"\s*\{#(?P<id>[^{}]*)\}\s*$")
_ID_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_ESTIMATE_RE = re.compile(r"\s*\((?P<est>~[^()]*)\)\s*$")
_PHASE_RE = re.compile(r"Phase\s+(?P<label>[A-Za-z0-9][A-Za-z0-9._-]*?)\s*(?::\s*(?P<title>.*))?$", re.IGNORECASE)
_PHASE_START_RE = re.compile(r"Phase\s+\d", re.IGNORECASE)
_ATX_OPEN_RE = re.compile(r"^[ ]{0,3}##[ \t]*")
_ATX_CLOSE_RE = re.compile(r"[ \t]+#+[ \t]*$")
_FIELD_RE = re.compile(
    r"(?:^|(?<=\r))(?P<indent>[ \t]*)(?P<key>steps|pass|on[ \t]+pass|on[ \t]+fail|needs|timeout|executor|resources|columns|outputs|inputs|sweep|pick)[ \t]*:(?P<value>[^\r\n]*)",
    re.IGNORECASE | re.MULTILINE,
)
_TASK_RE = re.compile(r"^[ \t]*(?:[-*+]|\d{1,9}[.)])[ \t]+\[(?P<mark>[ xX])\](?=[ \t]|$)")
_TASK_PREFIX_RE = re.compile(r"^\[[ xX]\][ \t]*")
_BACKTICKS_RE = re.compile(r"`+")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)[ \t]*([a-z]+)")
_STATUS_RE = re.compile(r"^\s*\*\*Status:?\*\*:?\s*(?P<rest>.*?)\s*$", re.MULTILINE)
_WHEN_RE = re.compile(r"^\d{4}-\d{2}-\d{2}")
_VAR_KEY_RE = re.compile(r"^" + resolve.VAR_NAME_RE.pattern + r"$")

_FIELD_KEYS = {
    "steps": "steps",
    "pass": "pass",
    "on pass": "on_pass",
    "on fail": "on_fail",
    "needs": "needs",
    "timeout": "timeout",
    "executor": "executor",
    "resources": "resources",
    "columns": "columns",
    "outputs": "outputs",
    "inputs": "inputs",
    "sweep": "sweep",
    "pick": "pick",
}
_FIELD_NAMES = {"steps": "Steps:", "pass": "Pass:", "on_pass": "On pass:", "on_fail": "On fail:", "needs": "Needs:", "timeout": "Timeout:",
                "executor": "Executor:", "resources": "Resources:", "columns": "Columns:",
                "outputs": "Outputs:", "inputs": "Inputs:", "sweep": "Sweep:", "pick": "Pick:"}
_EXECUTORS = ("local", "slurm")
_COLUMN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[.-][A-Za-z0-9_]+)*")
_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}  # fmt: skip
_KNOWN_FRONT_MATTER = {"runbook", "title", "notes", "vars"}


def parse_duration(text: str) -> float | None:
    """`90s`, `45m`, `2h`, `1h30m`, `1.5h` -> seconds; None when it is not a duration."""
    cleaned = text.strip().lower()
    if not cleaned:
        return None
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(cleaned):
        if cleaned[pos : m.start()].strip() or m.group(2) not in _UNITS:
            return None
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0 or cleaned[pos:].strip():
        return None
    return total


def is_plan_text(head: str) -> bool:
    """Cheap check used by discovery: does this text start with front matter holding `runbook:`?"""
    text = head[1:] if head.startswith("\ufeff") else head
    lines = text.splitlines()
    if not lines or not re.fullmatch(r"-{3,}[ \t]*", lines[0]):
        return False
    for line in lines[1:]:
        if re.fullmatch(r"(-{3,}|\.\.\.)[ \t]*", line):
            return False
        if re.match(r"runbook[ \t]*:", line):
            return True
    return False


def parse_status_line(inner: str) -> PhaseStatus | None:
    """`**Status:** pass · 2026-11-29 14:30 UTC · run 20261129-143012-7f3a · accept_len 2.41 >= 1.5`,
    or `**Status:** stale (was pass) · ...` for a verdict runbook found stale."""
    m = _STATUS_RE.search(inner)
    if m is None:
        return None
    parts = [p.strip() for p in m.group("rest").split("·")]
    verdict = parts[0].lower() if parts else ""
    stale = re.fullmatch(r"stale \(was (\w+)\)", verdict)  # `stale (was pass)`: writeback.status_line
    if stale:
        verdict = stale.group(1)
    if verdict not in VERDICTS:
        return None
    run_id = when = None
    rest: list[str] = []
    for part in parts[1:]:
        if run_id is None and part.lower().startswith("run "):
            run_id = part[4:].strip()
        elif when is None and _WHEN_RE.match(part):
            when = part
        elif part:
            rest.append(part)
    return PhaseStatus(verdict=verdict, run_id=run_id, when=when, summary=" · ".join(rest) or None,
                       stale=stale is not None)


def reassemble(plan: Plan) -> str:
    """Front matter + preamble + every phase span, concatenated: equals `plan.text` for a sound parse."""
    text = plan.text
    fm = plan.front_matter_span
    first = plan.phases[0].span.start if plan.phases else len(text)
    parts = [text[fm.start : fm.end], text[fm.end : first]]
    parts.extend(text[p.span.start : p.span.end] for p in plan.phases)
    return "".join(parts)


# ---- the parser ----------------------------------------------------------------------------


class _Lines(LineTable):
    """The line table (mdtext.LineTable) with the plan model's spans."""

    def span(self, first: int, stop: int) -> Span:
        """Span of 0-based lines [first, stop)."""
        # validated: for four ints pydantic's constructor is faster than model_construct
        return Span(start_line=first + 1, end_line=max(stop, first + 1), start=self.start(first), end=self.start(stop))


@dataclass
class _Top:
    """A top-level block of the document (level-0 token)."""

    kind: str  # heading, para, list, other
    first: int  # 0-based first line
    stop: int  # 0-based line after the last
    tok: int  # token index of the opener
    close: int = -1  # token index of the closer (lists)
    tag: str = ""
    markup: str = ""
    content: str = ""


@dataclass
class _PhaseDraft:
    heading_line: int
    stop: int  # 0-based line of the next phase heading (or len(lines))
    body_stop: int  # the next level-1/2 heading, whichever comes first
    tops: list[_Top] = field(default_factory=list)


def _top_blocks(tokens: list[Any]) -> list[_Top]:
    tops: list[_Top] = []
    i, n = 0, len(tokens)
    while i < n:
        tok = tokens[i]
        if tok.level != 0 or tok.map is None:
            i += 1
            continue
        kind = tok.type
        first, stop = tok.map
        if kind == "heading_open":
            content = tokens[i + 1].content if i + 1 < n else ""
            tops.append(_Top("heading", first, stop, i, tag=tok.tag, markup=tok.markup, content=content))
            i += 3
            continue
        if kind == "paragraph_open":
            tops.append(_Top("para", first, stop, i, content=tokens[i + 1].content))
            i += 3
            continue
        if kind in ("bullet_list_open", "ordered_list_open"):
            close_type = kind.replace("_open", "_close")
            j = i + 1
            while j < n and not (tokens[j].type == close_type and tokens[j].level == 0):
                j += 1
            tops.append(_Top("list", first, stop, i, close=j))
            i = j + 1
            continue
        if kind.endswith("_open"):
            # blockquote and the like: skip to the matching close
            close_type = kind.replace("_open", "_close")
            j = i + 1
            while j < n and not (tokens[j].type == close_type and tokens[j].level == 0):
                j += 1
            tops.append(_Top("other", first, stop, i))
            i = j + 1
            continue
        tops.append(_Top(kind, first, stop, i))
        i += 1
    return tops


def parse_plan(text: str, path: str) -> tuple[Plan | None, list[Problem]]:
    """Parse a plan and check it. Returns (Plan or None when it is not a usable plan, problems).

    Problems are sorted by line; warnings have severity "warning". The plan is returned even when
    it has errors (callers that need a sound plan use `load_plan`).

    The cyclic garbage collector is paused while it runs: a parse allocates millions of short-lived,
    acyclic objects (tokens, models), and the collector's full passes over the growing tree made
    parsing superlinear (8,000 phases 2.5 s, 20,000 phases 7.8 s of CPU; with it paused 1.5 s and
    4.9 s, linear: ~0.2 ms a phase). Nothing cyclic is left behind for it to miss.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        return _Parser(text, path).run()
    finally:
        if paused:
            gc.enable()


class _Parser:
    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path
        self.lines = _Lines.of(text)
        self.problems: list[Problem] = []
        self.tokens: list[Any] = []

    # -- helpers --
    def error(self, line0: int, col: int, message: str) -> None:
        self.problems.append(Problem(file=self.path, line=line0 + 1, col=col, message=message))

    def warn(self, line0: int, col: int, message: str) -> None:
        self.problems.append(Problem(file=self.path, line=line0 + 1, col=col, message=message, severity="warning"))

    def done(self, plan: Plan | None) -> tuple[Plan | None, list[Problem]]:
        self.problems.sort(key=lambda p: (p.line, p.col))
        return plan, self.problems

    # -- the parse --
    def run(self) -> tuple[Plan | None, list[Problem]]:
        text = self.text
        src = text[1:] if text.startswith("\ufeff") else text
        tokens = _markdown().parse(src)
        if not tokens or tokens[0].type != "front_matter":
            first = self.lines.line(0).lstrip("\ufeff")
            if re.fullmatch(r"-{3,}[ \t]*", first):
                self.error(0, 1, "front matter opened here is never closed: add a line `---` after it")
            else:
                self.error(0, 1, "not a plan: no front matter with `runbook: 1`; start the file with `---`, `runbook: 1`, `---`")
            return self.done(None)
        fm_tok = tokens[0]
        fm_stop = fm_tok.map[1]
        meta = self.front_matter(fm_tok.content, fm_stop)
        if meta is None:
            return self.done(None)
        version, title, notes, vars_ = meta

        self.tokens = tokens[1:]
        tops = _top_blocks(self.tokens)
        drafts = self.find_phases(tops)
        if title is None:
            title = next((t.content.strip() for t in tops if t.kind == "heading" and t.tag == "h1"), None)
        if not drafts:
            self.error(max(fm_stop - 1, 0), 1, "plan has no phases: add a level-2 heading such as `## Phase 0: Quick probe (~5 min)`")
        phases = [self.phase(d) for d in drafts]
        plan = Plan(
            path=self.path,
            format_version=version,
            title=title,
            notes=notes,
            vars=vars_,
            front_matter_span=self.lines.span(0, fm_stop),
            phases=phases,
            text=text,
        )
        self.check_plan(plan)
        self.check_fences(len(self.lines))
        return self.done(plan)

    def front_matter(self, content: str, fm_stop: int) -> tuple[int, str | None, str | None, dict[str, str]] | None:
        import yaml

        try:
            data = _yaml_load(content) if content.strip() else {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line0 = (mark.line + 1) if mark is not None else 0
            col = (mark.column + 1) if mark is not None else 1
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            context, cmark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
            if context and cmark is not None:
                problem += f" ({context} at line {cmark.line + 2}, col {cmark.column + 1})"
            self.error(line0, col, f"front matter is not valid YAML: {problem}")
            return None
        if _expanded_size(data, _FRONT_MATTER_MAX_VALUES) > _FRONT_MATTER_MAX_VALUES:
            self.error(0, 1, f"front matter expands to more than {_FRONT_MATTER_MAX_VALUES:,} values (YAML aliases that repeat each other); write the values out")
            return None
        if not isinstance(data, dict) or "runbook" not in data:
            self.error(0, 1, "not a plan: the front matter has no `runbook: 1` key; add it to mark this file as a plan")
            return None
        key_lines = self.front_matter_key_lines(fm_stop)
        version = data["runbook"]
        if isinstance(version, bool) or not isinstance(version, int) or version != FORMAT_VERSION:
            self.error(
                key_lines.get("runbook", 1),
                1,
                f"unsupported plan format version {_short(version)}: this runbook reads `runbook: {FORMAT_VERSION}`",
            )
            return None
        for key in data:
            if key not in _KNOWN_FRONT_MATTER:
                self.warn(key_lines.get(str(key), 1), 1, f"unknown front matter key {_short(key)} is ignored (known: runbook, title, notes, vars)")
        title = self.scalar(data.get("title"), "title", key_lines)
        notes = self.scalar(data.get("notes"), "notes", key_lines)
        if notes is not None and (os.path.isabs(notes) or re.match(r"[A-Za-z]:[\\/]", notes)):
            self.error(key_lines.get("notes", 1), 1, f"`notes: {notes}` must be a path relative to the plan file, inside the repository (e.g. `notes: notes.md`)")
            notes = None
        vars_: dict[str, str] = {}
        raw = data.get("vars")
        if raw is not None and not isinstance(raw, dict):
            self.error(key_lines.get("vars", 1), 1, "`vars:` must be a mapping of names to values, e.g. `vars:` then `  target: work/target`")
        elif raw:
            for name, value in raw.items():
                if not isinstance(name, str) or not _VAR_KEY_RE.match(name):
                    self.error(key_lines.get("vars", 1), 1, f"var name {_short(name)} is not a valid name (letters, digits, _ and -)")
                elif value is None or isinstance(value, (dict, list)):
                    self.error(key_lines.get("vars", 1), 1, f"var {_short(name)} must have a plain value (a string or a number)")
                else:
                    vars_[name] = value if isinstance(value, str) else _yaml_scalar(value)
        return version, title, notes, vars_

    def front_matter_key_lines(self, fm_stop: int) -> dict[str, int]:
        found: dict[str, int] = {}
        for i in range(1, fm_stop):
            m = re.match(r"([A-Za-z_][\w-]*)[ \t]*:", self.lines.line(i))
            if m and m.group(1) not in found:
                found[m.group(1)] = i
        return found

    def scalar(self, value: Any, key: str, key_lines: dict[str, int]) -> str | None:
        if value is None:
            return None
        if isinstance(value, (dict, list)):
            self.error(key_lines.get(key, 1), 1, f"`{key}:` must be a single line of text")
            return None
        return value if isinstance(value, str) else _yaml_scalar(value)

    def find_phases(self, tops: list[_Top]) -> list[_PhaseDraft]:
        drafts: list[_PhaseDraft] = []
        for top in tops:
            if top.kind != "heading":
                continue
            content = top.content.strip()
            is_phase_like = _PHASE_START_RE.match(content) is not None or _is_phase_heading(content)
            if top.tag == "h2" and top.markup == "##":
                if _is_phase_heading(content) or _PHASE_START_RE.match(content):
                    drafts.append(_PhaseDraft(top.first, len(self.lines), len(self.lines)))
                    continue
            elif is_phase_like:
                if top.tag == "h2":
                    self.error(top.first, 1, "write phase headings as `## Phase N: title` (an ATX heading), not underlined with ---")
                else:
                    self.warn(top.first, 1, f"`{content}` is a level-{top.tag[1]} heading, so it is not a phase; phases are `## Phase N: title`")
            if top.tag in ("h1", "h2") and drafts and drafts[-1].body_stop == len(self.lines):
                drafts[-1].body_stop = top.first
        for a, b in zip(drafts, drafts[1:], strict=False):
            a.stop = b.heading_line
            a.body_stop = min(a.body_stop, b.heading_line)
        # hand each top-level block to its phase
        k = 0
        for top in tops:
            while k < len(drafts) and top.first >= drafts[k].stop:
                k += 1
            if k < len(drafts) and drafts[k].heading_line < top.first < drafts[k].body_stop:
                drafts[k].tops.append(top)
        return drafts

    def phase(self, d: _PhaseDraft) -> Phase:
        lines = self.lines
        heading = lines.line(d.heading_line)
        heading_text = _ATX_CLOSE_RE.sub("", _ATX_OPEN_RE.sub("", heading)).strip()
        label, title, estimate, explicit_id = self.heading_parts(heading_text, d.heading_line)
        phase_span = lines.span(d.heading_line, d.stop)
        blocks, block_problems = markers.find_blocks(
            self.text, phase_span.start, phase_span.end, file=self.path, first_line=d.heading_line + 1
        )
        self.problems.extend(block_problems)
        in_block = {i for b in blocks for i in range(b.span.start_line - 1, b.span.end_line)}  # 0-based lines

        fields: dict[str, tuple[int, int, str]] = {}  # key -> (line0, value col, value)
        steps_line: int | None = None
        first_field_line: int | None = None

        def record(i: int, m: re.Match[str], line_start: int) -> None:
            nonlocal steps_line, first_field_line
            key = m.group("key").lower()
            key = _FIELD_KEYS.get(key) or _FIELD_KEYS[" ".join(key.split())]
            value = m.group("value")
            col = m.start("value") - line_start + 1 + (len(value) - len(value.lstrip()))
            if first_field_line is None:
                first_field_line = i
            if key in fields:
                self.error(i, m.start("key") - line_start + 1, f"second `{_FIELD_NAMES[key]}` line in this phase (the first is at line {fields[key][0] + 1}); keep one")
                return
            fields[key] = (i, col, value.strip())
            if key == "steps":
                steps_line = i
                if value.strip():
                    self.warn(i, col, "text after `Steps:` is ignored; steps are the task-list items below it")

        for top in d.tops:
            if top.kind != "para" or top.first in in_block:
                continue
            # one regex pass over the paragraph's source; lines are counted only where a field is,
            # from the previous field on (a field starts a line, so no \r\n is split)
            i, counted = top.first, lines.start(top.first)
            for m in _FIELD_RE.finditer(self.text, counted, lines.start(top.stop)):
                line_start = m.start()
                i += count_newlines(self.text, counted, line_start)
                counted = line_start
                record(i, m, line_start)

        steps: list[Step] = []
        steps_list: _Top | None = None
        lists = [t for t in d.tops if t.kind == "list"]
        if steps_line is not None:
            steps_list = next((t for t in lists if t.first > steps_line), None)
            if steps_list is None:
                self.error(steps_line, 1, "`Steps:` is not followed by a task list; add items like `- [ ] Train: `eagle train ...``")
            else:
                lazy: set[int] = set()
                for line0, m in self.fields_in_items(steps_list):
                    if m.group("indent"):
                        name = _FIELD_NAMES[_FIELD_KEYS.get(m.group("key").lower()) or _FIELD_KEYS[" ".join(m.group("key").lower().split())]]
                        self.warn(line0, 1, f"`{name}` here is indented under a step, so it is part of that step's text and does nothing; move it after the list, unindented, after a blank line")
                    else:
                        # written right under the last step without a blank line: CommonMark makes
                        # it part of the item (a lazy continuation line); it is the phase's field
                        lazy.add(line0)
                        record(line0, m, 0)
                steps = self.steps(steps_list, lazy)
        else:
            for t in lists:
                if any(_TASK_RE.match(lines.line(tok.map[0])) for tok in self.item_tokens(t)):
                    self.warn(t.first, 1, "task list without a `Steps:` line above it: these items are not steps; add `Steps:` before the list")
                    break

        goal_stop = min(x for x in (steps_line, first_field_line, steps_list.first if steps_list else None, d.body_stop) if x is not None)
        goal_lines = [
            lines.line(i)
            for i in range(d.heading_line + 1, goal_stop)
            if i not in in_block
        ]
        goal = "\n".join(goal_lines).strip()

        criterion = None
        field_lines = {key: line0 + 1 for key, (line0, _, _) in fields.items()}
        if "pass" in fields:
            criterion = self.criterion(*fields["pass"])
        on_pass = _phase_ref(fields["on_pass"][2]) if "on_pass" in fields else None
        on_fail = _phase_ref(fields["on_fail"][2]) if "on_fail" in fields else None
        for key in ("on_pass", "on_fail"):
            if key in fields and not fields[key][2]:
                self.error(fields[key][0], fields[key][1], f"`{_FIELD_NAMES[key]}` is empty: name a phase (`Phase 2`) or `stop`")
        needs: list[str] = []
        if "needs" in fields:
            raw = fields["needs"][2]
            if raw.strip().lower() not in ("", "none", "-", "nothing"):
                needs = [_phase_ref(part) for part in raw.split(",") if part.strip()]
        timeout_s = None
        if "timeout" in fields:
            line0, col, value = fields["timeout"]
            timeout_s = parse_duration(value.strip("`"))
            if timeout_s is None or timeout_s <= 0:
                self.error(line0, col, f"bad Timeout {value!r}: write a duration such as `90s`, `45m`, `2h` or `1h30m`")
                timeout_s = None
        executor, resources_map = self.executor_fields(fields)

        columns = self.columns(*fields["columns"]) if "columns" in fields else []
        outputs = self.paths("outputs", *fields["outputs"]) if "outputs" in fields else []
        inputs = self.paths("inputs", *fields["inputs"]) if "inputs" in fields else []
        sweep, pick = self.sweep_fields(fields)

        status = None
        block_map: dict[str, Block] = {b.name: b for b in blocks}
        if "status" in block_map:
            status = parse_status_line(block_map["status"].inner)
            if status is None and block_map["status"].inner.strip():
                self.warn(
                    block_map["status"].span.start_line - 1,
                    1,
                    "status block not understood: expected `**Status:** <verdict> · <when> · run <id> · <summary>`",
                )

        return Phase(
            id=explicit_id or f"phase-{label}",
            label=label,
            explicit_id=explicit_id,
            title=title,
            heading=heading_text,
            estimate=estimate,
            goal=to_lf(goal),
            steps=steps,
            criterion=criterion,
            on_pass=on_pass,
            on_fail=on_fail,
            needs=needs,
            timeout_s=timeout_s,
            executor=executor,
            resources=resources_map,
            columns=columns,
            outputs=outputs,
            inputs=inputs,
            sweep=sweep,
            pick=pick,
            status=status,
            blocks=block_map,
            span=phase_span,
            heading_span=lines.span(d.heading_line, d.heading_line + 1),
            field_lines=field_lines,
        )

    def executor_fields(self, fields: dict[str, tuple[int, int, str]]) -> tuple[Any, dict[str, str]]:
        """`Executor:` (local or slurm) and `Resources:` (key=value words, runbook/plan/resources.py)."""
        from runbook.plan.resources import ResourcesError, parse_resources

        executor = None
        if "executor" in fields:
            line0, col, value = fields["executor"]
            word = value.strip("`").strip().lower()
            if word in _EXECUTORS:
                executor = word
            else:
                self.error(line0, col, f"unknown Executor {value!r}: write `Executor: local` or `Executor: slurm`")
        resources_map: dict[str, str] = {}
        if "resources" in fields:
            line0, col, value = fields["resources"]
            if not value.strip("` \t"):
                self.error(line0, col, "`Resources:` is empty: write e.g. `Resources: nodes=1 gpus-per-node=8 time=2:00:00`")
            else:
                try:
                    resources_map = parse_resources(value)
                except ResourcesError as exc:
                    self.error(line0, col + exc.col, f"bad Resources: {exc}")
                if executor != "slurm" and resources_map:
                    self.warn(line0, col, "`Resources:` is used only by `Executor: slurm`; this phase runs locally")
        return executor, resources_map

    def heading_parts(self, heading: str, line0: int) -> tuple[str, str, str | None, str | None]:
        rest = heading
        explicit_id = estimate = None
        m = _EXPLICIT_ID_RE.search(rest)
        if m:
            explicit_id = m.group("id").strip()
            rest = rest[: m.start()]
            if not _ID_RE.fullmatch(explicit_id):
                self.error(line0, 1, f"explicit id {{#{explicit_id}}} is not valid: use letters, digits, - and _, starting with a letter")
                explicit_id = None
        m = _ESTIMATE_RE.search(rest)
        if m:
            estimate = m.group("est").strip()
            rest = rest[: m.start()]
        m = _PHASE_RE.match(rest.strip())
        if m is None:
            self.error(line0, 1, f"phase heading {heading!r} does not read `## Phase <label>: <title> (~estimate)`")
            label = rest.strip().split()[1] if len(rest.split()) > 1 else "?"
            return label.rstrip(":."), "", estimate, explicit_id
        return m.group("label"), (m.group("title") or "").strip(), estimate, explicit_id

    def item_tokens(self, top: _Top) -> list[Any]:
        return [tok for tok in self.tokens_between(top.tok, top.close) if tok.type == "list_item_open" and tok.level == 1]

    def tokens_between(self, a: int, b: int) -> list[Any]:
        return self.tokens[a + 1 : b + 1]

    def fields_in_items(self, top: _Top) -> list[tuple[int, re.Match[str]]]:
        """Field lines (`Pass:` ...) inside the paragraphs of a list's items, after their first line."""
        found: list[tuple[int, re.Match[str]]] = []
        for tok in self.tokens_between(top.tok, top.close):
            if tok.type == "paragraph_open" and tok.map is not None:
                for line0 in range(tok.map[0] + 1, tok.map[1]):
                    m = _FIELD_RE.match(self.lines.line(line0))
                    if m is not None:
                        found.append((line0, m))
        return found

    def steps(self, top: _Top, drop: set[int] | frozenset[int] = frozenset()) -> list[Step]:
        """The task items of the Steps: list; `drop`: lines (0-based) that are not the items' text."""
        lines = self.lines
        toks = self.tokens_between(top.tok, top.close)
        steps: list[Step] = []
        items: list[tuple[int, int]] = [(k, tok.level) for k, tok in enumerate(toks) if tok.type == "list_item_open" and tok.level == 1]
        for n, (k, _level) in enumerate(items):
            end_k = items[n + 1][0] if n + 1 < len(items) else len(toks)
            item = toks[k]
            first, stop = item.map
            while stop - 1 > first and not lines.line(stop - 1).strip():
                stop -= 1
            head = lines.line(first)
            m = _TASK_RE.match(head)
            if m is None:
                self.warn(first, 1, "list item under `Steps:` is not a task (`- [ ] ...`), so it will not run; make it `- [ ] ...` or move it out of the list")
                continue
            para = None
            fences = []
            for t in toks[k + 1 : end_k]:
                if t.type == "inline":
                    if para is None and t.level == 3:
                        para = t
                elif t.type == "fence" and t.level == 2:
                    fences.append(t)
            content = para.content if para is not None else ""
            if drop and para is not None and para.map is not None:
                kept = [t for k, t in enumerate(content.split("\n")) if para.map[0] + k not in drop]
                content = "\n".join(kept)
            item_text = _TASK_PREFIX_RE.sub("", content)
            spans = [] if fences else _code_spans(item_text)  # a fenced block is the command
            step_id = f"step-{len(steps) + 1}"
            command = ""
            if len(fences) > 1:
                self.error(fences[1].map[0], 1, f"{step_id} has {len(fences)} fenced blocks: put its script in one block")
            if fences:
                command = fences[0].content.rstrip("\n")
                if not command.strip():
                    self.error(fences[0].map[0], 1, f"{step_id}: its fenced block is empty; write the command in it")
            elif len(spans) > 1:
                shown = ", ".join(f"`{s}`" for s in spans)
                self.error(first, m.end() + 1, f"{step_id} has {len(spans)} inline code spans ({shown}): the command must be the only one; put it in a fenced block under the item if the text needs code too")
            elif spans:
                command = spans[0]
                if not command.strip():
                    self.error(first, m.end() + 1, f"{step_id}: its command is empty")
            else:
                self.error(first, m.end() + 1, f"{step_id} has no command: write it in backticks (`- [ ] Train: `eagle train ...``) or in a fenced block under the item")
            nul = self.text.find("\0", lines.start(first), lines.start(stop))
            if nul >= 0:
                line0 = first + count_newlines(self.text, lines.start(first), nul)
                self.error(line0, nul - lines.start(line0) + 1, f"{step_id} holds a NUL byte, which no shell command can carry (it would be run as U+FFFD); delete it")
            steps.append(
                Step(
                    id=step_id,
                    text=to_lf(item_text.strip()),
                    command=command,
                    done=m.group("mark") != " ",
                    span=lines.span(first, stop),
                    checkbox=lines.start(first) + m.start("mark"),
                )
            )
        return steps

    def paths(self, key: str, line0: int, col: int, value: str) -> list[str]:
        """`Outputs: work/mlp.pt, work/model/` -> repo-relative paths, comma-separated (backticks
        around the list or a path are fine; `{var}` is resolved when a run starts)."""
        from runbook.plan.outputs import check_path

        name = _FIELD_NAMES[key]
        paths: list[str] = []
        if not value.strip("` \t"):
            self.error(line0, col, f"`{name}` is empty: name files or folders, e.g. `{name} work/model.pt`")
            return paths
        at = col
        for part in value.split(","):
            where = at + len(part) - len(part.lstrip())
            at += len(part) + 1
            path = part.strip().strip("`").strip()
            problem = check_path(path)
            if problem:
                self.error(line0, where, f"`{name}` {problem}: give paths relative to the repository root, "
                                         "separated by commas")
            elif path.rstrip("/") in paths:
                self.warn(line0, where, f"`{name}` names {path!r} twice")
            else:
                paths.append(path.rstrip("/") or path)
        return paths

    def sweep_fields(self, fields: dict[str, tuple[int, int, str]]) -> tuple[list[str], str | None]:
        """`Sweep: n=100,200; lr=0.1,0.3` -> its axes as `--set` items, and `Pick: best:acc`; each
        needs the other. Their names, values and direction are checked against the plan in
        `check_sweep`, once its vars are known."""
        from runbook.plan.grid import split_axes

        axes: list[str] = []
        pick = None
        if "sweep" in fields:
            line0, col, value = fields["sweep"]
            axes = split_axes(value)
            if not axes:
                self.error(line0, col, "`Sweep:` is empty: write the grid as `Sweep: NAME=V1,V2` "
                                       "(axes separated by `;`), e.g. `Sweep: lr=0.01,0.1; hidden=8,64`")
        if "pick" in fields:
            line0, col, value = fields["pick"]
            pick = value.strip("` \t") or None
            if pick is None:
                self.error(line0, col, "`Pick:` is empty: write `Pick: best:METRIC` (or max:METRIC / min:METRIC)")
            elif "sweep" not in fields:
                self.error(line0, col, "`Pick:` without `Sweep:`: it chooses among a sweep's trials; add "
                                       "`Sweep: NAME=V1,V2` or drop it")
        if axes and "pick" not in fields:
            self.error(fields["sweep"][0], 1, "`Sweep:` needs `Pick:`, the trial that decides the phase: add "
                                              "`Pick: best:METRIC` (a metric its `Pass:` compares) or max:/min:METRIC")
        return axes, pick

    def check_sweep(self, plan: Plan, phase: Phase) -> None:
        """A `Sweep:` as `runbook sweep --set` checks it (plan vars, values safe where the phase
        uses them), and its `Pick:` as `--pick` (a direction `Pass:` gives when it says `best`)."""
        from runbook.errors import RunbookError
        from runbook.plan.grid import phase_points, resolve_pick
        from runbook.plan.overrides import check

        def say(key: str, exc: RunbookError) -> None:
            hint = f" ({exc.hint})" if exc.hint else ""
            self.error(phase.field_lines[key] - 1, 1, f"{exc.message}{hint}")

        try:
            points = phase_points(plan, phase, self.path)
            for warning in check(plan, phase, points[0] if points else {}, flag="`Sweep:`"):
                self.warn(phase.field_lines["sweep"] - 1, 1, warning)
            for point in points[1:]:
                check(plan, phase, point, flag="`Sweep:`")
        except RunbookError as exc:
            say("sweep", exc)
        if phase.pick:
            try:
                resolve_pick(phase.pick, phase, flag="`Pick:`")
            except RunbookError as exc:
                say("pick", exc)

    def columns(self, line0: int, col: int, value: str) -> list[str]:
        """`Columns: val_loss, lr` -> ["val_loss", "lr"]: metric or var names, comma-separated
        (backticks around the list or a name are fine)."""
        names: list[str] = []
        if not value.strip("` \t"):
            self.error(line0, col, "`Columns:` is empty: name metrics or vars to show, e.g. `Columns: val_loss, lr`")
            return names
        at = col  # `value` starts at column `col` of its line
        for part in value.split(","):
            where = at + len(part) - len(part.lstrip())
            at += len(part) + 1
            name = part.strip().strip("`").strip()
            if not name:
                self.error(line0, where, "`Columns:` has an empty name between commas")
            elif not _COLUMN_RE.fullmatch(name):
                self.error(line0, where, f"`Columns:` {name!r} is not a metric or var name (letters, digits, `_`, "
                                         "with `.` or `-` between parts); separate names with commas")
            elif name in names:
                self.warn(line0, where, f"`Columns:` names {name!r} twice")
            else:
                names.append(name)
        return names

    def criterion(self, line0: int, col: int, value: str) -> Criterion | None:
        if not value:
            self.error(line0, col, "`Pass:` is empty: write a criterion such as `accept_len >= 1.5`")
            return None
        try:
            expr = criteria.parse_criterion(value)
        except criteria.CriterionError as exc:
            self.error(line0, col + exc.col - 1, f"Pass: {exc.message}")
            return None
        return Criterion(text=value, expr=expr, span=self.lines.span(line0, line0 + 1))

    def check_plan(self, plan: Plan) -> None:
        by_id: dict[str, Phase] = {}
        by_label: dict[str, Phase] = {}
        for phase in plan.phases:
            line0 = phase.span.start_line - 1
            if phase.id.lower() in by_id:
                self.error(line0, 1, f"duplicate phase id {phase.id!r} (first at line {by_id[phase.id.lower()].span.start_line}); give one an explicit id such as {{#{phase.id}-b}}")
            else:
                by_id[phase.id.lower()] = phase
            if phase.label.lower() in by_label and phase.id.lower() != by_label[phase.label.lower()].id.lower():
                self.error(line0, 1, f"duplicate phase label 'Phase {phase.label}' (first at line {by_label[phase.label.lower()].span.start_line}): references to it would be ambiguous")
            by_label.setdefault(phase.label.lower(), phase)
        known = ", ".join(p.display_name for p in plan.phases)
        index = plan.phase_index()
        for phase in plan.phases:
            for key in ("on_pass", "on_fail"):
                ref = getattr(phase, key)
                if ref and ref != "stop" and index.get(ref.lower()) is None:
                    line0 = phase.field_lines[key] - 1
                    self.error(line0, 1, f"`{_FIELD_NAMES[key]}` names {ref!r}, which is not a phase of this plan (phases: {known}; or `stop`)")
            for ref in phase.needs:
                if index.get(ref.lower()) is None:
                    self.error(phase.field_lines["needs"] - 1, 1, f"`Needs:` names {ref!r}, which is not a phase of this plan (phases: {known})")
            for step in phase.steps:
                self.check_command(plan, step)
            self.check_refs(plan, phase, index)
            if phase.sweep:
                self.check_sweep(plan, phase)
        self.check_inputs(plan)
        self.check_cycles(plan, index)

    def check_inputs(self, plan: Plan) -> None:
        """Each `Inputs:` path is another phase's `Outputs:` (with the plan's vars)."""
        from runbook.plan.outputs import output_paths

        made = {path: p for p in plan.phases for path in output_paths(p.outputs, plan.vars)}
        for phase in plan.phases:
            for path in output_paths(phase.inputs, plan.vars):
                maker = made.get(path)
                if maker is None or maker.id == phase.id:
                    what = "its own `Outputs:`" if maker is not None else "no phase's `Outputs:`"
                    self.error(phase.field_lines["inputs"] - 1, 1,
                               f"`Inputs:` {path!r} is {what}: an input names a file another phase declares in "
                               "`Outputs:` (declare it there, or drop it here)")

    def check_refs(self, plan: Plan, phase: Phase, index: dict[str, Phase]) -> None:
        """`phase-N.metric` names in `Pass:` must name another phase of this plan."""
        from runbook.plan import crossref

        crit = phase.criterion
        if crit is None or "." not in crit.text:
            return
        line0 = crit.span.start_line - 1
        base = self.lines.line(line0).find(crit.text)
        for col, message in crossref.check(plan, phase, index):
            self.error(line0, base + col, f"Pass: {message}")

    def check_fences(self, n_lines: int) -> None:
        """A fenced block that is never closed runs to the end of the file: say so, and make it an
        error when it swallows a phase heading (the phases after it would silently vanish)."""
        for tok in self.tokens:
            if tok.type != "fence" or tok.map is None or tok.map[1] < n_lines:
                continue
            first, stop = tok.map
            last = self.lines.line(stop - 1).strip() if stop - 1 > first else ""
            if last and set(last) == {tok.markup[0]} and len(last) >= len(tok.markup):
                continue  # closed on the file's last line
            swallowed = next(
                (k for k in range(first + 1, stop) if _ATX_OPEN_RE.match(self.lines.line(k))
                 and _PHASE_START_RE.match(_ATX_OPEN_RE.sub("", self.lines.line(k)))), None,
            )
            col = len(self.lines.line(first)) - len(self.lines.line(first).lstrip()) + 1
            if swallowed is not None:
                self.error(first, col, f"fenced block opened here ({tok.markup}) is never closed, so `{self.lines.line(swallowed).strip()}` at line {swallowed + 1} and everything after it is code, not plan; close it with a {tok.markup} line")
            else:
                self.warn(first, col, f"fenced block opened here ({tok.markup}) is never closed: the rest of the file is code; close it with a {tok.markup} line")

    def check_command(self, plan: Plan, step: Step) -> None:
        if "{" not in step.command:
            return
        names = list(plan.vars)
        pieces = resolve.scan(step.command)
        for piece in pieces:
            if piece.kind == "var" and not piece.nested and piece.value not in plan.vars:
                guess = resolve.closest(piece.value, names)
                hint = f"did you mean {{{guess}}}? " if guess else ""
                where = self.find_in_step(step, piece.text)
                self.error(
                    *where,
                    f"{step.id}: undefined var {piece.text}: {hint}declare it under `vars:` in the front matter, or write {{{{{piece.value}}}}} for literal braces",
                )
        if any(piece.kind == "var" and piece.value in plan.vars for piece in pieces):
            for unsafe in resolve.unsafe_vars(step.command, plan.vars):
                self.error(
                    *self.find_in_step(step, unsafe.piece.text),
                    f"{step.id}: {unsafe.piece.text} cannot be used here: {unsafe.reason}",
                )
        # suspicious_groups looks only at literal groups and the vars nested in them: skip its
        # second scan when this one found neither (the usual command)
        if not any(piece.kind == "group" or piece.nested for piece in pieces):
            return
        for piece, guess in resolve.suspicious_groups(step.command, names):
            self.warn(
                *self.find_in_step(step, piece.text),
                f"{step.id}: {piece.text} is left as written; did you mean {{{guess}}}?",
            )

    def find_in_step(self, step: Step, needle: str) -> tuple[int, int]:
        """(0-based line, 1-based col) of the first `needle` in the step's source, else its first line."""
        pos = self.text.find(needle, step.span.start, step.span.end)
        if pos < 0:
            return step.span.start_line - 1, 1
        line0 = step.span.start_line - 1 + count_newlines(self.text, step.span.start, pos)
        return line0, pos - self.lines.start(line0) + 1

    def check_cycles(self, plan: Plan, index: dict[str, Phase]) -> None:
        graph: dict[str, list[str]] = {}
        for phase in plan.phases:
            needed = [index.get(ref.lower()) for ref in phase.needs]
            graph[phase.id] = [t.id for t in needed if t is not None]
        state: dict[str, int] = {}  # 1 visiting, 2 done
        reported: set[frozenset[str]] = set()
        for root in graph:
            if state.get(root):
                continue
            stack: list[tuple[str, int]] = [(root, 0)]
            path: list[str] = []
            while stack:
                node, idx = stack.pop()
                if idx == 0:
                    state[node] = 1
                    path.append(node)
                targets = graph.get(node, [])
                if idx < len(targets):
                    stack.append((node, idx + 1))
                    nxt = targets[idx]
                    if state.get(nxt) == 1:
                        cycle = path[path.index(nxt) :] + [nxt]
                        key = frozenset(cycle)
                        if key not in reported:
                            reported.add(key)
                            phase = index[cycle[0].lower()]
                            self.error(
                                phase.field_lines.get("needs", phase.span.start_line) - 1,
                                1,
                                "`Needs:` cycle: " + " -> ".join(cycle) + "; a phase cannot need itself, directly or through others",
                            )
                    elif not state.get(nxt):
                        stack.append((nxt, 0))
                else:
                    state[node] = 2
                    path.pop()


def _is_phase_heading(content: str) -> bool:
    rest = _EXPLICIT_ID_RE.sub("", content)
    rest = _ESTIMATE_RE.sub("", rest).strip()
    m = _PHASE_RE.match(rest)
    return m is not None and (m.group("title") is not None or m.group("label")[0].isdigit())


def _phase_ref(text: str) -> str:
    ref = text.strip().strip("`").strip().rstrip(".").strip()
    return "stop" if ref.lower() == "stop" else ref


_FRONT_MATTER_MAX_VALUES = 10_000


def _expanded_size(data: Any, cap: int) -> int:
    """How many values `data` holds with every YAML alias expanded, counting up to just past `cap`."""
    count, stack = 0, [data]
    while stack and count <= cap:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            stack.extend(item)
    return count


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _code_spans(text: str) -> list[str]:
    """The contents of the inline code spans in a paragraph (CommonMark rules, simplified)."""
    if "`" not in text:
        return []
    runs = [m.span() for m in _BACKTICKS_RE.finditer(text)]
    spans: list[str] = []
    i = 0
    while i < len(runs):
        start, end = runs[i]
        escaped = start > 0 and text[start - 1] == "\\" and (start < 2 or text[start - 2] != "\\")
        length = end - start
        if escaped:
            length -= 1
            start += 1
            if length == 0:
                i += 1
                continue
        close = next((j for j in range(i + 1, len(runs)) if runs[j][1] - runs[j][0] == length), None)
        if close is None:
            i += 1
            continue
        content = text[end : runs[close][0]].replace("\r\n", " ").replace("\n", " ")
        if len(content) >= 2 and content[0] == " " and content[-1] == " " and content.strip():
            content = content[1:-1]
        spans.append(content)
        i = close + 1
    return spans
