"""Which phase `runbook next` runs, and from which step. Pure: plan + ledger in, a Selection out.

The ledger (`state/runs/*.json`) is the truth; the status blocks in the plan are its display.

Walk: start at the first phase. If it has no run yet, run it. If its latest run is `pass` or
`fail`, follow `On pass:` (default: the next phase in the document) or `On fail:` (default:
`stop`); a `stop` or the end of the plan means there is nothing to run. A phase reached through a
transition counts as done only by a run that started after the run that handed over to it, so a
fail that branches back to an earlier phase runs that phase again.

A phase whose latest run is `error`, `timeout` or `interrupted` is resumed at its first unticked
step, unless the phase's text changed since that run (blocks and checkboxes do not count): then it
reruns from its first step and the selection carries a diff. An `inconclusive` phase reruns from
its first step (its steps all ran; the criterion named a metric nobody wrote).

`--phase` picks a phase directly: resumed as above if its last run stopped early, otherwise run
from its first step; `--restart` always runs it from its first step. Every phase named in `Needs:`
must have `pass` as its latest verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from runbook.model import JUDGED, Phase, Plan, RunRecord

RESUMABLE = frozenset({"error", "timeout", "interrupted"})
Mode = Literal["fresh", "resume", "rerun", "changed", "restart"]


@dataclass
class Selection:
    phase: Phase | None  # None: nothing to run (see `message`) or blocked
    start: int = 0  # index of the first step to run; the steps before it are already done
    mode: Mode = "fresh"
    message: str = ""  # why this phase (or why nothing)
    last: RunRecord | None = None  # the phase's latest run, if any
    diff: str | None = None  # what changed in the phase's text since an interrupted run
    blocked: bool = False  # Needs: not satisfied


def _latest(runs: list[RunRecord], phase_id: str, after: int = -1) -> tuple[int, RunRecord] | None:
    found = None
    for i, run in enumerate(runs):
        if i > after and run.phase == phase_id:
            found = (i, run)
    return found


def next_in_document(plan: Plan, phase: Phase) -> Phase | None:
    ids = [p.id for p in plan.phases]
    i = ids.index(phase.id)
    return plan.phases[i + 1] if i + 1 < len(plan.phases) else None


def transition(plan: Plan, phase: Phase, verdict: str) -> Phase | str:
    """Where a judged phase hands over: a Phase, "stop", or "end" (no phase after it)."""
    ref = phase.on_pass if verdict == "pass" else phase.on_fail
    if ref is None:
        if verdict != "pass":
            return "stop"
        following = next_in_document(plan, phase)
        return following if following is not None else "end"
    if ref.strip().lower() == "stop":
        return "stop"
    target = plan.find_phase(ref)
    if target is None:  # validate reports it; treat as stop rather than guess
        return "stop"
    return target


def _first_unfinished(phase: Phase) -> int:
    for i, step in enumerate(phase.steps):
        if not step.done:
            return i
    return len(phase.steps)


def _needs_problem(plan: Plan, phase: Phase, runs: list[RunRecord]) -> str | None:
    for ref in phase.needs:
        need = plan.find_phase(ref)
        if need is None:
            return f"{phase.display_name} needs {ref!r}, which is not a phase of this plan"
        latest = _latest(runs, need.id)
        if latest is None or latest[1].verdict != "pass":
            said = f"its last verdict is {latest[1].verdict} (run {latest[1].run_id})" if latest else "it has not run"
            return (
                f"{phase.display_name} needs {need.display_name} to have passed, but {said}. "
                f"Run it first: runbook next --phase {need.id}"
            )
    return None


def _for_phase(
    plan: Plan,
    phase: Phase,
    last: RunRecord | None,
    *,
    restart: bool,
    current_hash: Callable[[Phase], str],
    old_diff: Callable[[RunRecord, Phase], str | None],
    why: str,
) -> Selection:
    if restart:
        return Selection(phase, 0, "restart", f"{why}; --restart: running it from its first step", last)
    if last is None:
        return Selection(phase, 0, "fresh", why, None)
    if last.verdict in RESUMABLE:
        if current_hash(phase) != last.phase_text_hash:
            return Selection(
                phase,
                0,
                "changed",
                f"{why}; its last run ({last.run_id}) ended {last.verdict}, but the phase's text changed "
                "since, so it reruns from its first step",
                last,
                diff=old_diff(last, phase),
            )
        start = _first_unfinished(phase)
        where = f"step {start + 1}" if start < len(phase.steps) else "the verdict (all steps are done)"
        return Selection(
            phase, start, "resume", f"{why}; resuming its last run ({last.run_id}, {last.verdict}) at {where}", last
        )
    return Selection(
        phase, 0, "rerun", f"{why}; its last run ({last.run_id}) was {last.verdict}: running it again from the top", last
    )


def select_phase(
    plan: Plan,
    runs: list[RunRecord],
    *,
    phase_ref: str | None = None,
    restart: bool = False,
    current_hash: Callable[[Phase], str],
    old_diff: Callable[[RunRecord, Phase], str | None] = lambda _run, _phase: None,
) -> Selection:
    """Pick the phase to run. `runs` are this plan's runs, oldest first."""
    if not plan.phases:
        return Selection(None, message="the plan has no phases (a phase is a `## Phase N: title` heading)")

    if phase_ref is not None:
        phase = plan.find_phase(phase_ref)
        if phase is None:
            names = ", ".join(p.id for p in plan.phases)
            return Selection(None, message=f"no phase {phase_ref!r} in the plan; phases: {names}", blocked=True)
        latest = _latest(runs, phase.id)
        chosen = _for_phase(
            plan,
            phase,
            latest[1] if latest else None,
            restart=restart,
            current_hash=current_hash,
            old_diff=old_diff,
            why=f"{phase.display_name} chosen with --phase",
        )
    else:
        chosen = _walk(plan, runs, restart=restart, current_hash=current_hash, old_diff=old_diff)
    if chosen.phase is not None:
        problem = _needs_problem(plan, chosen.phase, runs)
        if problem:
            return Selection(None, message=problem, blocked=True, last=chosen.last)
    return chosen


