"""Where a plan stands, derived once: each phase's state and THE next action.

Every reader asks this module: `runbook status`, `show`, `next` (its dry run and its "nothing to
run" message), `brief`, `history` (the run in progress) and the notes' status block written by
`runbook record`. Nobody else decides what comes next.

Inputs: the plan text, the ledger (this plan's runs, oldest first), the run lock's holder with
the run's live state (runbook/store/live.py: step, heartbeat, job, log tail), runs whose runbook died
before recording them (shown as the `interrupted` runs `runbook next` will record; a Slurm run as
one it re-attaches to), and what changed in the repository since a failed run. The phase to run is chosen by
runbook/run/select.py, the same function `runbook next` runs, so the next action is what `runbook
next` does.

Phase states (`contract.PhaseState`), from the phase's latest run:
- `running`: the run lock's live holder is running it;
- `not_run`: no run in the ledger (a status block in the plan without a ledger run is noted);
- `passed` / `failed` / `inconclusive`: its latest run's verdict still speaks for the phase;
- `stale`: judged under other commands (vars resolved) or another `Pass:` (select.stale_reason);
- `resumable`: its latest run ended error, timeout or interrupted.

The next action (`contract.NextAction.kind`):
- `running`: a live process holds the run lock (`runbook next` would exit 5); wait for it;
- `run` / `resume` / `rerun`: `argv` is `runbook next --yes` (resume: at the first unfinished step,
  with the `--set` values of the run it resumes, `overrides`; rerun: an inconclusive phase again
  from its first step);
- `retry`: a failed phase the plan stops at, whose code changed since: `runbook next --phase ID
  --restart --yes`;
- `blocked`: the chosen phase's `Needs:` are unmet (`unmet_needs`);
- `nothing`: `outcome` finished (the end, or a stop after a pass), failed (stopped after a fail
  and nothing changed since: a retry would repeat it), repeated (the phase to resume or rerun ended
  the same failure twice with nothing changed since: runbook/run/attempts.py), empty or loop.

The plan's position is its flow (select.py's walk): a phase run out of order with `--phase` that
stopped early is named in the next action's `why` (resume it with `--phase`, or forget it) and is
resumed on its own only when the flow has nothing else to run.

A run in progress is known from the run lock alone (`holder_view`: its plan, phase, run, step,
and whether its pid lives). An executor that outlives its caller (a detached supervisor, a
Slurm job) keeps the same lock fields up to date and may add a heartbeat; `holder_view` is the
one place that decides whether the holder is alive.
"""

from __future__ import annotations

import datetime as _dt
import shlex
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runbook.contract import (
    LockHolder,
    NextAction,
    NextKind,
    PhaseView,
    PlanStateView,
    RunView,
    StepLine,
    phase_label,
)
from runbook.entry import runbook_executable
from runbook.formatting import format_took, iso_utc, parse_utc, utc_now
from runbook.model import Phase, Plan, RunRecord
from runbook.run.attempts import AttemptsOf, from_runs
from runbook.run.attempts import for_workspace as for_workspace_attempts
from runbook.run.select import RESUMABLE, Selection, resolved_commands, select_phase, stale_reason

if TYPE_CHECKING:
    from runbook.store.live import LiveRun
    from runbook.store.lock import LockInfo
    from runbook.store.workspace import Workspace

__all__ = ["PlanState", "derive", "for_workspace", "holder_view", "next_argv"]

ChangedSince = Callable[[RunRecord], "list[str] | None"]

_KIND: dict[str, NextKind] = {"fresh": "run", "stale": "run", "restart": "run", "resume": "resume", "changed": "resume",
                              "rerun": "rerun"}
_STATE = {"pass": "passed", "fail": "failed", "inconclusive": "inconclusive"}


@dataclass
class PlanState:
    view: PlanStateView
    selection: Selection  # what a plain `runbook next` selects (the lock aside)

    @property
    def next(self) -> NextAction:
        return self.view.next


def next_argv(plan_arg: str | None, *extra: str) -> list[str]:
    argv = ["runbook", "next"]
    if plan_arg:
        argv += ["--plan", plan_arg]
    return [*argv, *extra, "--yes"]


