"""`Pass:` arithmetic (+ - * /, parentheses) and references to other phases' metrics, still parsed
without eval: rendering, evaluation, division by zero, the explanation, errors with columns."""

from __future__ import annotations

import math

import pytest
from helpers import assert_criterion_error, run_record

from runbook.model import Arith, Compare, MetricRef, Neg, Number
from runbook.plan.criteria import CriterionError, evaluate, metric_names, parse_criterion, render


@pytest.mark.parametrize(
    "text,canonical",
    [
        ("a+b>1", "a + b > 1"),
        ("a - b * c >= 0.1", "a - b * c >= 0.1"),
        ("(a + b) / 2 >= 1", "(a + b) / 2 >= 1"),
        ("a - (b - c) > 0", "a - (b - c) > 0"),
        ("-a < 3", "-a < 3"),
        ("x >= -3", "x >= -3"),
        ("- (a + b) < 0", "-(a + b) < 0"),
        ("mlp_acc - phase-0.baseline_acc >= 0.1", "mlp_acc - phase-0.baseline_acc >= 0.1"),
        ("((a + b) > 1 and c < 2)", "a + b > 1 and c < 2"),
        ("(a) > 1", "a > 1"),
        ("1 < a * 2 <= 4", "1 < a * 2 and a * 2 <= 4"),
    ],
)
def test_arithmetic_renders_canonically(text: str, canonical: str) -> None:
    assert render(parse_criterion(text)) == canonical
    assert render(parse_criterion(canonical)) == canonical


def test_tree_shape_and_precedence() -> None:
    expr = parse_criterion("a + b * c - -d >= 1")
    assert isinstance(expr, Compare)
    left = expr.left
    assert isinstance(left, Arith) and left.ops == ["+", "-"]
    assert left.items[0] == MetricRef(name="a")
    assert isinstance(left.items[1], Arith) and left.items[1].ops == ["*"]
    assert isinstance(left.items[2], Neg) and left.items[2].item == MetricRef(name="d")
    assert Compare.model_validate_json(expr.model_dump_json()) == expr  # JSON round trip
    assert isinstance(parse_criterion("x > -3").right, Number)  # a signed literal stays a number
    assert metric_names(parse_criterion("(a + b) / c > d and a > 1")) == ["a", "b", "c", "d"]


P, F, U = "pass", "fail", "inconclusive"


@pytest.mark.parametrize(
    "text,metrics,verdict",
    [
        ("a + b * c == 7", {"a": 1, "b": 2, "c": 3}, P),  # * before +
        ("(a + b) * c == 9", {"a": 1, "b": 2, "c": 3}, P),
        ("a - b - c == -4", {"a": 1, "b": 2, "c": 3}, P),  # left to right
        ("a / b / c == 0.5", {"a": 6, "b": 2, "c": 6}, P),
        ("-a * 2 == -4", {"a": 2}, P),
        ("a - b >= 0.1", {"a": 0.9, "b": 0.8}, P),  # no decimal noise: 0.9 - 0.8 is 0.1
        ("a / b > 1", {"a": 1, "b": 0}, F),  # division by zero: no number, every comparison fails
        ("a / b != 1", {"a": 1, "b": 0}, F),
        ("a / b > 1", {"a": 1}, U),  # a missing metric: inconclusive
        ("a / b > 1 or c > 0", {"a": 1, "b": 0, "c": 1}, P),
        ("s + 1 > 0", {"s": "adamw"}, F),  # a string metric in arithmetic: no number
        ("a * 1e308 * 10 > 1", {"a": 1}, P),  # overflow is infinity, not an error
    ],
)
def test_arithmetic_evaluates_three_valued(text: str, metrics: dict, verdict: str) -> None:
    assert evaluate(parse_criterion(text), metrics).verdict == verdict


def test_the_explanation_shows_each_operand_and_the_result() -> None:
    j = evaluate(parse_criterion("`mlp_acc - phase-0.baseline_acc >= 0.1`"),
                 {"mlp_acc": 0.93, "phase-0.baseline_acc": 0.88})
    assert j.verdict == "fail"
    assert j.explanation == "✗ (mlp_acc 0.93 - phase-0.baseline_acc 0.88 = 0.05) >= 0.1"
    (c,) = j.comparisons
    assert (c.metric, c.op, c.value, c.threshold, c.held) == ("mlp_acc - phase-0.baseline_acc", ">=", 0.05, 0.1, False)
    assert c.operands == {"mlp_acc": 0.93, "phase-0.baseline_acc": 0.88}
    zero = evaluate(parse_criterion("gain / base >= 1.1"), {"gain": 0.5, "base": 0})
    assert zero.explanation == "✗ (gain 0.5 / base 0 = division by zero) >= 1.1"
    assert math.isnan(zero.comparisons[0].value)
    missing = evaluate(parse_criterion("1.5 <= a + b"), {"a": 1})
    assert missing.explanation == "1.5 <= (a 1 + b (missing))" and missing.missing == ["b"]
    # the expression reads first, with the operator flipped
    assert (missing.comparisons[0].metric, missing.comparisons[0].op) == ("a + b", ">=")


