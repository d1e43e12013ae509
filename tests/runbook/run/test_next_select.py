"""Phase selection: transitions, branches back, resume rules, Needs, --phase/--restart."""

from __future__ import annotations

from helpers import run_record

from runbook.plan.parse import parse_plan
from runbook.plan.writeback import phase_text_hash
from runbook.run.select import select_phase

PLAN = """\
---
runbook: 1
---

## Phase 0: Data

Steps:
- [x] A: `true`
- [ ] B: `true`

## Phase 1: Train

Steps:
- [ ] T: `true`

On fail: Phase 0

## Phase 2: Serve

Needs: Phase 1

Steps:
- [ ] S: `true`

On pass: stop
"""


def plan():
    p, problems = parse_plan(PLAN, "p.md")
    assert p is not None and not [x for x in problems if x.severity == "error"], problems
    return p


def run(n, phase, verdict, hash_="same"):
    return run_record(run_id=f"2026-{n:04d}", plan="p.md", plan_blob="b", phase=phase, phase_label=phase[-1],
                     phase_text_hash=hash_, started=f"2026-01-01T00:00:{n:02d}.000000Z", verdict=verdict)


def pick(runs, **kw):
    return select_phase(plan(), runs, current_hash=lambda _p: "same", **kw)


def test_fresh_plan_starts_at_first_phase_from_top():
    sel = pick([])
    assert sel.phase.id == "phase-0" and sel.start == 0 and sel.mode == "fresh"


def test_pass_follows_on_pass_default_next():
    sel = pick([run(1, "phase-0", "pass")])
    assert sel.phase.id == "phase-1" and sel.mode == "fresh"


def test_fail_branches_back_and_reruns_earlier_phase():
    runs = [run(1, "phase-0", "pass"), run(2, "phase-1", "fail")]
    sel = pick(runs)
    assert sel.phase.id == "phase-0" and sel.mode == "fresh"  # its pass is older than the fail
    runs.append(run(3, "phase-0", "pass"))
    assert pick(runs).phase.id == "phase-1"


def test_stop_and_end():
    runs = [run(1, "phase-0", "pass"), run(2, "phase-1", "pass"), run(3, "phase-2", "pass")]
    sel = pick(runs)
    assert sel.phase is None and "On pass is stop" in sel.message and not sel.blocked
    default_fail = select_phase(plan(), [run(1, "phase-0", "fail")], current_hash=lambda _p: "same")
    assert default_fail.phase is None and "On fail is stop" in default_fail.message


def test_resume_at_first_unticked_step_unless_text_changed():
    runs = [run(1, "phase-0", "interrupted")]
    sel = pick(runs)
    assert sel.mode == "resume" and sel.start == 1
    changed = select_phase(plan(), runs, current_hash=lambda _p: "other", old_diff=lambda _r, _p: "DIFF")
    assert changed.mode == "changed" and changed.start == 0 and changed.diff == "DIFF"
    restarted = pick(runs, restart=True)
    assert restarted.mode == "restart" and restarted.start == 0


def test_inconclusive_reruns_from_top():
    sel = pick([run(1, "phase-0", "inconclusive")])
    assert sel.phase.id == "phase-0" and sel.mode == "rerun" and sel.start == 0


def test_needs_and_phase_option():
    blocked = pick([], phase_ref="2")
    assert blocked.phase is None and blocked.blocked and "needs Phase 1 to have passed" in blocked.message
    ok = pick([run(1, "phase-1", "pass")], phase_ref="Phase 2")
    assert ok.phase.id == "phase-2"
    again = pick([run(1, "phase-0", "pass")], phase_ref="phase-0")
    assert again.phase.id == "phase-0" and again.mode == "rerun"
    assert pick([], phase_ref="nope").blocked


def test_real_hash_function_matches_parser():
    p = plan()
    assert phase_text_hash(p.text, p.phases[0]) == phase_text_hash(p.text.replace("[x]", "[ ]"), p.phases[0])


def test_a_detour_that_stopped_early_does_not_move_the_plan():
    # Phase 0 passed, Phase 1 ended error, then Phase 2 (out of order) timed out: the flow is at Phase 1
    runs = [run(1, "phase-0", "pass"), run(2, "phase-1", "error"), run(3, "phase-2", "timeout")]
    sel = pick(runs)
    assert sel.phase.id == "phase-1" and sel.mode == "resume" and sel.last.run_id == "2026-0002"
    assert sel.detour is not None and sel.detour.run_id == "2026-0003"
    # on the flow, the latest unfinished run is no detour
    on_flow = pick([run(1, "phase-0", "pass"), run(2, "phase-1", "timeout")])
    assert on_flow.phase.id == "phase-1" and on_flow.detour is None


def test_an_unfinished_detour_is_resumed_when_the_flow_has_nothing_left():
    runs = [run(1, "phase-0", "fail"), run(2, "phase-1", "timeout")]  # Phase 0 failed: stop; then a detour
    sel = pick(runs)
    assert sel.phase.id == "phase-1" and sel.mode == "resume" and "off the plan's flow" in sel.message


def test_the_same_failure_twice_with_nothing_changed_is_held_back():
    from runbook.run.attempts import from_runs

    runs = [run(1, "phase-0", "error"), run(2, "phase-0", "error")]
    nothing_changed = from_runs(runs, lambda _run: [])
    held = pick(runs, attempts=nothing_changed)
    assert held.phase is None and held.end == "repeated" and held.attempts.count == 2 and not held.blocked
    # files changed since the first of them: offered, with the count
    changed = pick(runs, attempts=from_runs(runs, lambda _run: ["train.py"]))
    assert changed.phase.id == "phase-0" and changed.mode == "resume" and changed.attempts.count == 2
    # asked for explicitly: it runs
    assert pick(runs, attempts=nothing_changed, phase_ref="0").phase.id == "phase-0"
    assert pick(runs, attempts=nothing_changed, restart=True).phase.id == "phase-0"
    # not the same failure: another verdict, another phase text, an interrupted run between them
    for other in (run(1, "phase-0", "timeout"), run(1, "phase-0", "error", hash_="older"),
                  run(1, "phase-0", "interrupted")):
        mixed = [other, run(2, "phase-0", "error")]
        sel = pick(mixed, attempts=from_runs(mixed, lambda _run: []))
        assert sel.phase.id == "phase-0" and sel.attempts.count == 1, other.verdict
