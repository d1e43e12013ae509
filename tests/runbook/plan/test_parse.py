"""What the parser reads out of a plan: phases, steps, fields, blocks, status, warnings."""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook.plan.criteria import render
from runbook.plan.parse import PlanError, load_plan, parse_duration, parse_plan, parse_status_line, read_plan

DESIGN_PLAN = """---
runbook: 1
title: EAGLE-3 drafter for the toy target
notes: eagle3-next-steps.md
vars:
  target: work/target
  data: work/data
---

# Game plan: EAGLE-3 drafter

Free prose: context, hardware, history.

## Phase 0: Quick probe (~5 min)
<!-- runbook:status -->
**Status:** pass · 2026-11-29 14:30 UTC · run 20261129-143012-7f3a · accept_len 2.41 >= 1.5
<!-- /runbook:status -->

Does a drafter trained on 64 prompts beat chance?

Steps:
- [x] Make the target: `eagle toy-target --out {target}`
- [ ] Train:
  ```sh
  eagle vocab --data {data} --draft-vocab 256
  eagle train --model {target} --data {data} --out work/draft --epochs 2
  ```
- [ ] Evaluate with `-k 3`:
  ```
  eagle evaluate --model {target} --draft work/draft -k 3
  ```

Pass: `accept_len >= 1.5 and train_loss < 4.0`
On pass: Phase 1
On fail: stop
Timeout: 20m

<!-- runbook:results -->
| run | verdict |
|---|---|
| 20261129-143012-7f3a | pass |
<!-- /runbook:results -->

## Phase 1: Fine-tune (~2-3 h) {#finetune}

```markdown
## Phase 7: an example inside a fence
Pass: `this is not parsed`
On pass: nowhere
```

Steps:
- [ ] Train: `eagle train --epochs 10`

Pass: accept_len >= 2
Needs: Phase 0
Timeout: 1h30m

## Appendix

Pass: this line is prose after the last phase's fields end.
"""


@pytest.fixture(scope="module")
def plan():
    plan, problems = parse_plan(DESIGN_PLAN, "game.md")
    assert [p for p in problems if p.severity == "error"] == []
    assert plan is not None
    return plan


def test_front_matter(plan) -> None:
    assert plan.format_version == 1
    assert plan.title == "EAGLE-3 drafter for the toy target"
    assert plan.notes == "eagle3-next-steps.md"
    assert plan.vars == {"target": "work/target", "data": "work/data"}
    assert plan.text == DESIGN_PLAN
    assert DESIGN_PLAN[plan.front_matter_span.start : plan.front_matter_span.end].endswith("---\n")


def test_phases_and_headings(plan) -> None:
    assert [p.id for p in plan.phases] == ["phase-0", "finetune"]
    p0, p1 = plan.phases
    assert (p0.label, p0.title, p0.estimate, p0.explicit_id) == ("0", "Quick probe", "~5 min", None)
    assert (p1.label, p1.title, p1.estimate, p1.explicit_id) == ("1", "Fine-tune", "~2-3 h", "finetune")
    assert p1.heading == "Phase 1: Fine-tune (~2-3 h) {#finetune}"
    assert p0.goal == "Does a drafter trained on 64 prompts beat chance?"
    assert p0.span.start_line == 14 and p1.span.start_line == p0.span.end_line + 1 == 44
    # the last phase's span runs to the end of the file, appendix included
    assert DESIGN_PLAN[p1.span.start : p1.span.end].endswith("fields end.\n")


