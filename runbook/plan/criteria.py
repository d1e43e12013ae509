"""The `Pass:` expression language: parse to a tree, evaluate three-valued. Never `eval`.

Grammar (lowest precedence first)::

    expr    := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := sum (OP sum)*          a sum alone must be a parenthesized condition
    sum     := term (("+" | "-") term)*
    term    := unary (("*" | "/") unary)*
    unary   := ("-" | "+") unary | atom
    atom    := METRIC | NUMBER | STRING | "(" expr ")"
    OP      := "<" | "<=" | ">" | ">=" | "==" | "!="

METRIC names start with a letter or `_` and may contain letters, digits, `_`, `.` and `-`
(`accept_len`, `val_acc_0`, `step-2.loss`, `cfg.lr`), so subtraction needs spaces around its `-`
(`a - b`; `a-b` is one name, like `step-2`). `phase-0.baseline_acc` (a phase's label or id, a
dot, a metric name) names a metric of another phase's latest run: `runbook.plan.crossref` resolves it.
NUMBER is a decimal literal with optional exponent (`1.5`, `3`, `2e-4`; a sign before it is unary
minus). STRING is `"..."` or `'...'` (no escapes), compared with string metrics (`optimizer ==
"adamw"`); it cannot take part in arithmetic. A chained comparison `1 <= x < 3` means
`1 <= x and x < 3`. The whole expression may be wrapped in backticks, as it usually is in a plan.
Parentheses, `not` and unary minus nest at most 64 deep (deeper is an error, never a
RecursionError); a sum or product is one flat node however long.

Evaluation is three-valued (Kleene logic): a comparison that needs a metric no step produced is
`inconclusive`; `and` is `fail` if any side fails, `or` is `pass` if any side passes, otherwise
an unknown side makes the result `inconclusive`. A NaN value fails every comparison, and so does
arithmetic that has no number for an answer: a division by zero, or a string metric in a sum.
Arithmetic results are rounded to 12 significant digits, so `0.9 - 0.8 >= 0.1` holds.
A string equals only the same string (`==` / `!=`); an ordering (`<`, `>=`, ...) with a string fails.

The explanation marks each comparison that does not hold with `✗ ` (`✗ gain 0.08 >= 0.1`) and shows
arithmetic with each metric's value and the result: `(mlp_acc 0.93 - phase-0.baseline_acc 0.88 =
0.05) >= 0.1`. `Judgement.comparisons` gives every comparison as data (metric or expression,
operator, value, threshold, held, and the metrics an expression read).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel

from runbook.formatting import format_value
from runbook.model import (
    Arith,
    ArithOp,
    BoolOp,
    Compare,
    CompareOp,
    Expr,
    MetricRef,
    Neg,
    Not,
    Number,
    Operand,
    Text,
)

__all__ = [
    "FAILED_MARK",
    "Comparison",
    "CriterionError",
    "Judgement",
    "evaluate",
    "metric_names",
    "name_columns",
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
    # the metric compared, or the expression (`mlp_acc - phase-0.baseline_acc`) when that side is
    # arithmetic; None when both sides are constants
    metric: str | None
    op: CompareOp
    value: float | str | None  # the metric's value; None when no step wrote it
    threshold: float | str | None  # the number (or the other metric's value) it is compared with
    threshold_metric: str | None = None  # the other metric, when both sides are metrics
    held: bool | None  # None: a metric is missing
    operands: dict[str, float | str | None] = {}  # the metrics an arithmetic side read (None: missing)


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
        (?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(?![A-Za-z0-9_.])
      | (?P<str>"[^"]*"|'[^']*')
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:[.-][A-Za-z0-9_]+)*)
      | (?P<op><=|>=|==|!=|<|>)
      | (?P<arith>[-+*/])
      | (?P<lpar>\()
      | (?P<rpar>\))
      | (?P<bad>\S)
    )
    """,
    re.VERBOSE,
)
_KEYWORDS = frozenset({"and", "or", "not"})
MAX_DEPTH = 64  # parentheses, `not` and unary minus nested deeper are an error
_HINTS = {
    '"': 'a string needs its closing quote: "adamw"',
    "'": "a string needs its closing quote: 'adamw'",
    "=": "use '==' to compare",
    "&": "use 'and'",
    "|": "use 'or'",
    "!": "use 'not' or '!='",
    "^": "there is no power operator; write x * x",
    "%": "there is no remainder operator",
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
            hint = _HINTS.get(word, "expected a metric name, a number, a comparison, arithmetic (+ - * /), "
                                    "and/or/not or parentheses")
            raise CriterionError(f"unexpected {word!r}: {hint}", col)
        if kind == "name" and word in _KEYWORDS:
            kind = word
        tokens.append(_Tok(kind, word, col))
    tokens.append(_Tok("end", "", base_col + len(text)))
    return tokens


# ---- parser --------------------------------------------------------------------------------

_CONDITIONS = (Compare, BoolOp, Not)  # the nodes of Expr; the others are values (Operand)
# a token's text as the tree's operator (the tokenizer's `op` and `arith` groups match only these)
_COMPARE_OPS: dict[str, CompareOp] = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}
_ARITH_OPS: dict[str, ArithOp] = {"+": "+", "-": "-", "*": "*", "/": "/"}