def holder_view(info: LockInfo, plan: Plan | None, state_rel: str, now: _dt.datetime | None = None,
                live: LiveRun | None = None, root: Path | None = None,
                state_dir: Path | None = None) -> LockHolder:
    """The lock's holder (a `lock.LockInfo`) as data: alive or not, which phase and step, its log;
    with the run's live state (`live.LiveRun`, read from `root`): heartbeat, job, metrics and the
    last lines of the running step's log. `alive` is `lock.holds` on `state_dir` (the state
    directory the lock was read from); without it, whether the pid still runs."""
    from runbook.store.lock import holds, pid_alive

    alive: bool | None
    if state_dir is not None:
        alive = holds(info, state_dir)
    else:
        alive = pid_alive(info.pid, info.pid_start) if info.host == socket.gethostname() else None
    started = parse_utc(info.started)
    now = now or utc_now()
    phase = plan.find_phase(info.phase) if plan is not None and info.phase else None
    log = f"{state_rel}/runs/{info.run_id}/{info.step}.log" if info.run_id and info.step else None
    holder = LockHolder(
        pid=info.pid, host=info.host, started=iso_utc(info.started),
        elapsed_s=round((now - started).total_seconds(), 1) if started else None, alive=alive,
        run_id=info.run_id, plan=info.plan, phase=info.phase,
        label=phase.display_name if phase else None, step=info.step, log_path=log,
    )
    if live is not None and live.run_id == info.run_id:
        _add_live(holder, live, now, root)
    return holder


def _add_live(holder: LockHolder, live: LiveRun, now: _dt.datetime, root: Path | None) -> None:
    from runbook.store.ledger import tail_lines
    from runbook.store.live import stale_after

    holder.detached = live.detached
    holder.executor = live.executor
    holder.heartbeat = iso_utc(live.heartbeat)
    holder.heartbeat_age_s = live.heartbeat_age(now)
    holder.silent = holder.heartbeat_age_s is not None and holder.heartbeat_age_s > stale_after(live.heartbeat_s)
    holder.steps_done = len(live.results)
    holder.steps_total = len(live.planned)
    holder.metrics = dict(live.metrics_so_far())
    holder.supervisor_log = live.supervisor_log
    if live.step:
        holder.step = live.step
        holder.step_started = iso_utc(live.step_started)
        holder.log_path = live.step_log or holder.log_path
        job = live.job_for(live.step)
        holder.job_id = job.job_id if job else None
    if holder.log_path and root is not None:
        holder.log_tail = [line for line in tail_lines(root / holder.log_path, 8)]


def running_text(holder: LockHolder, plan_rel: str) -> str:
    what = holder.label or holder.phase or "a phase"
    if holder.plan and holder.plan != plan_rel:
        what = f"{what} of {holder.plan}"
    who = f"supervisor pid {holder.pid}" if holder.detached else f"pid {holder.pid}"
    bits = [f"run {holder.run_id}" if holder.run_id else None, f"{who} on {holder.host}",
            f"at {holder.step}" + (f" ({holder.steps_done + 1}/{holder.steps_total})" if holder.steps_total else "")
            if holder.step else None,
            f"Slurm job {holder.job_id}" if holder.job_id else None,
            f"since {holder.started.replace('T', ' ').replace('Z', ' UTC')}" if holder.started else None,
            _beat_text(holder),
            f"log {holder.log_path}" if holder.log_path else None]
    return f"{what} is running ({', '.join(b for b in bits if b)})"


def _beat_text(holder: LockHolder) -> str | None:
    if holder.heartbeat_age_s is None:
        return None
    if holder.silent:
        return f"NO heartbeat for {format_took(holder.heartbeat_age_s)}"
    return f"last heartbeat {format_took(max(holder.heartbeat_age_s, 0.0))} ago"


def _steps(plan: Plan, phase: Phase, done_before: int, overrides: dict[str, str] | None = None) -> list[StepLine]:
    commands = resolved_commands(plan, phase, overrides)
    return [StepLine(id=s.id, text=s.text, command=c, done=i < done_before)
            for i, (s, c) in enumerate(zip(phase.steps, commands, strict=True))]


def _criterion(phase: Phase) -> str | None:
    return phase.criterion.display if phase.criterion else None


def _action_for(plan: Plan, phase: Phase, kind: NextKind, why: str, argv: list[str] | None, start: int,
                **extra: Any) -> NextAction:
    steps = _steps(plan, phase, start, extra.get("overrides"))
    return NextAction(
        kind=kind, why=why, phase=phase.id, label=phase.display_name, title=phase.title, estimate=phase.estimate,
        goal=phase.goal.strip(), argv=[runbook_executable(), *argv[1:]] if argv else None,
        command=shlex.join(argv) if argv else None,
        start_step=phase.steps[start].id if start < len(phase.steps) else None, steps=steps,
        criterion=_criterion(phase), **extra,
    )