def test_steps(plan) -> None:
    steps = plan.phases[0].steps
    assert [s.id for s in steps] == ["step-1", "step-2", "step-3"]
    assert [s.done for s in steps] == [True, False, False]
    assert steps[0].command == "eagle toy-target --out {target}"
    assert steps[0].text == "Make the target: `eagle toy-target --out {target}`"
    assert steps[1].command == (
        "eagle vocab --data {data} --draft-vocab 256\neagle train --model {target} --data {data} --out work/draft --epochs 2"
    )
    # with a fenced block the code span in the text is prose
    assert steps[2].command == "eagle evaluate --model {target} --draft work/draft -k 3"
    assert steps[1].span.end_line - steps[1].span.start_line == 4
    # checkbox offsets: ticking step-2 changes exactly one character
    text = plan.text
    ticked = text[: steps[1].checkbox] + "x" + text[steps[1].checkbox + 1 :]
    again, _ = parse_plan(ticked, "game.md")
    assert [s.done for s in again.phases[0].steps] == [True, True, False]


def test_fields(plan) -> None:
    p0, p1 = plan.phases
    assert p0.criterion is not None and p0.criterion.text == "`accept_len >= 1.5 and train_loss < 4.0`"
    assert render(p0.criterion.expr) == "accept_len >= 1.5 and train_loss < 4.0"
    assert (p0.on_pass, p0.on_fail, p0.needs, p0.timeout_s) == ("Phase 1", "stop", [], 1200.0)
    assert (p1.on_pass, p1.on_fail, p1.needs, p1.timeout_s) == (None, None, ["Phase 0"], 5400.0)
    assert p0.field_lines == {"steps": 21, "pass": 33, "on_pass": 34, "on_fail": 35, "timeout": 36}


def test_fenced_headings_and_pass_lines_are_not_plan_parts(plan) -> None:
    assert len(plan.phases) == 2
    p1 = plan.phases[1]
    assert render(p1.criterion.expr) == "accept_len >= 2"
    assert p1.criterion.span.start_line == DESIGN_PLAN.splitlines().index("Pass: accept_len >= 2") + 1
    assert p1.on_pass is None  # "On pass: nowhere" sits in the fence


def test_status_and_blocks(plan) -> None:
    p0 = plan.phases[0]
    assert set(p0.blocks) == {"status", "results"}
    assert p0.status is not None
    assert p0.status.model_dump() == {
        "verdict": "pass",
        "run_id": "20261129-143012-7f3a",
        "when": "2026-11-29 14:30 UTC",
        "summary": "accept_len 2.41 >= 1.5",
        "stale": False,
    }
    results = p0.blocks["results"]
    assert results.inner.splitlines()[-1] == "| 20261129-143012-7f3a | pass |"
    assert plan.phases[1].status is None


def test_find_phase_by_label_id_and_explicit_id(plan) -> None:
    for ref in ("Phase 1", "phase 1", "1", "finetune", "FINETUNE"):
        assert plan.find_phase(ref).id == "finetune", ref
    assert plan.find_phase("phase-0").label == "0"
    assert plan.find_phase("Phase 9") is None


@pytest.mark.parametrize(
    "line,expected",
    [
        ("**Status:** fail · 2026-11-30 09:00 UTC · run 20261130-090000-abcd", ("fail", "20261130-090000-abcd", "2026-11-30 09:00 UTC", None)),
        ("**Status:** timeout · run r1 · step-2 ran past 20m · retry", ("timeout", "r1", None, "step-2 ran past 20m · retry")),
        ("**Status:** PASS", ("pass", None, None, None)),
    ],
)
def test_status_line(line: str, expected: tuple) -> None:
    status = parse_status_line(line + "\n")
    assert status is not None
    assert (status.verdict, status.run_id, status.when, status.summary) == expected


def test_status_line_with_unknown_verdict_is_a_warning() -> None:
    assert parse_status_line("**Status:** running") is None
    text = DESIGN_PLAN.replace("**Status:** pass", "**Status:** passed")
    plan, problems = parse_plan(text, "g.md")
    assert plan.phases[0].status is None
    [warning] = [p for p in problems if p.severity == "warning"]
    assert warning.line == 15 and "status block not understood" in warning.message