class _Parser:
    """Recursive descent over the token list. Inner nodes are built with `model_construct`: the
    parser only ever builds well-typed trees, and skipping validation keeps a 500-phase plan fast.
    The leaves (a name, a float) use the validating constructors, which pydantic runs faster than
    `model_construct` for models this small.

    Conditions (comparisons and their and/or/not) and values (metrics, literals, arithmetic) share
    the parentheses, so each level returns either; where the other kind is needed, the error names
    the column: a value must be followed by a comparison, arithmetic or `)`, and a condition is
    never an operand."""

    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0

    def deeper(self, tok: _Tok) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CriterionError(
                f"nested more than {MAX_DEPTH} deep (parentheses, `not` and unary minus); write it flatter", tok.col
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
        return self.condition(expr, tok)

    def condition(self, node: Expr | Operand, nxt: _Tok) -> Expr:
        """`node` where a condition is needed: a value alone is an error at the token after it."""
        if isinstance(node, _CONDITIONS):
            return node
        what = "the end" if nxt.kind == "end" else repr(nxt.text)
        raise CriterionError(
            f"expected a comparison (< <= > >= == !=) after {_operand_text(node)!r}, found {what}", nxt.col
        )

    def parse_or(self) -> Expr | Operand:
        return self.chain("or", self.parse_and)

    def parse_and(self) -> Expr | Operand:
        return self.chain("and", self.parse_not)

    def chain(self, kind: Literal["or", "and"], operand: Callable[[], Expr | Operand]) -> Expr | Operand:
        """`operand (kind operand)*`: one flat BoolOp of the conditions, or the lone operand."""
        first = operand()
        if self.peek().kind != kind:
            return first
        items = [self.condition(first, self.peek())]
        while self.peek().kind == kind:
            self.take()
            items.append(self.condition(operand(), self.peek()))
        return BoolOp.model_construct(kind=kind, items=items)

    def parse_not(self) -> Expr | Operand:
        if self.peek().kind == "not":
            self.deeper(self.take())
            item = self.condition(self.parse_not(), self.peek())
            self.depth -= 1
            return Not.model_construct(kind="not", item=item)
        return self.parse_compare()

    def parse_compare(self) -> Expr | Operand:
        start = self.peek()
        left = self.parse_sum()
        if self.peek().kind != "op":
            nxt = self.peek()
            if not isinstance(left, _CONDITIONS) and nxt.kind != "rpar":
                self.condition(left, nxt)  # raises: a value alone
            return left
        side = self.value(left, start)
        compares: list[Compare] = []
        while self.peek().kind == "op":
            op = _COMPARE_OPS[self.take().text]
            at = self.peek()
            right = self.value(self.parse_sum(), at)
            compares.append(Compare.model_construct(kind="compare", left=side, op=op, right=right))
            side = right
        return compares[0] if len(compares) == 1 else BoolOp.model_construct(kind="and", items=list(compares))

    def value(self, node: Expr | Operand, at: _Tok) -> Operand:
        """`node` where a value is needed (a side of a comparison, an arithmetic operand)."""
        if isinstance(node, _CONDITIONS):
            raise CriterionError(
                "a condition cannot be compared or computed with; compare values: `(a + b) / 2 >= 1`", at.col
            )
        return node

    def parse_sum(self) -> Expr | Operand:
        return self.parse_level(("+", "-"), self.parse_term)

    def parse_term(self) -> Expr | Operand:
        return self.parse_level(("*", "/"), self.parse_unary)

    def parse_level(self, ops: tuple[str, str], operand: Callable[[], Expr | Operand]) -> Expr | Operand:
        start = self.peek()
        first = operand()
        if not (self.peek().kind == "arith" and self.peek().text in ops):
            return first
        items = [self.number(first, start)]
        signs: list[ArithOp] = []
        while self.peek().kind == "arith" and self.peek().text in ops:
            signs.append(_ARITH_OPS[self.take().text])
            at = self.peek()
            items.append(self.number(operand(), at))
        return Arith.model_construct(kind="arith", items=items, ops=signs)

    def number(self, node: Expr | Operand, at: _Tok) -> Operand:
        value = self.value(node, at)
        if isinstance(value, Text):
            raise CriterionError("a string cannot take part in arithmetic", at.col)
        return value

    def parse_unary(self) -> Expr | Operand:
        tok = self.peek()
        if tok.kind == "arith" and tok.text in "+-":
            self.deeper(self.take())
            at = self.peek()
            item = self.number(self.parse_unary(), at)
            self.depth -= 1
            if isinstance(item, Number) and item.text is not None and item.text[:1] not in "+-":
                value = -item.value if tok.text == "-" else item.value
                return Number(kind="number", value=value, text=tok.text + item.text)
            return item if tok.text == "+" else Neg.model_construct(kind="neg", item=item)
        return self.parse_atom()

    def parse_atom(self) -> Expr | Operand:
        tok = self.peek()
        if tok.kind == "lpar":
            self.deeper(self.take())
            inner = self.parse_or()
            close = self.peek()
            if close.kind != "rpar":
                if not isinstance(inner, _CONDITIONS):
                    self.condition(inner, close)  # raises: "expected a comparison after ..."
                raise CriterionError("missing ')': a '(' is never closed", close.col)
            self.take()
            self.depth -= 1
            return inner
        self.take()
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


def name_columns(text: str) -> list[tuple[str, int]]:
    """Every metric name of a `Pass:` text with its 1-based column, in order (for messages about
    one name, such as a reference to a phase that does not exist). [] when it does not tokenize."""
    inner, offset = strip_backticks(text)
    try:
        tokens = _tokenize(inner, offset + 1)
    except CriterionError:
        return []
    return [(tok.text, tok.col) for tok in tokens if tok.kind == "name"]


# ---- inspection and rendering --------------------------------------------------------------


def metric_names(expr: Expr) -> list[str]:
    """The metric names the expression reads, in order of first appearance."""
    names: list[str] = []
    for node in _operands(expr):
        for ref in _refs(node):
            if ref.name not in names:
                names.append(ref.name)
    return names


def _refs(node: Operand) -> list[MetricRef]:
    if isinstance(node, MetricRef):
        return [node]
    if isinstance(node, Arith):
        return [ref for item in node.items for ref in _refs(item)]
    if isinstance(node, Neg):
        return _refs(node.item)
    return []


def _operands(expr: Expr) -> list[Operand]:
    return [side for leaf in _leaves(expr) for side in (leaf.left, leaf.right)]


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


def _operand_text(node: Operand) -> str:
    if isinstance(node, MetricRef):
        return node.name
    if isinstance(node, Text):
        return '"' + node.value + '"' if '"' not in node.value else "'" + node.value + "'"
    if isinstance(node, Arith):
        parts = [_wrapped(node.items[0], _operand_text(node.items[0]), node, 0)]
        for i, (op, item) in enumerate(zip(node.ops, node.items[1:], strict=True), 1):
            parts += [op, _wrapped(item, _operand_text(item), node, i)]
        return " ".join(parts)
    if isinstance(node, Neg):
        return "-" + _wrapped(node.item, _operand_text(node.item), None, 0)
    return node.text if node.text is not None else format_value(node.value)


def _additive(node: Arith) -> bool:
    return node.ops[0] in "+-"


def _wrapped(node: Operand, text: str, outer: Arith | None, index: int) -> str:
    """An operand's text inside arithmetic, with the parentheses its place needs: a sum inside a
    product, anything after the first place of its own level (`a - (b - c)`), any sum or product
    under unary minus."""
    if not isinstance(node, Arith):
        return text
    if outer is None or (_additive(node) and not _additive(outer)) or (index > 0 and _additive(node) == _additive(outer)):
        return f"({text})"
    return text


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
    """Judge `expr` against `metrics`: pass, fail, or inconclusive when a needed metric is missing.

    References to other phases (`phase-0.acc`) are looked up in `metrics` like any name: the
    caller puts their values there (runbook/plan/crossref.py)."""
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
    if not _refs(subject) and _refs(other):
        subject, op, other = other, _FLIP[op], subject
    metric = _operand_text(subject) if _refs(subject) else None
    operands: dict[str, float | str | None] = {}
    for node in (subject, other):
        if isinstance(node, (Arith, Neg)):
            operands.update({ref.name: values.get(ref.name) for ref in _refs(node)})
    return Comparison(
        text=f"{left[1]} {leaf.op} {right[1]}",
        metric=metric,
        op=op,
        value=_side(subject, values)[0] if metric else None,
        threshold=_side(other, values)[0],
        threshold_metric=other.name if isinstance(other, MetricRef) else None,
        held=held,
        operands=operands,
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
        flipped: Tri = "fail" if verdict == "pass" else "pass" if verdict == "fail" else "inconclusive"
        return flipped, _paren(f"not {text}", prec, outer)
    parts = [_judge(item, values, prec + 1 if item.kind == expr.kind else prec) for item in expr.items]
    verdicts = {v for v, _ in parts}
    decisive: Tri = "fail" if expr.kind == "and" else "pass"
    if decisive in verdicts:
        overall: Tri = decisive
    elif "inconclusive" in verdicts:
        overall = "inconclusive"
    else:
        overall = "pass" if expr.kind == "and" else "fail"
    text = f" {expr.kind} ".join(t for _, t in parts)
    return overall, _paren(text, prec, outer)


def _paren(text: str, prec: int, outer: int) -> str:
    return f"({text})" if prec < outer else text


def _side(node: Operand, values: dict[str, float | str]) -> tuple[float | str | None, str]:
    """A comparison side's value (None: a metric is missing) and its text for the explanation."""
    if isinstance(node, (Arith, Neg)):
        value, text, problem = _compute(node, values)
        if value is None:
            return None, f"({text})"
        return value, f"({text} = {problem or format_value(value)})"
    if isinstance(node, (Number, Text)):
        return node.value, _operand_text(node)
    if node.name in values:
        metric = values[node.name]
        shown = f'"{format_value(metric)}"' if isinstance(metric, str) else format_value(metric)
        return metric, f"{node.name} {shown}"
    return None, f"{node.name} (missing)"


def _compute(node: Operand, values: dict[str, float | str]) -> tuple[float | None, str, str | None]:
    """(value, text, problem) of a value node. None: a metric is missing. NaN with a problem
    ("division by zero", "x is not a number"): there is no number, and every comparison fails."""
    if isinstance(node, Arith):
        first = _compute(node.items[0], values)
        texts = [_wrapped(node.items[0], first[1], node, 0)]
        acc, problem, missing = first[0], first[2], first[0] is None
        for i, (op, item) in enumerate(zip(node.ops, node.items[1:], strict=True), 1):
            value, text, sub_problem = _compute(item, values)
            texts += [op, _wrapped(item, text, node, i)]
            problem = problem or sub_problem
            if value is None or acc is None:
                missing = True
                continue
            if op == "/" and value == 0:
                problem = problem or "division by zero"
                acc = math.nan
            else:
                acc = acc + value if op == "+" else acc - value if op == "-" else acc * value if op == "*" else acc / value
        if acc is not None and math.isfinite(acc):
            acc = float(f"{acc:.12g}")  # decimal noise off: 0.9 - 0.8 is 0.1, not 0.09999999999999998
        return (None if missing else acc), " ".join(texts), problem
    if isinstance(node, Neg):
        value, text, problem = _compute(node.item, values)
        return (None if value is None else -value), "-" + _wrapped(node.item, text, None, 0), problem
    side, text = _side(node, values)
    if isinstance(side, str):
        return math.nan, text, f"{node.name if isinstance(node, MetricRef) else text} is not a number"
    return side, text, None

