"""The `Pass:` expression language: parse to a tree, evaluate three-valued. Never `eval`.

Grammar (lowest precedence first)::

    expr    := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | primary
    primary := "(" expr ")" | operand OP operand (OP operand)*
    operand := METRIC | NUMBER | STRING
    OP      := "<" | "<=" | ">" | ">=" | "==" | "!="

METRIC names start with a letter or `_` and may contain letters, digits, `_`, `.` and `-`
(`accept_len`, `val_acc_0`, `step-2.loss`, `cfg.lr`). NUMBER is a decimal literal with optional
sign and exponent (`1.5`, `-3`, `2e-4`). STRING is `"..."` or `'...'` (no escapes), compared with
string metrics (`optimizer == "adamw"`). A chained comparison `1 <= x < 3` means `1 <= x and x < 3`.
The whole expression may be wrapped in backticks, as it usually is in a plan. Parentheses and
`not` nest at most 64 deep (deeper is an error, never a RecursionError).

Evaluation is three-valued (Kleene logic): a comparison that needs a metric no step produced is
`inconclusive`; `and` is `fail` if any side fails, `or` is `pass` if any side passes, otherwise
an unknown side makes the result `inconclusive`. A NaN value fails every comparison. A string
equals only the same string (`==` / `!=`); an ordering (`<`, `>=`, ...) with a string fails.

The explanation marks each comparison that does not hold with `✗ ` (`✗ gain 0.08 >= 0.1`), and
`Judgement.comparisons` gives every comparison as data (metric, operator, value, threshold, held).
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel

from runbook.model import BoolOp, Compare, CompareOp, Expr, MetricRef, Not, Number, Text

__all__ = [
    "FAILED_MARK",
    "Comparison",
    "CriterionError",
    "Judgement",
    "evaluate",
    "format_value",
    "metric_names",
    "parse_criterion",
    "render",
    "strip_backticks",
]

Tri = Literal["pass", "fail", "inconclusive"]


class CriterionError(ValueError):
    """A `Pass:` expression that does not parse. `col` is 1-based within the text given."""

    def __init__(self, message: str, col: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.col = col

    def __str__(self) -> str:
        return f"col {self.col}: {self.message}"


FAILED_MARK = "✗ "  # marks a comparison that does not hold, in explanations


class Comparison(BaseModel):
    """One comparison of a criterion, judged. `accept_len >= 1.5` with accept_len 1.31 is
    metric "accept_len", op ">=", value 1.31, threshold 1.5, held False. When the metric is on the
    right (`1.5 <= accept_len`) the operator is flipped so that the metric reads first."""

    text: str  # as in the explanation, without the mark: "accept_len 1.31 >= 1.5"
    metric: str | None  # the metric compared; None when both sides are numbers
    op: CompareOp
    value: float | str | None  # the metric's value; None when no step wrote it
    threshold: float | str | None  # the number (or the other metric's value) it is compared with
    threshold_metric: str | None = None  # the other metric, when both sides are metrics
    held: bool | None  # None: a metric is missing


class Judgement(BaseModel):
    """The outcome of evaluating a criterion against a metrics dict."""

    verdict: Tri
    explanation: str  # "accept_len 2.41 >= 1.5 and ✗ train_loss 5 < 4.0"
    missing: list[str] = []  # metric names the expression needs that were not produced
    values: dict[str, float | str] = {}  # the metrics the expression looked at, as found
    comparisons: list[Comparison] = []  # every comparison, in the order written


# ---- tokenizer -----------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"""
    \s*
    (?:
        (?P<num>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(?![A-Za-z0-9_.])
      | (?P<str>"[^"]*"|'[^']*')
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:[.-][A-Za-z0-9_]+)*)
      | (?P<op><=|>=|==|!=|<|>)
      | (?P<lpar>\()
      | (?P<rpar>\))
      | (?P<bad>\S)
    )
    """,
    re.VERBOSE,
)
_KEYWORDS = frozenset({"and", "or", "not"})
MAX_DEPTH = 64  # parentheses and `not` nested deeper are an error
_HINTS = {
    '"': 'a string needs its closing quote: "adamw"',
    "'": "a string needs its closing quote: 'adamw'",
    "=": "use '==' to compare",
    "&": "use 'and'",
    "|": "use 'or'",
    "!": "use 'not' or '!='",
}


class _Tok:
    __slots__ = ("kind", "text", "col")

    def __init__(self, kind: str, text: str, col: int) -> None:
        self.kind = kind
        self.text = text
        self.col = col


def _tokenize(text: str, base_col: int) -> list[_Tok]:
    tokens: list[_Tok] = []
    # each match is a token after optional whitespace; `bad` takes any other non-space
    # character, so the matches cover the whole text but its trailing whitespace
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup or ""
        word = m.group(kind)
        col = base_col + m.start(kind)
        if kind == "bad":
            hint = _HINTS.get(word, "expected a metric name, a number, a comparison, and/or/not or parentheses")
            raise CriterionError(f"unexpected {word!r}: {hint}", col)
        if kind == "name" and word in _KEYWORDS:
            kind = word
        tokens.append(_Tok(kind, word, col))
    tokens.append(_Tok("end", "", base_col + len(text)))
    return tokens


# ---- parser --------------------------------------------------------------------------------


class _Parser:
    """Recursive descent over the token list. Inner nodes are built with `model_construct`: the
    parser only ever builds well-typed trees, and skipping validation keeps a 500-phase plan fast.
    The leaves (a name, a float) use the validating constructors, which pydantic runs faster than
    `model_construct` for models this small."""

    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0

    def deeper(self, tok: _Tok) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CriterionError(
                f"nested more than {MAX_DEPTH} deep (parentheses and `not`); write it flatter", tok.col
            )

    def peek(self) -> _Tok:
        return self.tokens[self.i]

    def take(self) -> _Tok:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def parse(self) -> Expr:
        if self.peek().kind == "end":
            raise CriterionError("empty criterion: write a comparison such as `accept_len >= 1.5`", self.peek().col)
        expr = self.parse_or()
        tok = self.peek()
        if tok.kind != "end":
            if tok.kind == "rpar":
                raise CriterionError("unbalanced ')': no '(' to close", tok.col)
            raise CriterionError(f"unexpected {tok.text!r}: join conditions with 'and' / 'or'", tok.col)
        return expr

    def parse_or(self) -> Expr:
        items = [self.parse_and()]
        while self.peek().kind == "or":
            self.take()
            items.append(self.parse_and())
        return items[0] if len(items) == 1 else BoolOp.model_construct(kind="or", items=items)

    def parse_and(self) -> Expr:
        items = [self.parse_not()]
        while self.peek().kind == "and":
            self.take()
            items.append(self.parse_not())
        return items[0] if len(items) == 1 else BoolOp.model_construct(kind="and", items=items)

    def parse_not(self) -> Expr:
        if self.peek().kind == "not":
            self.deeper(self.take())
            item = self.parse_not()
            self.depth -= 1
            return Not.model_construct(kind="not", item=item)
        return self.parse_primary()

    def parse_primary(self) -> Expr:
        tok = self.peek()
        if tok.kind == "lpar":
            self.deeper(self.take())
            expr = self.parse_or()
            close = self.peek()
            if close.kind != "rpar":
                raise CriterionError("missing ')': a '(' is never closed", close.col)
            self.take()
            self.depth -= 1
            return expr
        left = self.parse_operand()
        compares: list[Compare] = []
        while self.peek().kind == "op":
            op = self.take().text
            right = self.parse_operand()
            compares.append(Compare.model_construct(kind="compare", left=left, op=op, right=right))
            left = right
        if not compares:
            nxt = self.peek()
            what = "the end" if nxt.kind == "end" else repr(nxt.text)
            raise CriterionError(
                f"expected a comparison (< <= > >= == !=) after {tok.text!r}, found {what}", nxt.col
            )
        return compares[0] if len(compares) == 1 else BoolOp.model_construct(kind="and", items=list(compares))

    def parse_operand(self) -> MetricRef | Number | Text:
        tok = self.take()
        if tok.kind == "name":
            return MetricRef(kind="metric", name=tok.text)
        if tok.kind == "num":
            return Number(kind="number", value=float(tok.text), text=tok.text)
        if tok.kind == "str":
            return Text(kind="text", value=tok.text[1:-1])
        if tok.kind == "end":
            raise CriterionError("expression ends too early: expected a metric name or a number", tok.col)
        if tok.kind in _KEYWORDS:
            raise CriterionError(f"expected a metric name or a number, found the keyword {tok.text!r}", tok.col)
        raise CriterionError(f"expected a metric name or a number, found {tok.text!r}", tok.col)


def strip_backticks(text: str) -> tuple[str, int]:
    """Remove one pair of surrounding backtick runs; return (inner text, its offset in `text`)."""
    stripped = text.strip()
    lead = len(text) - len(text.lstrip())
    n = len(stripped) - len(stripped.lstrip("`"))
    if n and stripped.endswith("`" * n) and len(stripped) >= 2 * n:
        tail = len(stripped) - len(stripped.rstrip("`"))
        if tail == n:
            return stripped[n : len(stripped) - n], lead + n
    return stripped, lead


def parse_criterion(text: str) -> Expr:
    """Parse a `Pass:` expression (backticks optional). Raises `CriterionError` with a 1-based col."""
    inner, offset = strip_backticks(text)
    if "`" in inner:
        raise CriterionError("stray backtick: wrap the whole expression in one pair of backticks", offset + inner.index("`") + 1)
    return _Parser(_tokenize(inner, offset + 1)).parse()


# ---- inspection and rendering --------------------------------------------------------------


def metric_names(expr: Expr) -> list[str]:
    """The metric names the expression reads, in order of first appearance."""
    names: list[str] = []
    for node in _operands(expr):
        if isinstance(node, MetricRef) and node.name not in names:
            names.append(node.name)
    return names


def _operands(expr: Expr) -> list[MetricRef | Number | Text]:
    if isinstance(expr, Compare):
        return [expr.left, expr.right]
    if isinstance(expr, Not):
        return _operands(expr.item)
    out: list[MetricRef | Number | Text] = []
    for item in expr.items:
        out.extend(_operands(item))
    return out


_PRECEDENCE = {"or": 1, "and": 2, "not": 3, "compare": 4}


def render(expr: Expr) -> str:
    """Canonical text of an expression, with only the parentheses it needs."""
    return _render(expr, 0)


def _render(expr: Expr, outer: int) -> str:
    prec = _PRECEDENCE[expr.kind]
    if isinstance(expr, Compare):
        text = f"{_operand_text(expr.left)} {expr.op} {_operand_text(expr.right)}"
    elif isinstance(expr, Not):
        text = f"not {_render(expr.item, prec)}"
    else:
        text = f" {expr.kind} ".join(_render(item, prec + 1 if item.kind == expr.kind else prec) for item in expr.items)
    return f"({text})" if prec < outer else text


def _operand_text(node: MetricRef | Number | Text) -> str:
    if isinstance(node, MetricRef):
        return node.name
    if isinstance(node, Text):
        return '"' + node.value + '"' if '"' not in node.value else "'" + node.value + "'"
    return node.text if node.text is not None else format_value(node.value)


def format_value(value: float | str | None) -> str:
    """A metric value for messages: integers without a fraction, others to 6 significant digits,
    strings as they are (at most 60 characters), `-` for none."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value if len(value) <= 60 else value[:57] + "..."
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