def _reason(run: RunRecord) -> str:
    return " ".join(run.reason.split())


def _next_action(
    plan: Plan,
    runs: list[RunRecord],
    sel: Selection,
    holder: LockHolder | None,
    plan_rel: str,
    plan_arg: str | None,
    changed_since: ChangedSince | None,
    failed_ids: list[str],
    unrecorded: frozenset[str] = frozenset(),
) -> NextAction:
    if holder is not None and holder.alive is not False:
        phase = plan.find_phase(holder.phase) if holder.phase and holder.plan in (None, plan_rel) else None
        why = (running_text(holder, plan_rel) + ". `runbook next` refuses (exit 5) until it ends: wait, "
               "and follow it with `runbook status`" + ("" if holder.alive else
               f"; it runs on another host ({holder.host}), so runbook cannot tell whether it is still alive"))
        if phase is not None:
            return _action_for(plan, phase, "running", why, None, 0)
        return NextAction(kind="running", why=why)
    lead = ""
    if holder is not None:
        lead = (f"A killed run ({holder.run_id or '?'}, pid {holder.pid}) left the run lock behind; `runbook next` "
                "takes it over. ")
    argv = next_argv(plan_arg)
    detour = _detour_text(sel.detour, plan_arg)
    if sel.phase is not None:
        return _selected_action(plan, sel, lead, detour, argv, plan_arg, unrecorded)
    if sel.blocked and sel.blocked_phase is not None:
        # the way out is a run of the first phase it needs: that is the argv (the action's phase stays the blocked one)
        unblock = next_argv(plan_arg, "--phase", sel.unmet[0]) if sel.unmet else None
        return _action_for(plan, sel.blocked_phase, "blocked", lead + _sentence(sel.message), unblock, 0,
                           unmet_needs=list(sel.unmet))
    if sel.blocked:
        return NextAction(kind="blocked", why=lead + _sentence(sel.message))
    end = sel.end or "finished"
    last = sel.last
    if end == "repeated" and last is not None and (phase := plan.find_phase(last.phase)) is not None:
        return _repeated_action(plan, phase, sel, lead, detour, plan_arg)
    if end == "failed" and last is not None and (phase := plan.find_phase(last.phase)) is not None:
        changed = changed_since(last) if changed_since is not None else None
        head = (f"{phase.display_name} failed (run {last.run_id}: {_reason(last)}) and its On fail is stop")
        if changed:
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            why = (f"{lead}{head}. Files changed since that run ({shown}), so running it again from its first step "
                   "may end differently.")
            return _action_for(plan, phase, "retry", why, next_argv(plan_arg, "--phase", phase.id, "--restart"), 0,
                               changed=[f"files: {', '.join(changed)}"])
        unknown = " (runbook cannot see code changes outside git)" if changed is None else ""
        why = (f"{lead}{head}. Nothing changed since: its commands, vars and `Pass:` are those it was judged "
               f"by, and no tracked file changed{unknown}, so a retry would repeat the fail. Change the code, "
               f"edit the phase, add a phase for the next idea, or follow the notes' next steps; to run it "
               f"again anyway: {shlex.join(next_argv(plan_arg, '--phase', phase.id, '--restart'))}")
        return NextAction(kind="nothing", why=why, outcome="failed", phase=phase.id, label=phase.display_name,
                          title=phase.title)
    if end == "finished":
        why = _sentence(sel.message.removeprefix("nothing to run: "))
        if failed_ids:
            latest = {r.phase: r for r in runs}
            names = ", ".join(f"{phase_label(latest[i].phase_label)} failed (run {latest[i].run_id})"
                              for i in failed_ids if i in latest)
            why += f" Along the way {names}."
        return NextAction(kind="nothing", why=lead + why, outcome="finished")
    return NextAction(kind="nothing", why=lead + _sentence(sel.message), outcome=end)


