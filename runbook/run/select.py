"""Which phase `runbook next` runs, and from which step. Pure: plan + ledger in, a Selection out.

The ledger (`state/runs/*.json`) is the truth; the status blocks in the plan are its display.
runbook/run/planstate.py turns the Selection into THE next action every reader shows.

Walk: start at the first phase. If it has no run yet, run it. If its latest run is `pass` or
`fail`, follow `On pass:` (default: the next phase in the document) or `On fail:` (default:
`stop`); a `stop` or the end of the plan means there is nothing to run. A phase reached through a
transition counts as done only by a run that started after the run that handed over to it, so a
fail that branches back to an earlier phase runs that phase again. A verdict is stale, and the
phase runs again, when the phase's commands (vars resolved) or its `Pass:` are no longer those the
run was judged by (`stale_reason`); an edit of its prose alone keeps the verdict.

The walk is the plan's position. A phase run out of order with `--phase` (a detour) does not move
it: when the plan's latest run is a detour that ended `error`, `timeout` or `interrupted`, the walk
still decides (the selection names the detour in `detour`); only when the walk finds nothing left
to run (the end, or a stop) is the unfinished detour resumed, so it is not forgotten.

A phase whose latest run is `error`, `timeout` or `interrupted` is resumed at its first unticked
step, unless the phase's text changed since that run (blocks and checkboxes do not count): then it
reruns from its first step and the selection carries a diff. An `inconclusive` phase reruns from
its first step (its steps all ran; the criterion named a metric nobody wrote). Before a resume or
a rerun is offered, `attempts` (runbook/run/attempts.py) counts the phase's runs in a row that
ended the same failure: after two with nothing changed since, nothing is selected (end
`repeated`): a third would only repeat them.

`--phase` picks a phase directly: resumed as above if its last run stopped early, otherwise run
from its first step; `--restart` always runs it from its first step. Neither is held back by a
repeated failure. Every phase named in `Needs:` must have `pass` as its latest verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from runbook.model import JUDGED, Phase, Plan, RunRecord, criterion_display
from runbook.run.attempts import Attempts, AttemptsOf

RESUMABLE = frozenset({"error", "timeout", "interrupted"})
Mode = Literal["fresh", "resume", "rerun", "changed", "restart", "stale"]
# Why nothing is to run: the plan ran to its end (or a stop after a pass), it stopped after a fail,
# the phase to resume or rerun ended the same failure twice with nothing changed since, it has no
# phases, or its transitions loop.
End = Literal["finished", "failed", "repeated", "empty", "loop"]


@dataclass
class Selection:
    phase: Phase | None  # None: nothing to run (see `message`) or blocked
    start: int = 0  # index of the first step to run; the steps before it are already done
    mode: Mode = "fresh"
    message: str = ""  # why this phase (or why nothing)
    last: RunRecord | None = None  # the phase's latest run, if any
    diff: str | None = None  # what changed in the phase's text since an interrupted run
    blocked: bool = False  # Needs: not satisfied (or --phase names no phase)
    end: End | None = None  # phase is None and not blocked: why nothing is to run
    blocked_phase: Phase | None = None  # the phase whose Needs: are unmet
    unmet: list[str] = field(default_factory=list)  # ids of the phases it needs
    detour: RunRecord | None = None  # the plan's latest run, unfinished, of a phase the walk did not reach
    attempts: Attempts | None = None  # resume / rerun (and end "repeated"): the same failures in a row


def _latest(runs: list[RunRecord], phase_id: str, after: int = -1) -> tuple[int, RunRecord] | None:
    found = None
    for i, run in enumerate(runs):
        if i > after and run.phase == phase_id:
            found = (i, run)
    return found


def next_in_document(plan: Plan, phase: Phase) -> Phase | None:
    i = plan.position(phase)
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


def resolved_commands(plan: Plan, phase: Phase, overrides: dict[str, str] | None = None) -> list[str]:
    """The phase's step commands with vars resolved, as `runbook next` would run them
    (with `overrides`: as `runbook next --set` would)."""
    from runbook.plan.resolve import resolve_command

    vars = {**plan.vars, **overrides} if overrides else plan.vars
    out = []
    for step in phase.steps:
        try:
            out.append(resolve_command(step.command, vars))
        except Exception:  # a bad placeholder is validate's to report; compare it as written
            out.append(step.command)
    return out


def _criterion_key(text: str | None) -> str | None:
    if text is None:
        return None
    from runbook.plan.criteria import CriterionError, parse_criterion, render

    try:
        return render(parse_criterion(text))
    except (CriterionError, RecursionError):
        return " ".join(criterion_display(text).split())


def stale_reason(plan: Plan, phase: Phase, run: RunRecord) -> str | None:
    """Why `run`'s verdict no longer speaks for `phase`, or None when it does.

    A verdict is stale when the phase's commands (vars resolved) or its `Pass:` are not those the
    run was judged by. Prose, the heading, transitions and the timeout do not count: editing
    them must not rerun a days-long phase. Runs recorded without steps are compared by their
    criterion alone. A run made with `runbook next --set` is compared with its own overrides
    applied: the experiment it was stays the phase's verdict (runbook/plan/overrides.py)."""
    from runbook.plan.overrides import run_overrides
    from runbook.redact import redact_credentials

    # as the record keeps them
    now = [redact_credentials(c) for c in resolved_commands(plan, phase, run_overrides(run))]
    then = [redact_credentials(s.command) for s in run.steps]
    if run.steps and then != now:
        changed = [f"step-{i + 1}" for i, (a, b) in enumerate(zip(then, now, strict=False)) if a != b]
        if len(then) != len(now):
            changed.append(f"{len(then)} steps then, {len(now)} now")
        return f"its commands changed since run {run.run_id} ({', '.join(changed)})"
    current = phase.criterion.text if phase.criterion else None
    if (run.steps or run.criterion is not None) and _criterion_key(run.criterion) != _criterion_key(current):
        return (f"its Pass: changed since run {run.run_id} (then `{_criterion_key(run.criterion) or 'none'}`, "
                f"now `{_criterion_key(current) or 'none'}`)")
    return None


