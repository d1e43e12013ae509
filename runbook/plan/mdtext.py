"""Text mechanics of the Markdown documents runbook edits in place (plans, notes, AGENTS.md).

The one home for: a document's newline style, line endings and line counts, line offsets, and
which lines are fenced code. Pure functions of `str`; nothing here knows a plan's or a notes
document's structure (parse.py reads plans with markdown-it; markers.py, notes.py and
writeback.py edit them through these helpers).

A line ends at `\\r\\n`, a lone `\\r` or `\\n`, each counting once, as markdown-it counts them, so
line numbers agree with the parser's whatever the file's newline style.

Fenced code (`Fences`): a fence line is three or more backticks or tildes after any indentation
(fences nest inside list items); the block closes at a line of the same character, at least as
long, with nothing after it. Markers, headings and bullets inside fenced code are examples, not
structure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import accumulate
from typing import TypeVar

__all__ = [
    "NEWLINE_RE",
    "Fences",
    "Line",
    "LineTable",
    "count_newlines",
    "detect_newline",
    "ends_with_newline",
    "line_end",
    "lines",
    "to_lf",
    "with_newlines",
]

NEWLINE_RE = re.compile(r"\r\n|\r|\n")
_LINE_BREAK = re.compile(r"[\r\n]")
_FENCE_RE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})(?P<info>[^\r\n]*)$")
_Table = TypeVar("_Table", bound="LineTable")


# ---- newline style ------------------------------------------------------------------------------


def detect_newline(text: str) -> str:
    """The newline style of a text: its first line ending, or "\\n" when it has none."""
    m = NEWLINE_RE.search(text)
    return m.group() if m else "\n"


def with_newlines(text: str, newline: str) -> str:
    """`text` with every line ending written as `newline`."""
    return NEWLINE_RE.sub(newline, text)


def to_lf(text: str) -> str:
    """`text` with "\\n" line endings (a text without `\\r` comes back as it is)."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def ends_with_newline(text: str) -> bool:
    """Whether `text` ends in a line ending (of any style)."""
    return text.endswith(("\n", "\r"))


# ---- line ends and counts -----------------------------------------------------------------------


def count_newlines(text: str, a: int = 0, b: int | None = None) -> int:
    """Line endings in text[a:b]."""
    b = len(text) if b is None else b
    if a >= b:
        return 0
    n = text.count("\n", a, b)
    if text.find("\r", a, b) >= 0:
        n += text.count("\r", a, b) - text.count("\r\n", a, b)
    return n


def line_end(text: str, pos: int, end: int | None = None) -> int:
    """Offset just past the line ending of the line holding `pos` (`end`, default len(text), when
    the line has none before it)."""
    end = len(text) if end is None else end
    m = _LINE_BREAK.search(text, pos, end)
    if m is None:
        return end
    pos = m.start() + 1
    if text[m.start()] == "\r" and pos < end and text[pos] == "\n":
        pos += 1
    return pos


# ---- lines with their offsets -------------------------------------------------------------------


@dataclass
class LineTable:
    """Line table of a text: 0-based line i is text[starts[i]:starts[i+1]], its ending included.

    `starts` ends with len(text) as a sentinel, so it has one entry more than there are lines; a
    text that ends in a line ending has no empty last line, and the empty text has one empty line.
    """

    text: str
    starts: list[int]

    @classmethod
    def of(cls: type[_Table], text: str) -> _Table:
        starts = [0]
        if "\r" in text:
            starts.extend(m.end() for m in NEWLINE_RE.finditer(text))
        else:  # the usual case: sums of the line lengths, without a match object per line
            starts.extend(accumulate(len(line) + 1 for line in text.split("\n")[:-1]))
        if len(starts) > 1 and starts[-1] == len(text):
            starts.pop()
        starts.append(len(text))
        return cls(text, starts)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def start(self, i: int) -> int:
        starts = self.starts
        return starts[i] if i < len(starts) else starts[-1]

    def line(self, i: int) -> str:
        """Line i without its ending."""
        starts = self.starts
        if i + 1 < len(starts):
            return self.text[starts[i] : starts[i + 1]].rstrip("\r\n")
        return self.text[self.start(i) : self.start(i + 1)].rstrip("\r\n")


@dataclass(frozen=True)
class Line:
    start: int  # offset of the first character
    end: int  # offset after the line's ending (or the end of the text)
    content: str  # without the ending


def lines(text: str) -> list[Line]:
    """The lines of `text` with their offsets (none for the empty text)."""
    if not text:
        return []
    table = LineTable.of(text)
    starts = table.starts
    return [Line(starts[i], starts[i + 1], table.line(i)) for i in range(len(table))]


# ---- fenced code --------------------------------------------------------------------------------


class Fences:
    """Which lines are fenced code, fed one line (without its ending) at a time, in order."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open: str | None = None  # the opening fence's run of ` or ~ while inside a block

    def step(self, line: str) -> bool:
        """Take the next line; True when it is code: a fence line, or a line inside a block."""
        m = _FENCE_RE.match(line) if ("`" in line or "~" in line) else None
        if self.open is None:
            if m is None:
                return False
            self.open = m.group("fence")
            return True
        if m is not None:
            mark = m.group("fence")
            if mark[0] == self.open[0] and len(mark) >= len(self.open) and not m.group("info").strip():
                self.open = None
        return True
