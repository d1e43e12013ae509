"""The quoting context of offsets in a bash script: where would text inserted there end up?

A small lexer for what decides how a `{var}` value must be quoted (runbook/plan/resolve.py): plain
words, '...', "...", $'...', $"...", comments, here-documents (quoted delimiter or not, `<<-`; a `<<<` here-string is an ordinary word),
command substitution `$(...)` (a plain context again, even inside double quotes), and the
contexts where no quoting is safe: backticks, `${...}` parameter expansion and arithmetic
(`$((...))`, `((...))`). Text right after an unquoted backslash is marked `escaped`.

Pure and total: every input lexes; a script whose quotes, substitutions or here-documents do not
close comes back with `problem` set, and callers then trust none of its contexts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

__all__ = ["Context", "Lexed", "lex"]

Kind = Literal[
    "plain", "single", "ansi", "double", "comment", "heredoc", "heredoc-literal", "delimiter",
    "backtick", "param", "arith",
]
# frames that make everything inside them unsafe for substitution, whatever is nested there
_OPAQUE = ("backtick", "param", "arith")
_META = set(" \t\n;&|()<>")


class Context(NamedTuple):
    """Where an offset sits: the innermost context, and whether an unquoted `\\` precedes it."""

    kind: Kind
    escaped: bool = False
    line: int = 1  # 1-based line of the offset in the script


@dataclass
class _Frame:
    kind: Kind  # plain | single | ansi | double | comment | heredoc | backtick | param | arith
    closer: str = ""  # plain: ")" inside $(...); "" at top level
    depth: int = 0  # open parentheses (plain, arith) or braces (param)
    delim: str = ""  # heredoc
    strip_tabs: bool = False  # heredoc `<<-`
    quoted: bool = False  # heredoc with a quoted delimiter: its body is literal
    pending: list[tuple[str, bool, bool]] = field(default_factory=list)  # plain: heredocs opened on this line


@dataclass
class Lexed:
    contexts: dict[int, Context]
    problem: str | None = None  # why the script's structure cannot be trusted


def lex(script: str, offsets: set[int] | frozenset[int] = frozenset()) -> Lexed:
    """The context of each of `offsets` in `script` (offsets past the end get the final context)."""
    return _Lexer(script, set(offsets)).run()


class _Lexer:
    def __init__(self, text: str, wanted: set[int]) -> None:
        self.text = text
        self.wanted = wanted
        self.found: dict[int, Context] = {}
        self.stack: list[_Frame] = [_Frame("plain")]
        self.queue: list[tuple[str, bool, bool]] = []  # heredoc bodies still to read
        self.word_start = True
        self.line_start = True

    # -- recording --
    def kind(self) -> Kind:
        for frame in self.stack:
            if frame.kind in _OPAQUE:
                return frame.kind
        top = self.stack[-1]
        if top.kind == "heredoc":
            return "heredoc-literal" if top.quoted else "heredoc"
        return top.kind

    def note(self, i: int, escaped: bool = False, kind: Kind | None = None) -> None:
        if i in self.wanted and i not in self.found:
            line = self.text.count("\n", 0, i) + 1
            self.found[i] = Context(kind or self.kind(), escaped, line)

    # -- the walk --
    def run(self) -> Lexed:
        text = self.text
        i, n = 0, len(text)
        while i < n:
            self.note(i)
            top = self.stack[-1]
            handler = getattr(self, f"_{top.kind}")
            i = handler(i, top)
        for offset in self.wanted - set(self.found):
            if offset >= n:
                self.note(offset)
        return Lexed(self.found, self.problem())

    def problem(self) -> str | None:
        open_frames = [f.kind for f in self.stack[1:] if f.kind != "comment"]
        if self.stack[-1].kind == "heredoc" or self.queue or self.stack[0].pending:
            return "a here-document is not closed by its delimiter line"
        if open_frames:
            names = {"single": "a ' quote", "double": 'a " quote', "ansi": "a $' quote", "backtick": "a backtick",
                     "param": "a ${", "arith": "an arithmetic $((", "plain": "a $("}
            return f"{names.get(open_frames[-1], open_frames[-1])} is never closed"
        return None

    def push(self, frame: _Frame) -> None:
        self.stack.append(frame)

    def pop(self) -> None:
        if len(self.stack) > 1:
            self.stack.pop()

    def _escape(self, i: int) -> int:
        """At a backslash: the next character is escaped."""
        self.note(i + 1, escaped=True)
        return i + 2

    def _expansion(self, i: int) -> int | None:
        """`$(`, `$((`, `${` or a backtick at `i`: push its frame and return the next offset."""
        text = self.text
        if text.startswith("$((", i):
            self.push(_Frame("arith"))
            return i + 3
        if text.startswith("$(", i):
            self.push(_Frame("plain", closer=")"))
            self.word_start = True
            return i + 2
        if text.startswith("${", i):
            self.push(_Frame("param", depth=1))
            return i + 2
        if text[i] == "`":
            self.push(_Frame("backtick"))
            return i + 1
        return None

    # -- frames --
    def _plain(self, i: int, top: _Frame) -> int:
        text = self.text
        c = text[i]
        at_word_start = self.word_start
        self.word_start = c in _META
        if c == "\\":
            return self._escape(i)
        if c == "'":
            self.push(_Frame("single"))
            return i + 1
        if c == '"':
            self.push(_Frame("double"))
            return i + 1
        if text.startswith("$'", i):
            self.push(_Frame("ansi"))
            return i + 2
        if text.startswith('$"', i):
            self.push(_Frame("double"))
            return i + 2
        nxt = self._expansion(i)
        if nxt is not None:
            return nxt
        if c == "#" and at_word_start:
            self.push(_Frame("comment"))
            return i + 1
        if text.startswith("((", i) and at_word_start:
            self.push(_Frame("arith"))
            return i + 2
        if text.startswith("<<<", i):  # a here-string: its word is an ordinary word, no body follows
            return i + 3
        if text.startswith("<<", i):
            return self._heredoc_op(i + 2, top)
        if c == "(":
            top.depth += 1
        elif c == ")":
            if top.depth > 0:
                top.depth -= 1
            elif top.closer == ")":
                self.pop()
        elif c == "\n":
            self._start_bodies(top)
        return i + 1

    def _heredoc_op(self, j: int, top: _Frame) -> int:
        text, n = self.text, len(self.text)
        strip = j < n and text[j] == "-"
        if strip:
            j += 1
        while j < n and text[j] in " \t":
            j += 1
        word: list[str] = []
        quoted = False
        while j < n and text[j] not in _META:
            self.note(j, kind="delimiter")
            c = text[j]
            if c in "'\"":
                quoted = True
                close = text.find(c, j + 1)
                close = n if close < 0 else close
                for k in range(j + 1, min(close, n)):
                    self.note(k, kind="delimiter")
                word.append(text[j + 1 : close])
                j = close + 1
            elif c == "\\":
                quoted = True
                word.append(text[j + 1 : j + 2])
                j += 2
            else:
                word.append(c)
                j += 1
        top.pending.append(("".join(word), strip, quoted))
        self.word_start = True
        return j

    def _start_bodies(self, top: _Frame) -> None:
        """After a newline in a plain frame: the here-documents opened on that line begin."""
        if top.pending:
            self.queue.extend(top.pending)
            top.pending = []
            self._next_body()

    def _next_body(self) -> None:
        if self.queue:
            delim, strip, quoted = self.queue.pop(0)
            self.push(_Frame("heredoc", delim=delim, strip_tabs=strip, quoted=quoted))
            self.line_start = True

    def _heredoc(self, i: int, top: _Frame) -> int:
        text = self.text
        if self.line_start:
            self.line_start = False
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            line = text[i:end]
            if (line.lstrip("\t") if top.strip_tabs else line) == top.delim:
                for k in range(i, end + 1):
                    self.note(k, kind="delimiter")
                self.pop()
                self._next_body()
                return end + 1
        c = text[i]
        if c == "\n":
            self.line_start = True
            return i + 1
        if top.quoted:
            return i + 1
        if c == "\\":
            return self._escape(i)
        nxt = self._expansion(i)
        return nxt if nxt is not None else i + 1

    def _single(self, i: int, top: _Frame) -> int:
        if self.text[i] == "'":
            self.pop()
        return i + 1

    def _ansi(self, i: int, top: _Frame) -> int:
        return self._escaped_until(i, "'")

    def _escaped_until(self, i: int, close: str) -> int:
        """A frame where a backslash escapes the next character and `close` ends the frame."""
        c = self.text[i]
        if c == "\\":
            return i + 2
        if c == close:
            self.pop()
        return i + 1

    def _double(self, i: int, top: _Frame) -> int:
        c = self.text[i]
        if c == "\\":
            return self._escape(i)
        if c == '"':
            self.pop()
            return i + 1
        nxt = self._expansion(i)
        return nxt if nxt is not None else i + 1

    def _comment(self, i: int, top: _Frame) -> int:
        if self.text[i] == "\n":
            self.pop()  # the newline itself belongs to the frame below (it may start here-documents)
            return i
        return i + 1

    def _backtick(self, i: int, top: _Frame) -> int:
        return self._escaped_until(i, "`")

    def _param(self, i: int, top: _Frame) -> int:
        c = self.text[i]
        if c == "\\":
            return i + 2
        if c in "'\"":
            self.push(_Frame("single" if c == "'" else "double"))
            return i + 1
        nxt = self._expansion(i) if c in "$`" else None
        if nxt is not None:
            return nxt
        if c == "{":
            top.depth += 1
        elif c == "}":
            top.depth -= 1
            if top.depth == 0:
                self.pop()
        return i + 1

    def _arith(self, i: int, top: _Frame) -> int:
        text = self.text
        c = text[i]
        if c == "(":
            top.depth += 1
        elif c == ")":
            if top.depth > 0:
                top.depth -= 1
            elif text.startswith("))", i):
                self.pop()
                return i + 2
            else:
                self.pop()
        return i + 1