def _needs_problem(plan: Plan, phase: Phase, runs: list[RunRecord]) -> tuple[str, list[str]] | None:
    unmet: list[str] = []
    said: list[str] = []
    for ref in phase.needs:
        need = plan.find_phase(ref)
        if need is None:
            return f"{phase.display_name} needs {ref!r}, which is not a phase of this plan", []
        latest = _latest(runs, need.id)
        if latest is None or latest[1].verdict != "pass":
            unmet.append(need.id)
            said.append(
                f"{phase.display_name} needs {need.display_name} to have passed, but "
                + (f"its last verdict is {latest[1].verdict} (run {latest[1].run_id})" if latest else "it has not run")
                + f". Run it first: runbook next --phase {need.id} --yes"
            )
    if unmet:
        return " ".join(said), unmet
    return None


def reachable(plan: Plan) -> list[Phase]:
    """The phases `runbook next` can reach from the first one through On pass: / On fail:."""
    if not plan.phases:
        return []
    seen: dict[str, Phase] = {}
    todo = [plan.phases[0]]
    while todo:
        phase = todo.pop()
        if phase.id in seen:
            continue
        seen[phase.id] = phase
        for verdict in ("pass", "fail"):
            target = transition(plan, phase, verdict)
            if isinstance(target, Phase):
                todo.append(target)
    return [p for p in plan.phases if p.id in seen]


def unreachable(plan: Plan) -> list[Phase]:
    """Phases no transition leads to: `runbook next` runs them only with `--phase`."""
    ids = {p.id for p in reachable(plan)}
    return [p for p in plan.phases if p.id not in ids]


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
    stale: Callable[[Phase, RunRecord], str | None] | None = None,
    attempts: AttemptsOf | None = None,
) -> Selection:
    """Pick the phase to run. `runs` are this plan's runs, oldest first; only each phase's latest
    run and their order count, so each phase's latest alone gives the same Selection. `stale`
    decides whether a judged run still speaks for its phase (default: `stale_reason`).
    `attempts`: the same failures in a row of a phase, given its latest run (runbook/run/attempts.py);
    without it no resume or rerun is held back."""
    if not plan.phases:
        return Selection(None, message="the plan has no phases (a phase is a `## Phase N: title` heading)", end="empty")
    is_stale = stale or (lambda phase, run: stale_reason(plan, phase, run))

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
        chosen = _walk(plan, runs, restart=restart, current_hash=current_hash, old_diff=old_diff, stale=is_stale)
        unfinished = _unfinished(plan, runs, restart=restart, current_hash=current_hash, old_diff=old_diff)
        if unfinished is not None and chosen.phase is None and chosen.end in ("finished", "failed"):
            chosen = unfinished  # the flow has nothing left: the detour is not forgotten
        elif unfinished is not None and (chosen.phase is None or chosen.phase.id != runs[-1].phase):
            chosen.detour = detour = runs[-1]
            name = unfinished.phase.display_name if unfinished.phase else detour.phase
            chosen.message += f"; the plan's latest run ({detour.run_id}, {name}) ended {detour.verdict} off the plan's flow, so it waits"
        if attempts is not None and not restart:
            chosen = _held_back(chosen, attempts)
    if chosen.phase is not None:
        problem = _needs_problem(plan, chosen.phase, runs)
        if problem:
            return Selection(None, message=problem[0], blocked=True, last=chosen.last,
                             blocked_phase=chosen.phase, unmet=problem[1])
    return chosen