def _selected_action(plan: Plan, sel: Selection, lead: str, detour: str, argv: list[str],
                     plan_arg: str | None, unrecorded: frozenset[str]) -> NextAction:
    """The next action when the walk (or an unfinished detour) chose a phase to run. `unrecorded`: ids
    of runs a dead runbook left, not in the ledger yet (nothing to forget until `runbook next` records them)."""
    from runbook.plan.overrides import run_overrides

    phase, last = sel.phase, sel.last
    assert phase is not None
    why = _sentence(sel.message)
    extra: dict[str, Any] = {}
    if last is not None and sel.mode in ("resume", "changed", "rerun"):
        extra["run_id"] = last.run_id
    if sel.mode == "resume" and last is not None:
        overrides = run_overrides(last)
        if overrides:
            extra["overrides"] = overrides
            why += f" It resumes with the values run {last.run_id} was started with: {_sets(overrides)}."
    if sel.attempts is not None and sel.attempts.count:
        extra["attempts"] = sel.attempts.count
        extra["look_at"] = _look_at(last) if last is not None else []
        if sel.attempts.count == 1:
            why += " A second run that ends the same way with nothing changed stops these offers."
        else:
            why += (f" Its last {sel.attempts.count} runs ended {last.verdict if last else 'so'} the same way, but "
                    "files changed since, so it may end differently.")
    if sel.mode == "rerun" and last is not None and last.verdict == "inconclusive":
        missing = _missing(last)
        if missing:
            extra["look_at"] = missing + [x for x in extra.get("look_at", []) if x not in missing]
    if (last is not None and last.verdict == "interrupted" and sel.mode in ("resume", "changed")
            and last.run_id not in unrecorded):
        why += (f" To drop run {last.run_id} instead of resuming it: "
                f"{shlex.join(_forget_argv(plan_arg, last.run_id))}.")
    if phase.sweep:
        why += _sweep_text(plan, phase)
    return _action_for(plan, phase, _KIND[sel.mode], lead + why + detour, argv, sel.start, **extra)


def _sweep_text(plan: Plan, phase: Phase) -> str:
    """` It runs as a sweep of N points ...`: what `runbook next` does with a phase's `Sweep:`."""
    from runbook.errors import RunbookError
    from runbook.plan.grid import phase_points

    try:
        count = f" of {len(phase_points(plan, phase, plan.path))} points"
    except RunbookError:  # validate names the problem
        count = ""
    return (f" It runs as a sweep{count} (`Sweep: {'; '.join(phase.sweep)}`), each point a trial; "
            f"`Pick: {phase.pick}` then decides it.")


def _repeated_action(plan: Plan, phase: Phase, sel: Selection, lead: str, detour: str,
                     plan_arg: str | None) -> NextAction:
    """Nothing: the phase to resume or rerun ended the same failure twice, nothing changed since."""
    last = sel.last
    tried = sel.attempts
    assert last is not None and tried is not None
    ids = ", ".join(r.run_id for r in tried.runs[-3:])
    where = _reason(last)
    unknown = " (runbook cannot see code changes outside git)" if tried.unknown else ""
    force = shlex.join(next_argv(plan_arg, "--phase", phase.id))
    look = _look_at(last)
    why = (f"{lead}{phase.display_name} ended {last.verdict} the same way in its last {tried.count} runs ({ids}: "
           f"{where}), and nothing changed since: its text, commands, vars and `Pass:` are those they ran with, "
           f"and no tracked file changed{unknown}. Another identical run would end the same, so it is not offered. "
           f"Look at {_what_to_read(last.verdict)} ({_log_of(last) or 'runbook logs'}), then change the "
           f"code or edit the phase, and `runbook next` offers it again, or give a var another value "
           f"(`runbook next --set NAME=VALUE --yes`); to run it as it is anyway: {force}.{detour}")
    return NextAction(kind="nothing", why=why, outcome="repeated", phase=phase.id, label=phase.display_name,
                      title=phase.title, run_id=last.run_id, attempts=tried.count, look_at=look)


def _what_to_read(verdict: str) -> str:
    return {"inconclusive": "what its steps wrote and the Pass: line",
            "timeout": "the log, and whether its Timeout: gives it enough time"}.get(verdict, "the log")


def _sets(overrides: dict[str, str]) -> str:
    return " ".join(f"--set {k}={shlex.quote(v)}" for k, v in overrides.items())


def _forget_argv(plan_arg: str | None, run_id: str) -> list[str]:
    return ["runbook", "forget", *(["--plan", plan_arg] if plan_arg else []), run_id]


