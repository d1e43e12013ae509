r"""`{var}` substitution in step commands, quoted for where it stands. A value never runs as code.

Rules (docs/plan-format.md, "Vars"):

- `{name}`, where `name` is declared under `vars:`, becomes the value quoted for the shell context
  it stands in (runbook/plan/shellctx.py): unquoted, it is quoted with `shlex.quote` (write it
  unquoted: `--out {target}`); inside the author's '...' only `'` is escaped, inside "..." (and
  an unquoted here-document) `\`, `$`, `` ` `` (and `"`) are escaped, inside $'...' `\` and `'`;
  in a quoted here-document it is inserted as is. Contexts where no quoting is safe are refused
  (`UnsafeVar`; `runbook validate` reports them): backticks, `${...}`, arithmetic, right after a
  backslash, a here-document delimiter, a command whose quotes do not close, and a value holding
  a line break inside a here-document or a comment (it could end them early).
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

from runbook.plan.shellctx import Context, lex

__all__ = [
    "Piece",
    "UnsafeVar",
    "VAR_NAME_RE",
    "placeholders",
    "resolve_command",
    "scan",
    "suspicious_groups",
    "unsafe_vars",
]

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


class UnsafeVar(ValueError):
    """A declared `{var}` standing where its value cannot be quoted safely."""

    def __init__(self, piece: Piece, reason: str) -> None:
        super().__init__(f"{piece.text}: {reason}")
        self.piece = piece
        self.reason = reason


_REFUSED = {
    "backtick": "inside backticks no quoting is safe; use $(...) instead",
    "param": "inside ${...} no quoting is safe; set a shell variable first (x={name}; ${x:-...})",
    "arith": "inside arithmetic ($((...)), ((...))) the value would be evaluated; compute it outside",
    "delimiter": "a here-document delimiter cannot be a var",
}


def _quote(value: str, ctx: Context, piece: Piece) -> str:
    kind = ctx.kind
    if kind in _REFUSED:
        raise UnsafeVar(piece, _REFUSED[kind].replace("{name}", piece.text))
    if ctx.escaped:
        raise UnsafeVar(piece, "it follows a backslash, which would unquote its first character; remove the backslash")
    if kind in ("heredoc", "heredoc-literal", "comment") and ("\n" in value or "\r" in value):
        where = "a here-document" if kind != "comment" else "a comment"
        raise UnsafeVar(piece, f"its value holds a line break, which could end {where} early (line {ctx.line})")
    if kind == "single":
        return value.replace("'", "'\\''")
    if kind == "double":
        return re.sub(r'([\\"$`])', r"\\\1", value)
    if kind == "heredoc":
        return re.sub(r"([\\$`])", r"\\\1", value)
    if kind == "ansi":
        return re.sub(r"([\\'])", r"\\\1", value)
    if kind == "heredoc-literal":
        return value
    return shlex.quote(value)  # plain, comment


def _substitute(command: str, vars: dict[str, str]) -> tuple[str, list[UnsafeVar]]:
    pieces = scan(command)
    used = [p for p in pieces if p.kind == "var" and p.value in vars]
    lexed = lex(command, {p.start for p in used}) if used else None
    out: list[str] = []
    unsafe: list[UnsafeVar] = []
    for piece in pieces:
        if piece.kind != "var" or piece.value not in vars:
            out.append(piece.text if piece.kind == "var" else piece.value)
            continue
        assert lexed is not None
        if lexed.problem is not None:
            unsafe.append(UnsafeVar(piece, f"cannot tell how to quote it: in this command {lexed.problem}"))
            out.append(piece.text)
            continue
        try:
            out.append(_quote(str(vars[piece.value]), lexed.contexts[piece.start], piece))
        except UnsafeVar as exc:
            unsafe.append(exc)
            out.append(piece.text)
    return "".join(out), unsafe


def resolve_command(command: str, vars: dict[str, str]) -> str:
    """Substitute declared `{vars}` (quoted for their context) and `{{`/`}}` escapes; leave the
    rest as written. Raises `UnsafeVar` for a var no quoting can make safe where it stands."""
    text, unsafe = _substitute(command, vars)
    if unsafe:
        raise unsafe[0]
    return text


def unsafe_vars(command: str, vars: dict[str, str]) -> list[UnsafeVar]:
    """Every declared `{var}` of `command` that `resolve_command` would refuse (for validate)."""
    return _substitute(command, vars)[1]


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