def _walk(
    plan: Plan,
    runs: list[RunRecord],
    *,
    restart: bool,
    current_hash: Callable[[Phase], str],
    old_diff: Callable[[RunRecord, Phase], str | None],
) -> Selection:
    phase = plan.phases[0]
    after = -1
    why = f"{phase.display_name} is the first phase"
    for _ in range(len(runs) + len(plan.phases) + 1):
        latest = _latest(runs, phase.id, after)
        if latest is None:
            return _for_phase(
                plan, phase, None, restart=restart, current_hash=current_hash, old_diff=old_diff, why=why
            )
        index, last = latest
        if last.verdict not in JUDGED:
            return _for_phase(
                plan, phase, last, restart=restart, current_hash=current_hash, old_diff=old_diff, why=why
            )
        target = transition(plan, phase, last.verdict)
        field = "On pass" if last.verdict == "pass" else "On fail"
        if target == "stop":
            return Selection(
                None,
                message=f"nothing to run: {phase.display_name} was judged {last.verdict} (run {last.run_id}) "
                f"and its {field} is stop. To run it again: runbook next --phase {phase.id} --restart",
                last=last,
            )
        if target == "end":
            return Selection(
                None,
                message=f"nothing to run: the plan is finished ({phase.display_name}, the last phase, "
                f"passed in run {last.run_id})",
                last=last,
            )
        assert isinstance(target, Phase)
        why = f"{phase.display_name} was judged {last.verdict} (run {last.run_id}); {field}: {target.display_name}"
        phase, after = target, index
    return Selection(None, message="could not decide the next phase: the transitions loop; use --phase")