# ---- evaluation ----------------------------------------------------------------------------

_COMPARE = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


def evaluate(expr: Expr, metrics: dict[str, float | str]) -> Judgement:
    """Judge `expr` against `metrics`: pass, fail, or inconclusive when a needed metric is missing."""
    values: dict[str, float | str] = {}
    missing: list[str] = []
    for name in metric_names(expr):
        value = _value(metrics.get(name))
        if value is None:
            missing.append(name)
        else:
            values[name] = value
    verdict, explanation = _judge(expr, values, 0)
    comparisons = [_comparison(leaf, values) for leaf in _leaves(expr)]
    return Judgement(
        verdict=verdict, explanation=explanation, missing=missing, values=values, comparisons=comparisons
    )


_FLIP: dict[str, CompareOp] = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def _leaves(expr: Expr) -> list[Compare]:
    if isinstance(expr, Compare):
        return [expr]
    if isinstance(expr, Not):
        return _leaves(expr.item)
    out: list[Compare] = []
    for item in expr.items:
        out.extend(_leaves(item))
    return out


def _comparison(leaf: Compare, values: dict[str, float | str]) -> Comparison:
    left, right = _side(leaf.left, values), _side(leaf.right, values)
    held = None if left[0] is None or right[0] is None else _holds(leaf.op, left[0], right[0])
    subject, op, other = leaf.left, leaf.op, leaf.right
    if not isinstance(subject, MetricRef) and isinstance(other, MetricRef):
        subject, op, other = other, _FLIP[op], subject
    metric = subject.name if isinstance(subject, MetricRef) else None
    return Comparison(
        text=f"{left[1]} {leaf.op} {right[1]}",
        metric=metric,
        op=op,
        value=_side(subject, values)[0] if metric else None,
        threshold=_side(other, values)[0],
        threshold_metric=other.name if isinstance(other, MetricRef) else None,
        held=held,
    )