def _held_back(chosen: Selection, attempts: AttemptsOf) -> Selection:
    """A resume or rerun, with its phase's attempts; nothing (end `repeated`) when the same failure
    came twice with nothing changed since."""
    if chosen.phase is None or chosen.mode not in ("resume", "rerun") or chosen.last is None:
        return chosen
    tried = attempts(chosen.last)
    chosen.attempts = tried
    if not tried.repeated:
        return chosen
    ids = ", ".join(r.run_id for r in tried.runs[-2:])
    return Selection(
        None,
        message=f"{chosen.phase.display_name} ended {chosen.last.verdict} the same way in its last {tried.count} "
        f"runs ({ids}) and nothing changed since",
        last=chosen.last, end="repeated", detour=chosen.detour, attempts=tried,
    )


def _unfinished(
    plan: Plan,
    runs: list[RunRecord],
    *,
    restart: bool,
    current_hash: Callable[[Phase], str],
    old_diff: Callable[[RunRecord, Phase], str | None],
) -> Selection | None:
    """The plan's latest run, when it stopped early (error, timeout, interrupted): resumed when the
    walk has nothing left to run, else named as a detour."""
    if not runs or runs[-1].verdict not in RESUMABLE:
        return None
    last = runs[-1]
    phase = plan.find_phase(last.phase)
    if phase is None:
        return None
    return _for_phase(
        plan, phase, last, restart=restart, current_hash=current_hash, old_diff=old_diff,
        why=f"the plan's latest run ({last.run_id}, {phase.display_name}, off the plan's flow) ended "
        f"{last.verdict} before its verdict, and the flow has nothing else left to run",
    )


def _walk(
    plan: Plan,
    runs: list[RunRecord],
    *,
    restart: bool,
    current_hash: Callable[[Phase], str],
    old_diff: Callable[[RunRecord, Phase], str | None],
    stale: Callable[[Phase, RunRecord], str | None],
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
        if last.verdict in JUDGED or last.verdict == "inconclusive":
            outdated = stale(phase, last)
            if outdated:
                return Selection(
                    phase, 0, "stale",
                    f"{why}; its {last.verdict} is stale: {outdated}, so it runs again from its first step",
                    last,
                )
        if last.verdict not in JUDGED:
            return _for_phase(
                plan, phase, last, restart=restart, current_hash=current_hash, old_diff=old_diff, why=why
            )
        target = transition(plan, phase, last.verdict)
        field_name = "On pass" if last.verdict == "pass" else "On fail"
        if target == "stop":
            return Selection(
                None,
                message=f"nothing to run: {phase.display_name} was judged {last.verdict} (run {last.run_id}) "
                f"and its {field_name} is stop",
                last=last,
                end="finished" if last.verdict == "pass" else "failed",
            )
        if target == "end":
            return Selection(
                None,
                message=f"nothing to run: the plan is finished ({phase.display_name}, the last phase, "
                f"passed in run {last.run_id})",
                last=last,
                end="finished",
            )
        assert isinstance(target, Phase)
        why = f"{phase.display_name} was judged {last.verdict} (run {last.run_id}); {field_name}: {target.display_name}"
        phase, after = target, index
    return Selection(None, message="could not decide the next phase: the transitions loop; use --phase", end="loop")