def _look_at(run: RunRecord) -> list[str]:
    """What to read before running a failed phase again: its failures (the failed comparison, the
    step that stopped with its log's last lines) and the log to open."""
    from runbook.contract import RunView

    view = RunView.of(run)
    out = [line.strip() for line in view.failures]
    log = _log_of(run)
    if log:
        out.insert(0, f"log {log}")
    return [line for line in out if line]


def _log_of(run: RunRecord) -> str | None:
    """The log of the step that stopped `run` (repo-relative), if it has one."""
    return next((s.log_path for s in run.steps if not s.skipped and not s.completed and s.log_path), None)


def _missing(run: RunRecord) -> list[str]:
    from runbook.contract import RunView

    return [line for line in RunView.of(run).failures if "no step wrote" in line or "no value for" in line]


def _detour_text(detour: RunRecord | None, plan_arg: str | None) -> str:
    """The ways out of a detour the plan waits on (select.py names it in the selection's message)."""
    if detour is None:
        return ""
    resume = shlex.join(next_argv(plan_arg, "--phase", detour.phase))
    return (f" A phase run out of order with --phase does not move the plan; run {detour.run_id} is resumed on "
            f"its own only when the flow has nothing else to run. To resume it now: {resume}; to drop it: "
            f"{shlex.join(_forget_argv(plan_arg, detour.run_id))}.")


def nothing_text(action: NextAction) -> str:
    """`runbook next`'s line when it runs nothing on its own: why, and the command if there is one."""
    first = action.why.split(" ", 1)[0]
    why = action.why[:1].lower() + action.why[1:] if first in ("The", "A", "Nothing") else action.why
    if action.kind == "retry" and action.command:
        return f"nothing to run on its own: {why}\n  to retry it: {action.command}"
    if action.kind == "running":
        return f"not now: {why}"
    return f"nothing to run: {why}"


def _sentence(text: str) -> str:
    text = text.strip()
    if text and text[0].islower():
        text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def _phase_views(plan: Plan, runs: list[RunRecord], holder: LockHolder | None, plan_rel: str) -> list[PhaseView]:
    from runbook.plan.criteria import metric_names

    latest: dict[str, RunRecord] = {}
    for record in runs:
        latest[record.phase] = record
    rows: list[PhaseView] = []
    live = holder is not None and holder.alive is not False and holder.plan in (None, plan_rel)
    for phase in plan.phases:
        run = latest.get(phase.id)
        note = None
        if live and holder is not None and holder.phase == phase.id:
            state = "running"
        elif run is None:
            state = "not_run"
            if phase.status is not None:
                note = (f"the plan's status block says {phase.status.verdict}"
                        + (f" (run {phase.status.run_id})" if phase.status.run_id else "")
                        + ", but the ledger has no run of this phase")
        elif run.verdict in RESUMABLE:
            state = "resumable"
        else:
            note = stale_reason(plan, phase, run)
            state = "stale" if note else _STATE[run.verdict]
        names = metric_names(phase.criterion.expr) if phase.criterion else []
        key = {}
        if run is not None:
            key = {n: run.metrics[n] for n in names if n in run.metrics}
            if not names:
                from runbook.contract import top_metrics

                key = dict(list(top_metrics(run.metrics).items())[:4])
        rows.append(PhaseView(
            id=phase.id, label=phase.display_name, title=phase.title, estimate=phase.estimate, state=state,
            verdict=run.verdict if run else None, run_id=run.run_id if run else None,
            finished=iso_utc(run.finished) if run else None, reason=_reason(run) if run else "",
            key_metrics=key, steps_done=sum(s.done for s in phase.steps), steps_total=len(phase.steps), note=note,
            **_decided(run),
        ))
    return rows


def _decided(run: RunRecord | None) -> dict[str, str | None]:
    """PhaseView's `decided_by` / `decided_how`: the run whose verdict the phase has, and why that one."""
    if run is None:
        return {"decided_by": None, "decided_how": None}
    by, how = run.deciding()
    return {"decided_by": by, "decided_how": how}