def _holds(op: str, a: float | str, b: float | str) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        same = isinstance(a, str) and isinstance(b, str) and a == b
        return same if op == "==" else (not same) if op == "!=" else False
    if math.isnan(a) or math.isnan(b):
        return False
    return bool(_COMPARE[op](a, b))


def _value(value: object) -> float | str | None:
    """A metric as the criterion sees it: a bool counts as 1 / 0; strings stay strings."""
    if isinstance(value, (bool, int, float)):
        return float(value)
    if isinstance(value, str):
        return value
    return None


def _judge(expr: Expr, values: dict[str, float | str], outer: int) -> tuple[Tri, str]:
    prec = _PRECEDENCE[expr.kind]
    if isinstance(expr, Compare):
        left, right = _side(expr.left, values), _side(expr.right, values)
        text = f"{left[1]} {expr.op} {right[1]}"
        if left[0] is None or right[0] is None:
            return "inconclusive", text
        if _holds(expr.op, left[0], right[0]):
            return "pass", text
        return "fail", FAILED_MARK + text
    if isinstance(expr, Not):
        verdict, text = _judge(expr.item, values, prec)
        flipped: Tri = {"pass": "fail", "fail": "pass"}.get(verdict, "inconclusive")  # type: ignore[assignment]
        return flipped, _paren(f"not {text}", prec, outer)
    parts = [_judge(item, values, prec + 1 if item.kind == expr.kind else prec) for item in expr.items]
    verdicts = {v for v, _ in parts}
    decisive: Tri = "fail" if expr.kind == "and" else "pass"
    if decisive in verdicts:
        verdict: Tri = decisive
    elif "inconclusive" in verdicts:
        verdict = "inconclusive"
    else:
        verdict = "pass" if expr.kind == "and" else "fail"
    text = f" {expr.kind} ".join(t for _, t in parts)
    return verdict, _paren(text, prec, outer)


def _paren(text: str, prec: int, outer: int) -> str:
    return f"({text})" if prec < outer else text


def _side(node: MetricRef | Number | Text, values: dict[str, float | str]) -> tuple[float | str | None, str]:
    if isinstance(node, (Number, Text)):
        return node.value, _operand_text(node)
    if node.name in values:
        value = values[node.name]
        shown = f'"{format_value(value)}"' if isinstance(value, str) else format_value(value)
        return value, f"{node.name} {shown}"
    return None, f"{node.name} (missing)"
