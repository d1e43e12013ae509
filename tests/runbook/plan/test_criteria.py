"""The `Pass:` language: parsing, rendering, three-valued evaluation, errors. Never eval()."""

from __future__ import annotations

import math

import pytest
from helpers import assert_criterion_error
from hypothesis import given, settings
from hypothesis import strategies as st

from runbook.model import BoolOp, Compare, MetricRef, Not, Number
from runbook.plan.criteria import CriterionError, evaluate, metric_names, parse_criterion, render


def test_parse_tree() -> None:
    expr = parse_criterion("`accept_len >= 1.5 and train_loss < 4.0`")
    assert isinstance(expr, BoolOp) and expr.kind == "and"
    first, second = expr.items
    assert isinstance(first, Compare) and first.op == ">=" and first.left == MetricRef(name="accept_len")
    assert isinstance(first.right, Number) and first.right.value == 1.5
    assert second.op == "<" and second.right.value == 4.0
    # the tree is a plain pydantic model: it survives a JSON round trip
    assert BoolOp.model_validate_json(expr.model_dump_json()) == expr


@pytest.mark.parametrize(
    "text,canonical",
    [
        ("a > 1", "a > 1"),
        ("``a>1``", "a > 1"),
        ("a>=1 and b<=2 or c==3", "a >= 1 and b <= 2 or c == 3"),
        ("a > 1 and (b < 2 or c != 3)", "a > 1 and (b < 2 or c != 3)"),
        ("((a > 1))", "a > 1"),
        ("not a > 1 and b < 2", "not a > 1 and b < 2"),
        ("not (a > 1 and b < 2)", "not (a > 1 and b < 2)"),
        ("not not a > 1", "not not a > 1"),
        ("step-2.loss <= 3", "step-2.loss <= 3"),
        ("val_acc_0 > -0.5", "val_acc_0 > -0.5"),
        ("x < 2e-4", "x < 2e-4"),
        ("1 <= x < 3", "1 <= x and x < 3"),
        ("a < b", "a < b"),
        ("(a > 1 or b > 1) and (c > 1 or d > 1)", "(a > 1 or b > 1) and (c > 1 or d > 1)"),
    ],
)
def test_render(text: str, canonical: str) -> None:
    expr = parse_criterion(text)
    assert render(expr) == canonical
    assert render(parse_criterion(canonical)) == canonical


def test_metric_names_in_order_without_repeats() -> None:
    assert metric_names(parse_criterion("b > 1 and (a < 2 or b < 3) and step-1.c == 0")) == ["b", "a", "step-1.c"]


@pytest.mark.parametrize(
    "text,col,fragment",
    [
        ("", 1, "empty criterion"),
        ("``", 1, "stray backtick"),
        ("accept_len", 11, "expected a comparison"),
        ("accept_len >=", 14, "ends too early"),
        ("a = 1", 3, "use '=='"),
        ("a > 1 && b > 2", 7, "use 'and'"),
        ("a > 1 b > 2", 7, "join conditions"),
        ("(a > 1", 7, "missing ')'"),
        ("a > 1)", 6, "unbalanced ')'"),
        ("a > and", 5, "keyword 'and'"),
        ("__import__('os').system('true') == 0", 17, "unexpected"),  # 'os' is a string literal
        ("a > 1.5e", 5, "unexpected '1'"),
        ("`a > 1` and b", 1, "stray backtick"),
        ("  `a >`", 7, "ends too early"),
    ],
)
def test_errors_name_the_column(text: str, col: int, fragment: str) -> None:
    assert_criterion_error(text, col, fragment)


def test_explanation_shows_values_next_to_comparisons() -> None:
    j = evaluate(parse_criterion("accept_len >= 1.5 and train_loss < 4.0"), {"accept_len": 2.41, "train_loss": 1.93, "x": 9})
    assert j.verdict == "pass"
    assert j.explanation == "accept_len 2.41 >= 1.5 and train_loss 1.93 < 4.0"
    assert j.values == {"accept_len": 2.41, "train_loss": 1.93}
    assert j.missing == []


P, F, U = "pass", "fail", "inconclusive"


@pytest.mark.parametrize(
    "text,metrics,verdict",
    [
        ("a > 1", {"a": 2}, P),
        ("a > 1", {"a": 1}, F),
        ("a > 1", {}, U),
        ("a > 1 and b > 1", {"a": 0}, F),  # fail wins over unknown in `and`
        ("a > 1 and b > 1", {"a": 2}, U),
        ("a > 1 or b > 1", {"a": 2}, P),  # pass wins over unknown in `or`
        ("a > 1 or b > 1", {"a": 0}, U),
        ("a > 1 or b > 1", {"a": 0, "b": 0}, F),
        ("not a > 1", {"a": 0}, P),
        ("not a > 1", {}, U),
        ("a == 1", {"a": True}, P),
        ("a != 1", {"a": math.nan}, F),  # NaN fails every comparison
        ("a < 1", {"a": math.nan}, F),
        ("a < b", {"a": 1, "b": 2}, P),
        ("a > 1", {"a": "3"}, F),  # a string metric: an ordering with it fails
        ('a == "adamw"', {"a": "adamw"}, P),
        ("a == 'adamw'", {"a": "adamw"}, P),
        ('a != "adamw"', {"a": "sgd"}, P),
        ('a == "1"', {"a": 1}, F),  # a number is not a string
        ('a != "1"', {"a": 1}, P),
        ("a == b", {"a": "x", "b": "x"}, P),
        ('a == "x"', {}, U),
        ("flag == 1", {"flag": True}, P),  # a bool counts as 1 / 0
        ("step-2.loss < 1", {"step-2.loss": 0.5}, P),
        ("1 <= x < 3", {"x": 3}, F),
    ],
)
def test_three_valued_evaluation(text: str, metrics: dict, verdict: str) -> None:
    assert evaluate(parse_criterion(text), metrics).verdict == verdict


