"""docs/plan-format.md is the spec: every full plan example in it parses without a problem."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runbook.plan.criteria import evaluate
from runbook.plan.parse import parse_plan
from runbook.plan.resolve import resolve_command

DOC = (Path(__file__).resolve().parents[3] / "docs" / "plan-format.md").read_text()
EXAMPLES = [b for b in re.findall(r"^````markdown\n(.*?)^````$", DOC, re.S | re.M) if b.startswith("---")]


def test_the_spec_has_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_doc_example_is_a_clean_plan(index: int) -> None:
    plan, problems = parse_plan(EXAMPLES[index], f"example{index}.md")
    assert plan is not None
    assert problems == []
    assert all(step.command for phase in plan.phases for step in phase.steps)


def test_first_example_reads_as_the_spec_says() -> None:
    plan, _ = parse_plan(EXAMPLES[0], "example0.md")
    p0, p1 = plan.phases
    assert (p0.id, p0.estimate, p0.on_pass, p0.on_fail, p0.timeout_s) == ("phase-0", "~5 min", "Phase 1", "stop", 1200)
    assert (p1.id, p1.needs) == ("finetune", ["Phase 0"])
    assert resolve_command(p0.steps[0].command, plan.vars) == "eagle toy-target --out work/target"
    assert len(p0.steps[2].command.splitlines()) == 2
    judged = evaluate(p0.criterion.expr, {"accept_len": 2.41, "train_loss": 1.93})
    assert (judged.verdict, judged.explanation) == ("pass", "accept_len 2.41 >= 1.5 and train_loss 1.93 < 4.0")


def test_second_example_keeps_json_and_substitutes_inside_it() -> None:
    plan, _ = parse_plan(EXAMPLES[1], "example1.md")
    cheap, expensive = plan.phases
    assert cheap.on_fail == "expensive" and plan.find_phase(cheap.on_fail) is expensive
    assert resolve_command(cheap.steps[0].command, plan.vars) == """mkdir -p work/out && echo '{"score": 0.4}' > "$RUNBOOK_METRICS\""""
    assert "$(ls work/out | wc -l)" in resolve_command(expensive.steps[0].command, plan.vars)
    assert expensive.timeout_s == 5400