@pytest.mark.parametrize(
    "text,seconds",
    [("90s", 90), ("45m", 2700), ("2h", 7200), ("1h30m", 5400), ("1.5h", 5400), ("2 days", 172800), ("10 min", 600)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "20", "m", "5x", "1h and 2m", "-5m"])
def test_bad_durations(text: str) -> None:
    assert parse_duration(text) is None


def _plan(body: str, vars_: str = "") -> str:
    return f"---\nrunbook: 1\n{vars_}---\n\n{body}"


def test_warnings_do_not_stop_load(tmp_path: Path) -> None:
    text = _plan(
        "## Phase 0: W (~1 min)\n\n- [ ] not under Steps: `true`\n\n"
        "## Phase 1: X\n\nSteps:\n- [ ] Run: `echo '{ out }' {{out}}`\n- plain item\n\n### Phase 2: too deep\n",
        vars_="extra: 1\nvars:\n  out: o\n",
    )
    path = tmp_path / "w.md"
    path.write_text(text)
    plan = load_plan(path)
    _, problems = read_plan(path)
    messages = [(p.line, p.severity, p.message.split(":")[0]) for p in problems]
    assert all(sev == "warning" for _, sev, _ in messages), messages
    assert len(problems) == 5
    text_all = "\n".join(str(p) for p in problems)
    assert "unknown front matter key 'extra'" in text_all
    assert "task list without a `Steps:` line" in text_all
    assert "{ out } is left as written; did you mean {out}?" in text_all
    assert "not a task" in text_all
    assert "level-3 heading" in text_all
    assert [s.command for s in plan.phases[1].steps] == ["echo '{ out }' {{out}}"]


def test_load_plan_raises_with_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.md"
    path.write_text(_plan("## Phase 0: A\n\nSteps:\n- [ ] x\n\nPass: a >\nOn pass: Phase 3\n"))
    with pytest.raises(PlanError) as info:
        load_plan(path)
    lines = [p.line for p in info.value.problems]
    assert lines == [8, 10, 11]
    assert str(info.value).startswith(f"{path}:8:")


def test_read_plan_missing_and_undecodable(tmp_path: Path) -> None:
    plan, [problem] = read_plan(tmp_path / "nope.md")
    assert plan is None and "cannot read" in problem.message
    bad = tmp_path / "latin1.md"
    bad.write_bytes(b"---\nrunbook: 1\n---\n\nna\xefve\n")
    plan, [problem] = read_plan(bad)
    assert plan is None and (problem.line, problem.col) == (5, 3)


def test_front_matter_problems() -> None:
    plan, [p] = parse_plan("---\nrunbook: 1\nvars: [a, b]\n---\n\n## Phase 0: A\n", "f.md")
    assert p.line == 3 and "`vars:` must be a mapping" in p.message
    plan, [p] = parse_plan("---\nrunbook: true\n---\n", "f.md")
    assert plan is None and "unsupported plan format version True" in p.message
    plan, problems = parse_plan("\ufeff---\r\nrunbook: 1\r\nvars:\r\n  n: 3\r\n---\r\n\r\n## Phase 0: A\r\n", "f.md")
    assert plan is not None and plan.vars == {"n": "3"} and problems == []


def test_heading_variants() -> None:
    body = (
        "## Phase 2b: Letters in the label ##\n\n"
        "## Phase 3 (~1 h)\n\n"
        "## Phases overview\n\n"
        "## Phase transitions explained\n\n"
        "## Phase 4 Missing colon\n"
    )
    plan, problems = parse_plan(_plan(body), "h.md")
    assert [(p.id, p.title, p.estimate) for p in plan.phases] == [
        ("phase-2b", "Letters in the label", None),
        ("phase-3", "", "~1 h"),
        ("phase-4", "", None),
    ]
    errors = [p for p in problems if p.severity == "error"]
    assert [(p.line, "does not read" in p.message) for p in errors] == [(13, True)]