def _summary(action: NextAction, last: RunView | None, holder: LockHolder | None, plan_rel: str,
             failed: list[PhaseView], phases: list[PhaseView]) -> str:
    if action.kind == "running" and holder is not None:
        return "running: " + running_text(holder, plan_rel)
    if action.kind == "nothing":
        if action.outcome == "finished":
            tail = f"; failed along the way: {', '.join(p.label for p in failed)}" if failed else ""
            return "finished: nothing left to run" + tail
        if action.outcome == "failed":
            return f"stopped: {action.label} failed and its On fail is stop; nothing changed since"
        if action.outcome == "repeated":
            return (f"held back: {action.label} ended the same failure {action.attempts} times in a row and "
                    "nothing changed since")
        return f"nothing to run: {action.why}"
    if action.kind == "blocked":
        return f"blocked: {action.label or 'the next phase'} needs {', '.join(action.unmet_needs) or 'a phase'} to pass first"
    if action.kind == "retry" and action.changed:
        return f"stopped: {action.label} failed; files changed since, so it can be retried"
    lead = "not started" if last is None else f"last run {last.label} {last.verdict}"
    stale = " (its verdict is stale)" if any(p.state == "stale" and p.next for p in phases) else ""
    return f"{lead}; next: {action.label} ({action.phase}), {action.kind}{stale}"


def derive(
    plan: Plan,
    plan_rel: str,
    runs: list[RunRecord],
    *,
    lock: LockInfo | None = None,
    state_rel: str = "state",
    plan_arg: str | None = None,
    changed_since: ChangedSince | None = None,
    current_hash: Callable[[Phase], str] | None = None,
    unreadable: list[str] | None = None,
    live: LiveRun | None = None,  # of the lock's run
    pending: list[RunRecord] | None = None,
    reattach: dict[str, str] | None = None,
    root: Path | None = None,
    state_dir: Path | None = None,
    attempts: AttemptsOf | None = None,
) -> PlanState:
    """Each phase's state and the next action. `runs`: this plan's runs, oldest first (all of them,
    or only each phase's latest as `Workspace.latest_runs` gives them: the outcome is the same).
    `unreadable`: ledger files that could not be read; `runbook next` refuses to choose a phase
    while there are any (one could hide a pass), so the next action is then `blocked`.
    `pending`: runs whose runbook died before recording them, as `runbook next` will record them
    (verdict interrupted; runbook/store/live.py); `reattach`: run id -> the Slurm job `runbook next`
    re-attaches to instead. `attempts`: a phase's same failures in a row (runbook/run/attempts.py;
    default: counted in `runs`, with `changed_since`)."""
    from runbook.plan.writeback import phase_text_hash

    runs = [r for r in runs if r.plan == plan_rel and r.trial is None]  # a sweep's trials decide nothing
    pending = [r for r in pending or [] if r.plan == plan_rel and r.trial is None]
    if pending:
        runs = sorted(runs + pending, key=lambda r: (r.started, r.run_id))
    holder = holder_view(lock, plan, state_rel, live=live, root=root, state_dir=state_dir) if lock is not None else None
    if attempts is None:
        attempts = from_runs(runs, changed_since or (lambda _run: None))
    sel = select_phase(plan, runs, current_hash=current_hash or (lambda phase: phase_text_hash(plan.text, phase)),
                       attempts=attempts)
    phases = _phase_views(plan, runs, holder, plan_rel)
    failed = [p for p in phases if p.state == "failed"]
    action = _next_action(plan, runs, sel, holder, plan_rel, plan_arg, changed_since, [p.id for p in failed],
                          frozenset(r.run_id for r in pending))
    if unreadable and action.kind != "running":
        action = NextAction(
            kind="blocked",
            why=_sentence("The ledger has unreadable run records, and one could hide the verdict of a phase: "
                          f"{'; '.join(unreadable)}. `runbook next` refuses to choose a phase until each is restored "
                          "(git checkout -- FILE) or removed (git rm FILE)"),
        )
    if pending and action.kind in ("run", "resume", "retry", "blocked", "nothing"):
        action.why = _pending_text(pending, reattach or {}) + " " + action.why
    for row in phases:
        row.next = action.phase == row.id and action.kind != "nothing"
    known = {p.id for p in plan.phases}
    mine = [r for r in runs if r.phase in known]
    pending_ids = {r.run_id for r in pending}
    last = RunView.of(mine[-1], pending=mine[-1].run_id in pending_ids) if mine else None
    running = holder if holder is not None and holder.alive is not False else None
    view = PlanStateView(
        plan=plan_rel, title=plan.title, summary=_summary(action, last, running, plan_rel, failed, phases), phases=phases,
        next=action, running=running, last_run=last, failed=[p.id for p in failed],
    )
    return PlanState(view=view, selection=sel)