def test_missing_metrics_are_listed_and_explained() -> None:
    j = evaluate(parse_criterion("accept_len >= 1.5 and (train_loss < 4 or not val_loss > 9)"), {"train_loss": 5})
    assert j.verdict == "inconclusive"
    assert j.missing == ["accept_len", "val_loss"]
    assert j.explanation == "accept_len (missing) >= 1.5 and (✗ train_loss 5 < 4 or not val_loss (missing) > 9)"


def test_trees_built_in_code_render_too() -> None:
    expr = Not(item=Compare(left=MetricRef(name="x"), op="<", right=Number(value=4.0)))
    assert render(expr) == "not x < 4"


# ---- property: our evaluation agrees with Python's own boolean semantics -----------------

NAMES = ["a", "b", "c"]
operand = st.one_of(st.sampled_from(NAMES), st.integers(-3, 3).map(str))
compare = st.tuples(operand, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), operand).map(" ".join)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(["and", "or"]), children).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        children.map(lambda c: f"not {c}"),
    )


exprs = st.recursive(compare, _combine, max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(exprs, st.fixed_dictionaries({n: st.integers(-3, 3) for n in NAMES}))
def test_agrees_with_python_when_all_metrics_exist(text: str, metrics: dict[str, int]) -> None:
    expected = eval(text, {"__builtins__": {}}, dict(metrics))  # the test's oracle; the product never evals
    verdict = evaluate(parse_criterion(text), metrics).verdict
    assert verdict == ("pass" if expected else "fail")
    assert render(parse_criterion(render(parse_criterion(text)))) == render(parse_criterion(text))


@settings(max_examples=200, deadline=None)
@given(exprs, st.dictionaries(st.sampled_from(NAMES), st.integers(-3, 3)))
def test_inconclusive_only_when_the_missing_metric_could_change_the_outcome(text: str, metrics: dict[str, int]) -> None:
    expr = parse_criterion(text)
    verdict = evaluate(expr, metrics).verdict
    missing = [n for n in metric_names(expr) if n not in metrics]
    outcomes = set()
    for fill in range(-3, 4):
        full = {**metrics, **{n: fill for n in missing}}
        outcomes.add(evaluate(expr, full).verdict)
    if not missing:
        assert verdict in ("pass", "fail")
    elif verdict != "inconclusive":
        # a decided verdict with metrics missing must hold whatever the missing values are
        assert outcomes == {verdict}


def test_failed_comparisons_are_marked_and_given_as_data() -> None:
    j = evaluate(parse_criterion("gain >= 0.10 and 1.5 <= accept_len and loss < ref"), {"gain": 0.08, "accept_len": 2, "loss": 3, "ref": 2})
    assert j.verdict == "fail"
    assert j.explanation == "✗ gain 0.08 >= 0.10 and 1.5 <= accept_len 2 and ✗ loss 3 < ref 2"
    gain, accept, loss = j.comparisons
    assert (gain.metric, gain.op, gain.value, gain.threshold, gain.held) == ("gain", ">=", 0.08, 0.1, False)
    # a metric on the right reads first, with the operator flipped
    assert (accept.metric, accept.op, accept.value, accept.threshold, accept.held) == ("accept_len", ">=", 2, 1.5, True)
    assert (loss.metric, loss.threshold_metric, loss.threshold, loss.held) == ("loss", "ref", 2, False)
    unknown = evaluate(parse_criterion("a > 1"), {}).comparisons[0]
    assert unknown.held is None and unknown.value is None and "✗" not in unknown.text


@pytest.mark.parametrize("depth", [65, 300, 5000])
def test_nesting_deeper_than_the_limit_is_an_error_not_a_recursion_error(depth: int) -> None:
    for text in ("(" * depth + "a > 1" + ")" * depth, "not " * depth + "a > 1", "(not " * depth + "a > 1" + ")" * depth):
        with pytest.raises(CriterionError, match="nested more than 64 deep"):
            parse_criterion(text)


def test_nesting_up_to_the_limit_parses_evaluates_and_renders() -> None:
    from runbook.plan.criteria import render

    expr = parse_criterion("(" * 64 + "a > 1" + ")" * 64)
    assert evaluate(expr, {"a": 2}).verdict == "pass" and render(expr) == "a > 1"
    assert evaluate(parse_criterion("not " * 64 + "a > 1"), {"a": 2}).verdict == "pass"


def test_string_metrics_are_shown_quoted_in_the_explanation() -> None:
    j = evaluate(parse_criterion('optimizer == "adamw" and lr < 0.1'), {"optimizer": "sgd", "lr": 0.01})
    assert j.verdict == "fail" and j.explanation == '✗ optimizer "sgd" == "adamw" and lr 0.01 < 0.1'
    assert j.comparisons[0].value == "sgd" and j.comparisons[0].threshold == "adamw"


def test_unclosed_string_literal_names_the_fix() -> None:
    with pytest.raises(CriterionError, match="closing quote") as info:
        parse_criterion('opt == "adamw')
    assert info.value.col == 8