@pytest.mark.parametrize(
    "text,col,fragment",
    [
        ("a + > 1", 5, "expected a metric name or a number, found '>'"),
        ("a +", 4, "ends too early"),
        ("a + b", 6, "expected a comparison (< <= > >= == !=) after 'a + b', found the end"),
        ("(a + b)", 8, "after 'a + b'"),
        ("(a) and b > 1", 5, "after 'a', found 'and'"),
        ("not a", 6, "after 'a'"),
        ("(a > 1) + 1 > 2", 1, "a condition cannot be compared"),
        ("a > (b > 1)", 5, "a condition cannot be compared"),
        ('a * "x" > 1', 5, "a string cannot take part in arithmetic"),
        ("a ^ 2 > 1", 3, "no power operator"),
        ("a % 2 > 1", 3, "no remainder operator"),
        ("(a + 1 > 2", 11, "missing ')'"),
        ("`a * * b > 1`", 6, "found '*'"),
    ],
)
def test_arithmetic_errors_name_the_column(text: str, col: int, fragment: str) -> None:
    assert_criterion_error(text, col, fragment)


def test_a_long_sum_is_flat_and_a_deep_unary_chain_is_bounded() -> None:
    expr = parse_criterion(" + ".join(["a"] * 5000) + " >= 5000")
    assert evaluate(expr, {"a": 1}).verdict == "pass"  # no RecursionError: one flat node
    assert len(render(expr)) > 5000
    with pytest.raises(CriterionError, match="nested more than 64 deep"):
        parse_criterion("-" * 100 + "a > 1")
    assert evaluate(parse_criterion("- " * 63 + "a < 0"), {"a": 1}).verdict == "pass"  # 63 minus signs


def test_references_resolve_to_the_latest_judged_run_of_the_phase_and_say_why_when_missing() -> None:
    from runbook.model import RunRecord
    from runbook.plan import crossref
    from runbook.plan.parse import parse_plan

    plan, problems = parse_plan(
        "---\nrunbook: 1\n---\n\n## Phase 0: Base {#base}\n\nSteps:\n- [ ] a: `true`\n\n"
        "## Phase 1: Beat it\n\nSteps:\n- [ ] b: `true`\n\nPass: `acc - base.acc >= 0.1 and acc / Base.loss > 1`\n",
        "p.md")
    assert plan is not None and not problems, problems
    phase = plan.phases[1]

    def run(run_id: str, verdict: str, **metrics: float) -> RunRecord:
        return run_record(run_id=run_id, plan="p.md", plan_blob="0", phase="base", phase_label="0",
                         phase_text_hash="0", started=run_id, verdict=verdict, metrics=metrics)

    none = crossref.resolve(plan, phase, phase.criterion.expr, [])
    assert none.values == {} and none.missing == {"base.acc": "Phase 0 has no judged run yet",
                                                  "Base.loss": "Phase 0 has no judged run yet"}
    runs = [run("1", "fail", acc=0.5, loss=2.0), run("2", "pass", accs=0.6, loss=0.5), run("3", "error", acc=0.9)]
    refs = crossref.resolve(plan, phase, phase.criterion.expr, runs)
    # the error run does not count; the latest judged run has no `acc`: missing, with a near miss
    assert refs.values == {"Base.loss": 0.5} and refs.runs == {"base": "2"}
    assert refs.missing == {"base.acc": "Phase 0's latest run (2) has no acc (did you mean accs?)"}
    from runbook.plan.criteria import evaluate

    j = evaluate(phase.criterion.expr, {"acc": 0.9, **refs.values})
    assert j.verdict == "inconclusive" and j.missing == ["base.acc"]
    ok = crossref.resolve(plan, phase, phase.criterion.expr, [*runs, run("4", "inconclusive", acc=0.7, loss=0.6)])
    assert evaluate(phase.criterion.expr, {"acc": 0.8, **ok.values}).verdict == "pass"  # 0.8 - 0.7 >= 0.1, 0.8 / 0.6 > 1
    assert evaluate(phase.criterion.expr, {"acc": 0.75, **ok.values}).verdict == "fail"


def test_a_phase_with_an_explicit_id_is_named_by_it_and_the_error_says_so() -> None:
    from runbook.plan.parse import parse_plan

    text = ("---\nrunbook: 1\n---\n\n## Phase 0: Base {#base}\n\nSteps:\n- [ ] a: `true`\n\n"
            "## Phase 1: Beat it\n\nSteps:\n- [ ] b: `true`\n\nPass: acc > phase-0.acc\n")
    _, problems = parse_plan(text, "p.md")
    assert [(p.line, p.col, p.message) for p in problems] == [
        (15, 13, "Pass: `phase-0.acc`: this plan has no phase `phase-0` (Phase 0's id is `base`: write `base.acc`)")]