def _pending_text(pending: list[RunRecord], reattach: dict[str, str]) -> str:
    parts = []
    for run in pending:
        if run.run_id in reattach:
            parts.append(f"Run {run.run_id} ({run.phase}): {_reason(run)}. Its Slurm job {reattach[run.run_id]} may "
                         "still run: `runbook next` re-attaches to it (no new submission) and records the run once.")
        else:
            parts.append(f"Run {run.run_id} ({run.phase}) is interrupted: {_reason(run)}. `runbook next` records it "
                         "so, then resumes the phase.")
    return " ".join(parts)


def pending_runs(ws: Workspace, runs: list[RunRecord]) -> tuple[list[RunRecord], dict[str, str]]:
    """Runs of the workspace's plan whose runbook died unrecorded, as they will be recorded, and the
    Slurm jobs `runbook next` will re-attach to (runbook/store/live.py). Reads only."""
    ledger = ws.ledger()
    among = ledger.unrecorded_dirs()  # a live state lives in the folder of a run without a record
    if not among:  # the common case
        return [], {}
    from runbook.store.live import death_reason, interrupted_record, orphans

    ids = ledger.run_ids() | {r.run_id for r in runs}
    pending: list[RunRecord] = []
    reattach: dict[str, str] = {}
    for live in orphans(ws.state, ws.plan_rel, ids, among=among):
        record = live.record or interrupted_record(live, ws.root, death_reason(live))
        pending.append(record)
        job = live.job_for(live.step) if live.executor == "slurm" and live.step and live.record is None else None
        if job is not None:
            reattach[live.run_id] = job.job_id
    return pending, reattach


def for_workspace(
    ws: Workspace, runs: list[RunRecord] | None = None, problems: list[str] | None = None, *, holding_lock: bool = False
) -> PlanState:
    """`derive` for a `workspace.Workspace`: its plan, its ledger, its lock (with the run's live
    state), runs a dead runbook left unrecorded, its git.
    `runs`: as for `derive` (default: each phase's latest, from the ledger's index).
    `holding_lock`: the caller holds the run lock itself (`runbook next` between runs).
    Unreadable ledger files block the next action; they are added to `problems` (for warnings), or,
    when the caller passes `runs`, taken from the `problems` it collected while reading them."""
    if runs is None:
        unreadable: list[str] = []
        runs = ws.latest_runs(unreadable)
        if problems is not None:
            problems.extend(unreadable)
    else:  # the caller read the ledger and collected its problems
        unreadable = list(problems or [])
    lock = None if holding_lock else ws.lock_info()
    pending, reattach = pending_runs(ws, runs) if not holding_lock else ([], {})
    state = derive(
        ws.plan,
        ws.plan_rel,
        runs,
        lock=lock,
        state_rel=ws.rel(ws.state),
        plan_arg=ws.plan_arg,
        changed_since=lambda run: ws.changed_since(run.commit_before),
        unreadable=unreadable,
        live=ws.live_of(lock.run_id) if lock is not None and lock.run_id else None,
        pending=pending,
        reattach=reattach,
        root=ws.root,
        state_dir=ws.state,
        attempts=for_workspace_attempts(ws),
    )
    return _inputs_checked(ws, state)


def _inputs_checked(ws: Workspace, state: PlanState) -> PlanState:
    """The next action as `runbook next` will take it: a phase whose `Inputs:` are not what the deciding
    run of the phase that makes them left there is refused by `next` (runbook/run/inputs.py), so the
    action is `blocked` on that, with the first fix as its command. A stat compares first; files are
    hashed only when size, mtime or count differ."""
    action = state.view.next
    phase = ws.plan.find_phase(action.phase) if action.phase else None
    if phase is None or not phase.inputs or action.kind not in ("run", "resume", "retry", "rerun"):
        return state
    from runbook.run.inputs import stale_inputs

    problems, fixes = stale_inputs(ws, ws.plan, phase, quick=True)
    if not problems:
        return state
    argv = shlex.split(fixes[0].split("#", 1)[0]) if fixes else None
    blocked = _action_for(
        ws.plan, phase, "blocked",
        _sentence(f"{phase.display_name} reads `Inputs:` that are not what the deciding runs made, and `runbook "
                  f"next` refuses it until they are: {'; '.join(problems)}. Fixes: {'; or '.join(fixes)}"),
        argv, 0)
    for row in state.view.phases:
        row.next = row.id == phase.id
    state.view.next = blocked
    state.view.summary = f"blocked: {phase.display_name}'s inputs are not what the deciding runs made"
    return state
