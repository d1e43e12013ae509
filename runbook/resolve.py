"""`{var}` substitution in step commands, with shell quoting.

Rules (docs/plan-format.md, "Vars"):

- `{name}`, where `name` is declared under `vars:`, becomes the value quoted with `shlex.quote`
  (write it unquoted in the command: `--out {target}`).
- `{{` and `}}` are literal `{` and `}`.
- `${...}` is shell parameter expansion and is left exactly as written.
- Any other `{` starts a literal group that runs to its matching `}`: its braces stay as written,
  so JSON (`'{"score": 3}'`), awk programs and `find -exec {}` stay intact. Declared `{name}`s
  inside a group are still substituted; undeclared ones inside a group are left alone.
- A top-level `{name}` whose name is not declared is left as written; `runbook validate` reports
  it as an error.
"""

from __future__ import annotations

import re
import shlex
from typing import Literal, NamedTuple

__all__ = ["Piece", "VAR_NAME_RE", "placeholders", "resolve_command", "scan", "suspicious_groups"]

VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*")
_VAR_RE = re.compile(r"\{(" + VAR_NAME_RE.pattern + r")\}")
_BRACES = re.compile(r"[{}]")


class Piece(NamedTuple):
    """One part of a command: plain text, a `{var}`, a literal group, or an escaped brace."""

    kind: Literal["text", "var", "group", "brace"]
    text: str  # the source text of the piece
    start: int  # offset in the command
    value: str  # what the piece stands for: the var name for "var", the literal text otherwise
    nested: bool = False  # a `{name}` inside a literal group


def scan(command: str) -> list[Piece]:
    """Split a command into pieces (pure; total: every input scans)."""
    pieces: list[Piece] = []
    i, n = 0, len(command)
    while i < n:
        m = _BRACES.search(command, i)
        if m is None:
            pieces.append(Piece("text", command[i:], i, command[i:]))
            break
        j = m.start()
        if j > i:
            pieces.append(Piece("text", command[i:j], i, command[i:j]))
        ch = command[j]
        if command.startswith(ch * 2, j):
            pieces.append(Piece("brace", ch * 2, j, ch))
            i = j + 2
            continue
        if ch == "}":
            pieces.append(Piece("text", "}", j, "}"))
            i = j + 1
            continue
        var = _VAR_RE.match(command, j)
        if var and not (j > 0 and command[j - 1] == "$"):
            pieces.append(Piece("var", var.group(), j, var.group(1)))
            i = var.end()
            continue
        end = _group_end(command, j)
        pieces.extend(_group_pieces(command, j, end))
        i = end
    return pieces


def _group_pieces(command: str, start: int, end: int) -> list[Piece]:
    pieces: list[Piece] = []
    pos = start
    for var in _VAR_RE.finditer(command, start + 1, end):
        if command[var.start() - 1] == "$":
            continue
        if var.start() > pos:
            pieces.append(Piece("group", command[pos : var.start()], pos, command[pos : var.start()]))
        pieces.append(Piece("var", var.group(), var.start(), var.group(1), True))
        pos = var.end()
    if pos < end:
        pieces.append(Piece("group", command[pos:end], pos, command[pos:end]))
    return pieces


def _group_end(command: str, start: int) -> int:
    depth = 0
    for k in range(start, len(command)):
        if command[k] == "{":
            depth += 1
        elif command[k] == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(command)


def resolve_command(command: str, vars: dict[str, str]) -> str:
    """Substitute declared `{vars}` (shell-quoted) and `{{`/`}}` escapes; leave the rest as written."""
    out: list[str] = []
    for piece in scan(command):
        if piece.kind == "var":
            out.append(shlex.quote(str(vars[piece.value])) if piece.value in vars else piece.text)
        else:
            out.append(piece.value)
    return "".join(out)


def placeholders(command: str) -> list[str]:
    """Names of the top-level `{name}` placeholders in a command, in order, without repeats."""
    names: list[str] = []
    for piece in scan(command):
        if piece.kind == "var" and not piece.nested and piece.value not in names:
            names.append(piece.value)
    return names


def suspicious_groups(command: str, declared: list[str] | dict[str, str]) -> list[tuple[Piece, str]]:
    """Literal groups that look like a misspelt var, each with the var it probably meant.

    `{ target }` (spaces) and near misses of declared names inside a group (`{"x": {tagret}}`)
    are left as written by `resolve_command`; `validate` warns about them.
    """
    names = list(declared)
    found: list[tuple[Piece, str]] = []
    for piece in scan(command):
        if piece.kind == "var" and piece.nested and piece.value not in names:
            guess = closest(piece.value, names)
            if guess is not None:
                found.append((piece, guess))
        elif piece.kind == "group" and piece.text.startswith("{") and piece.text.endswith("}"):
            inner = piece.text[1:-1].strip()
            if VAR_NAME_RE.fullmatch(inner):
                guess = inner if inner in names else closest(inner, names)
                if guess is not None:
                    found.append((piece, guess))
    return found


def closest(name: str, names: list[str]) -> str | None:
    """The declared name closest to `name` (case-insensitive match first), or None."""
    for candidate in names:
        if candidate.lower() == name.lower():
            return candidate
    import difflib

    matches = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return matches[0] if matches else None
