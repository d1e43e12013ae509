"""Tool-owned blocks inside hand-written Markdown: `<!-- runbook:NAME -->` ... `<!-- /runbook:NAME -->`.

Everything between a pair of markers belongs to runbook; everything outside belongs to the author.
A marker is an HTML comment alone on its line (up to three spaces of indent). The opening marker
may carry attributes, `<!-- runbook:results sha=1a2b3c -->`. Markers inside fenced code blocks are
examples, not markers.

`find_blocks` is pure and total: it returns the well-formed blocks it found and a problem for every
unbalanced, nested or duplicated marker.
"""

from __future__ import annotations

import re

from runbook.model import Block, Problem, Span
from runbook.plan.mdtext import Fences, count_newlines, ends_with_newline, line_end

__all__ = ["MARKER_RE", "find_blocks", "render_block"]

MARKER_RE = re.compile(
    r"^[ ]{0,3}<!--[ \t]*(?P<close>/?)runbook:(?P<name>[A-Za-z0-9_.-]+)(?P<attrs>[^\r\n]*?)[ \t]*-->[ \t]*$"
)
# Lines that matter to the scan: markers and fence lines (which hide markers inside them).
_INTERESTING = re.compile(r"^[ \t]*(?:<!--|```|~~~)[^\r\n]*", re.MULTILINE)
_ATTR_RE = re.compile(r"([A-Za-z0-9_.-]+)=(\S+)")


def render_block(name: str, inner: str, newline: str = "\n", attrs: dict[str, str] | None = None) -> str:
    """The full text of a block: opening marker, `inner` (ending in a newline), closing marker."""
    if inner and not ends_with_newline(inner):
        inner += newline
    attr_text = "".join(f" {k}={v}" for k, v in (attrs or {}).items())
    return f"<!-- runbook:{name}{attr_text} -->{newline}{inner}<!-- /runbook:{name} -->{newline}"


def find_blocks(
    text: str,
    start: int = 0,
    end: int | None = None,
    *,
    file: str = "",
    first_line: int | None = None,
) -> tuple[list[Block], list[Problem]]:
    """Find the marked blocks in `text[start:end]`.

    `start` should be the offset of a line start. `first_line` is the 1-based line number of
    `start` (computed when omitted). Block spans are offsets into `text`; a block's span runs from
    its opening marker's first byte through the closing marker's line ending, and `inner` is the
    text between the two marker lines. Problems carry `file` (default "").
    """
    end = len(text) if end is None else end
    if text.find("<!--", start, end) < 0:
        return [], []
    line_no = (count_newlines(text, 0, start) + 1) if first_line is None else first_line
    counted = start
    blocks: list[Block] = []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    open_marker: tuple[str, int, int, int, dict[str, str]] | None = None  # name, start, line, inner start, attrs
    fences = Fences()

    for m in _INTERESTING.finditer(text, start, end):
        line_no += count_newlines(text, counted, m.start())
        counted = m.start()
        line = m.group()
        if fences.step(line):
            continue
        after = line_end(text, m.end(), end)
        marker = MARKER_RE.match(line)
        if marker is None:
            if "runbook:" in line and line.lstrip().startswith("<!--"):
                problems.append(_problem(file, line_no, m, "a runbook marker must be alone on its line, as `<!-- runbook:NAME -->`"))
            continue
        name = marker.group("name")
        col = len(line) - len(line.lstrip(" ")) + 1
        if not marker.group("close"):
            if open_marker is not None:
                problems.append(
                    Problem(
                        file=file,
                        line=line_no,
                        col=col,
                        message=f"marker runbook:{name} opens inside runbook:{open_marker[0]} (opened at line "
                        f"{open_marker[2]}); close <!-- /runbook:{open_marker[0]} --> first: blocks cannot nest",
                    )
                )
                continue
            attrs = dict(_ATTR_RE.findall(marker.group("attrs")))
            open_marker = (name, m.start() + col - 1, line_no, after, attrs)
            continue
        if open_marker is None:
            problems.append(
                Problem(
                    file=file,
                    line=line_no,
                    col=col,
                    message=f"closing marker /runbook:{name} has no opening <!-- runbook:{name} --> before it",
                )
            )
            continue
        if name != open_marker[0]:
            problems.append(
                Problem(
                    file=file,
                    line=line_no,
                    col=col,
                    message=f"closing marker /runbook:{name} does not match the open runbook:{open_marker[0]} "
                    f"(line {open_marker[2]})",
                )
            )
            continue
        oname, ostart, oline, inner_start, attrs = open_marker
        open_marker = None
        if oname in seen:
            problems.append(
                Problem(
                    file=file,
                    line=oline,
                    col=1,
                    message=f"duplicate runbook:{oname} block (the first is at line {seen[oname]}); delete one of them",
                )
            )
            continue
        seen[oname] = oline
        block = Block(
            name=oname,
            span=Span(start_line=oline, end_line=line_no, start=ostart, end=after),
            inner=text[inner_start : counted],
        )
        if attrs:
            block.attrs = attrs
        blocks.append(block)

    if open_marker is not None:
        problems.append(
            Problem(
                file=file,
                line=open_marker[2],
                col=1,
                message=f"runbook:{open_marker[0]} block is never closed: add <!-- /runbook:{open_marker[0]} --> "
                "after its content",
            )
        )
    return blocks, problems


def _problem(file: str, line: int, m: re.Match[str], message: str) -> Problem:
    return Problem(file=file, line=line, col=1, message=message)
