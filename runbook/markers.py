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

__all__ = ["MARKER_RE", "detect_newline", "find_blocks", "render_block"]

MARKER_RE = re.compile(
    r"^[ ]{0,3}<!--[ \t]*(?P<close>/?)runbook:(?P<name>[A-Za-z0-9_.-]+)(?P<attrs>[^\r\n]*?)[ \t]*-->[ \t]*$"
)
# Lines that matter to the scan: markers and fence lines (which hide markers inside them).
_INTERESTING = re.compile(r"^[ \t]*(?:<!--|```|~~~)[^\r\n]*", re.MULTILINE)
_FENCE_RE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})(?P<info>[^\r\n]*)$")
_ATTR_RE = re.compile(r"([A-Za-z0-9_.-]+)=(\S+)")


def detect_newline(text: str) -> str:
    """The newline style of a text: the first line ending found, or "\\n"."""
    m = re.search(r"\r\n|\r|\n", text)
    return m.group() if m else "\n"


def render_block(name: str, inner: str, newline: str = "\n", attrs: dict[str, str] | None = None) -> str:
    """The full text of a block: opening marker, `inner` (ending in a newline), closing marker."""
    if inner and not inner.endswith(("\n", "\r")):
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
    line_no = (text.count("\n", 0, start) + 1) if first_line is None else first_line
    counted = start
    blocks: list[Block] = []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    open_marker: tuple[str, int, int, int, dict[str, str]] | None = None  # name, start, line, inner start, attrs
    fence: str | None = None

    for m in _INTERESTING.finditer(text, start, end):
        line_no += _count_lines(text, counted, m.start())
        counted = m.start()
        line = m.group()
        line_end = _line_end(text, m.end(), end)
        fence_m = _FENCE_RE.match(line)
        if fence_m:
            mark = fence_m.group("fence")
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not fence_m.group("info").strip():
                fence = None
            continue
        if fence is not None:
            continue
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
            open_marker = (name, m.start() + col - 1, line_no, line_end, attrs)
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
            span=Span(start_line=oline, end_line=line_no, start=ostart, end=line_end),
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


def _count_lines(text: str, a: int, b: int) -> int:
    if a >= b:
        return 0
    n = text.count("\n", a, b)
    if "\r" in text[a:b]:
        # Lone CR line endings count too (markdown-it treats them as newlines).
        n += len(re.findall(r"\r(?!\n)", text[a:b]))
    return n


def _line_end(text: str, pos: int, end: int) -> int:
    """Offset just past the line ending at or after `pos` (or `end`)."""
    if pos < end and text[pos] == "\r":
        pos += 1
        if pos < end and text[pos] == "\n":
            pos += 1
    elif pos < end and text[pos] == "\n":
        pos += 1
    return pos


def _problem(file: str, line: int, m: re.Match[str], message: str) -> Problem:
    return Problem(file=file, line=line, col=1, message=message)
