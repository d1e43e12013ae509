"""A phase's `Sweep:` and `Pick:` lines: parsed into the Phase as `runbook sweep --set` axes and a
`--pick`, and checked at parse time by the functions `runbook sweep` checks its flags with, each
problem naming its line and the fix."""

from __future__ import annotations

from runbook.plan.grid import phase_points
from runbook.plan.parse import parse_plan

HEAD = """\
---
runbook: 1
title: t
vars:
  x: "1"
  y: "a"
---

## Phase 1: Fit

Steps:
- [ ] Fit: `echo {x} {y} > out`

"""


def problems(fields: str) -> list[str]:
    _, found = parse_plan(HEAD + fields, "p.md")
    return [f"{p.line}: {p.message}" for p in found]


def test_a_sweep_phase_holds_its_axes_and_pick_and_its_points_are_the_grid() -> None:
    plan, found = parse_plan(HEAD + "Pass: score >= 0.5\nSweep: `x=1,2,3; y=a,b`\nPick: best:score\n", "p.md")
    assert found == [] and plan is not None
    phase = plan.phases[0]
    assert (phase.sweep, phase.pick, phase.field_lines["sweep"]) == (["x=1,2,3", "y=a,b"], "best:score", 15)
    assert phase_points(plan, phase, "p.md") == [{"x": x, "y": y} for x in "123" for y in "ab"]
    plain, _ = parse_plan(HEAD + "Pass: score >= 0.5\n", "p.md")
    assert plain is not None and (plain.phases[0].sweep, plain.phases[0].pick) == ([], None)


def test_each_bad_sweep_or_pick_is_an_error_at_its_line_naming_the_fix() -> None:
    for fields, line, words in [
        ("Pass: score >= 0.5\nSweep: z=1,2\nPick: best:score\n", 15, "the plan declares no var 'z'"),
        ("Pass: score >= 0.5\nSweep: x=1,\nPick: best:score\n", 15, "write NAME=V1,V2"),
        ("Pass: score >= 0.5\nSweep: x=1,2; x=3\nPick: best:score\n", 15, "x is given twice"),
        ("Pass: score >= 0.5\nSweep:\nPick: best:score\n", 15, "`Sweep:` is empty"),
        ("Pass: score >= 0.5\nSweep: x=1,2\n", 15, "needs `Pick:`"),
        ("Pass: score >= 0.5\nPick: best:score\n", 15, "`Pick:` without `Sweep:`"),
        ("Pass: score >= 0.5\nSweep: x=1,2\nPick: top:score\n", 16, "write best:METRIC, max:METRIC or min:METRIC"),
        ("Pass: score >= 0.5\nSweep: x=1,2\nPick: best:loss\n", 16, "`Pick:` max:loss or `Pick:` min:loss"),
    ]:
        found = problems(fields)
        assert any(p.startswith(f"{line}: ") and words in p for p in found), (fields, found)


def test_a_swept_var_where_no_quoting_is_safe_is_refused_at_the_sweep_line() -> None:
    _, found = parse_plan(HEAD.replace("echo {x}", "echo $(( {x} + 1 ))") + "Sweep: x=1,2\nPick: max:score\n", "p.md")
    assert any(p.line == 14 and "`Sweep:` x: Phase 1 step-1" in p.message and "cannot take this value there"
               in p.message for p in found), found


def test_min_and_max_need_no_pass_and_an_unused_var_is_a_warning() -> None:
    plan, found = parse_plan(HEAD.replace("{y} ", "") + "Sweep: y=a,b\nPick: min:loss\n", "p.md")
    assert plan is not None and [(p.severity, p.line) for p in found] == [("warning", 14)]
    assert "do not use {y}" in found[0].message
