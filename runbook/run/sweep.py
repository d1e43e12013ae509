"""`runbook sweep` and `runbook choose`: a phase run over a grid of var values as trials, and the run
that decides the phase.

A sweep is a list of points (each a `--set` for one run: a grid from `--set lr=0.1,0.3 --set
hidden=8,64`, or explicit `--point 'lr=0.1,hidden=8'`). Each point runs as one run of the phase
through the same machinery as `runbook next --phase P --restart --set ... --yes`
(runbook/run/runner.py: lock, steps, judge, record, write-back, one commit), with
`RunRecord.trial` set: the trial is in the ledger, the phase's results table, history, diff and
plot, but it never becomes the phase's verdict by itself (runbook/store/index.py leaves trials out
of each phase's latest run, runbook/run/planstate.py too).

A trial decides its phase when it is chosen: `runbook choose RUN`, or `runbook sweep --pick
best:METRIC` once every point ran. Choosing records a copy of the trial under a new run id with
`RunRecord.decision` naming the trial and why; that copy is the phase's latest run, so status,
brief, next (the transition it follows), other phases' `phase.metric` references and the plan's
status block all follow the chosen trial without knowing about sweeps, and `RunRecord.deciding()`
names the trial. The choice is committed like a run.

The sweep's spec is written once (runbook/store/sweeps.py); which points are done is read from the
ledger, so a sweep killed with -9 continues with the points that have no finished trial
(`runbook sweep --resume`, or the same command again).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runbook.errors import RunbookError
from runbook.model import JUDGED, Decision, Phase, Plan, RunRecord, Trial
from runbook.plan.grid import direction_of, parse_pick, parse_points, resolve_pick
from runbook.run.holding import holding_run_lock, may_commit, refuse_hand_edits

if TYPE_CHECKING:
    from runbook.run.executor import Interrupts
    from runbook.run.runner import RunOptions, RunResult
    from runbook.run.session import Talk
    from runbook.store.lock import RunLock
    from runbook.store.sweeps import SweepSpec
    from runbook.store.workspace import Workspace

__all__ = ["SweepRequest", "SweepRun", "choose_run", "direction_of", "parse_pick", "parse_points", "pick_trial",
           "points_text", "refuse_swept_sets", "run_locked", "run_sweep", "spec_for_phase", "trials_of"]

CHOOSABLE = frozenset({"pass", "fail", "inconclusive"})  # a run that was judged: it can decide its phase


# ---- picking -----------------------------------------------------------------------------------


def pick_trial(trials: list[RunRecord], pick: str, phase: Phase) -> tuple[RunRecord, str]:
    """The trial `pick` names among `trials` (judged ones with a finite value of the metric; the
    passing ones when any passed; the first of equals in point order) and the why of the choice."""
    direction, metric = resolve_pick(pick, phase)

    def value(run: RunRecord) -> float | None:
        v = run.metrics.get(metric)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

    judged = [t for t in trials if t.verdict in CHOOSABLE and value(t) is not None]
    passed = [t for t in judged if t.verdict == "pass"]
    pool = passed or judged
    if not pool:
        raise RunbookError(f"--pick {pick}: no judged trial of the sweep wrote {metric}", "usage",
                           hint="choose one yourself: runbook choose RUN")
    sign = 1.0 if direction == "max" else -1.0
    best = max(pool, key=lambda t: sign * (value(t) or 0.0))  # max() keeps the first of equals
    among = f"{len(pool)} passing trial{'s' * (len(pool) != 1)}" if passed else f"{len(pool)} trials, none passed"
    why = f"{pick}: {direction} {metric} {value(best):g} of {among}"
    return best, why


# ---- choosing ------------------------------------------------------------------------------------


def choose_run(ws: Workspace, run: RunRecord, opts: RunOptions, *, by: str = "choose", why: str = "runbook choose",
               sweep: str | None = None) -> RunResult:
    """Make `run` (a trial, or any judged run of a phase) its phase's verdict: record a copy of it
    under a new run id with `decision` naming it, write it back and commit it. Call under the run lock."""
    from runbook.formatting import iso, utc_now
    from runbook.plan.criteria import metric_names
    from runbook.run.runner import record_run
    from runbook.store import gitops, ledger

    if run.decision is not None:  # the record of an earlier choice: choose what it chose
        found = ws.ledger().find(run.decision.run, ws.plan_rel)
        if found is None:
            raise RunbookError(f"run {run.run_id} chose run {run.decision.run}, which is not in the ledger",
                               "unknown_run")
        run = found
    if run.plan != ws.plan_rel:
        raise RunbookError(f"run {run.run_id} is a run of {run.plan}, not of {ws.plan_rel}", "usage",
                           hint=f"runbook choose {run.run_id} --plan {run.plan}")
    plan = ws.plan
    phase = plan.find_phase(run.phase)
    if phase is None:
        raise RunbookError(f"run {run.run_id} is a run of {run.phase}, which is no longer in {ws.plan_rel}",
                           "unknown_phase")
    if run.verdict not in CHOOSABLE:
        raise RunbookError(f"run {run.run_id} ended {run.verdict}: only a judged run (pass, fail, inconclusive) "
                           "can decide its phase", "usage", hint=f"runbook history {phase.id} --json lists its runs")
    _restore_outputs(ws, run, opts)
    now = iso(utc_now())
    copy = run.model_copy(deep=True, update={
        "run_id": ledger.new_run_id(), "started": now, "finished": now, "trial": None, "series": [], "commit": None,
        "decision": Decision(run=run.run_id, by="pick" if by == "pick" else "choose", why=why,
                             sweep=sweep or (run.trial.sweep if run.trial else None)),
        "commit_before": gitops.head_commit(ws.root) if ws.git else run.commit_before,
    })
    names = metric_names(phase.criterion.expr) if phase.criterion else []
    return record_run(ws, copy, names, opts)


def _restore_outputs(ws: Workspace, run: RunRecord, opts: RunOptions) -> None:
    """Put `run`'s `Outputs:` back in place from the copies kept for it (`keep_outputs`), unless
    what is there is already its; say so when they were not kept."""
    from runbook.store import outputs

    made = [o for o in run.outputs if o.kind != "missing"]
    if not made or all(outputs.identity(ws.root, o.path).hash == o.hash for o in made):
        return
    if not all(o.kept for o in made):
        opts.warn(f"the outputs of run {run.run_id} ({', '.join(o.path for o in made)}) were not kept "
                  "(keep_outputs in runbook.toml), and what is in place now is another run's: a phase that reads "
                  "them (`Inputs:`) refuses to run until they are made again")
        return
    try:
        done = outputs.restore(ws.root, run)
    except (ValueError, OSError) as exc:
        raise RunbookError(f"cannot put back the outputs of run {run.run_id}: {exc}", "io",
                           hint=f"make them again: runbook next --phase {run.phase} --restart --yes") from None
    opts.say(f"restored the outputs of run {run.run_id}: {', '.join(done)}")


# ---- the sweep -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepRequest:
    plan_opt: str | None = None
    phase_ref: str | None = None
    sets: tuple[str, ...] = ()
    points: tuple[str, ...] = ()
    pick: str | None = None
    jobs: int = 1
    resume: bool = False
    sweep_id: str | None = None  # with resume: that sweep (default: the latest unfinished one)
    base: dict[str, str] = field(default_factory=dict)  # `runbook next --set` values of vars the grid does not sweep
    yes: bool = False
    no_commit: bool = False
    as_json: bool = False


@dataclass
class SweepRun:
    """What a sweep did: its spec, the trials it ran now, all its trials, the choice it made."""

    spec: SweepSpec
    ran: list[RunRecord] = field(default_factory=list)
    trials: list[RunRecord] = field(default_factory=list)  # the latest finished trial of each done point, in point order
    pending: list[dict[str, str]] = field(default_factory=list)  # points still without a finished trial
    chosen: RunRecord | None = None  # the record of the choice `--pick` made
    resumed: bool = False
    interrupted: bool = False


def trials_of(ws: Workspace, spec: SweepSpec) -> dict[int, RunRecord]:
    """Point index (1-based) -> its latest trial that ran to an end (not `interrupted`)."""
    runs, _ = ws.ledger().runs(spec.plan, spec.phase)
    done: dict[int, RunRecord] = {}
    for run in runs:
        if run.trial is not None and run.trial.sweep == spec.sweep_id and run.verdict != "interrupted":
            done[run.trial.index] = run
    return done


def _spec_for(ws: Workspace, plan: Plan, req: SweepRequest, say: Callable[[str], None],
              from_plan: bool = False, fresh: bool = False) -> tuple[SweepSpec, bool]:
    """The sweep to run: (spec, resumed). A new one, or the same sweep started before and not
    finished (the same command again), or with --resume the one named (default: the latest unfinished).
    `from_plan` (a `Sweep:` phase under `runbook next`): a finished same sweep that no choice came
    from is the one too (stopped between its last trial and the pick: only the pick is left).
    `fresh`: always a new one (`runbook next --restart`)."""
    from runbook.formatting import iso, utc_now
    from runbook.store import ledger, sweeps

    if req.resume and not (req.sets or req.points):
        mine = [s for s in sweeps.load_all(ws.state) if s.plan == ws.plan_rel]
        unfinished = [s for s in mine if len(trials_of(ws, s)) < len(s.points)]
        if not unfinished and req.pick:  # `--resume --pick`: pick in the latest sweep, finished
            unfinished = mine[-1:]
        if req.sweep_id:
            unfinished = [s for s in sweeps.load_all(ws.state) if s.sweep_id == req.sweep_id]
            if not unfinished:
                raise RunbookError(f"no sweep {req.sweep_id!r} in {ws.rel(sweeps.sweeps_dir(ws.state))}/",
                                   "unknown_run")
        if req.phase_ref:
            phase = plan.find_phase(req.phase_ref)
            unfinished = [s for s in unfinished if phase is not None and s.phase == phase.id]
        if not unfinished:
            raise RunbookError("no unfinished sweep to resume", "usage",
                               hint="start one: runbook sweep PHASE --set NAME=V1,V2 --yes")
        spec = unfinished[-1]
        if req.pick:
            phase = plan.find_phase(spec.phase)
            if phase is not None:
                resolve_pick(req.pick, phase)  # refused now, not after the trials
        return spec, True
    if req.phase_ref is None:
        raise RunbookError("which phase? runbook sweep PHASE --set NAME=V1,V2 ...", "usage")
    phase = plan.find_phase(req.phase_ref)
    if phase is None:
        from runbook.errors import unknown_phase

        raise unknown_phase(plan, req.phase_ref, ws.plan_display)
    points = [{**req.base, **p} for p in parse_points(req.sets, req.points, plan, ws.plan_rel)]
    from runbook.plan.overrides import check

    for point in points:
        check(plan, phase, point)  # a value no quoting makes safe: refused before any trial runs
    if req.pick:
        resolve_pick(req.pick, phase)  # refused now, not after the trials
    spec = sweeps.SweepSpec(sweep_id=ledger.new_run_id(), plan=ws.plan_rel, phase=phase.id, points=points,
                            pick=req.pick, jobs=max(1, req.jobs), created=iso(utc_now()))
    for same in [] if fresh else reversed(sweeps.find_same(ws.state, spec)):
        if len(trials_of(ws, same)) < len(same.points):
            say(f"continuing sweep {same.sweep_id} (the same sweep, started {same.created}, not finished)")
            return same, True
        if from_plan and same.sweep_id not in _picked_from(ws, spec):
            say(f"sweep {same.sweep_id} (the same sweep, started {same.created}) ran every point; "
                "no trial of it decides the phase yet")
            return same, True
    return spec, False


def _picked_from(ws: Workspace, spec: SweepSpec) -> set[str]:
    """The sweeps a choice of `spec`'s phase was made from."""
    runs, _ = ws.ledger().runs(spec.plan, spec.phase)
    return {run.decision.sweep for run in runs if run.decision is not None and run.decision.sweep}


def spec_for_phase(ws: Workspace, plan: Plan, phase: Phase, base: dict[str, str], say: Callable[[str], None],
                   *, restart: bool = False) -> tuple[SweepSpec, bool]:
    """The sweep `runbook next` runs for a phase with `Sweep:`: its grid (with `base`, the `--set`
    values of other vars, in every point) and `Pick:`. The same sweep started before is continued
    when it did not finish, or picked from when it finished and was never picked from, as
    `runbook sweep` continues one; with `restart` it is a new sweep. Reads only; nothing is written."""
    req = SweepRequest(phase_ref=phase.id, sets=tuple(phase.sweep), pick=phase.pick, base=dict(base))
    return _spec_for(ws, plan, req, say, from_plan=True, fresh=restart)


def refuse_swept_sets(plan: Plan, phase: Phase, overrides: dict[str, str] | None, file: str) -> None:
    """`runbook next --set NAME=...` where NAME is a var the phase's `Sweep:` sweeps: refused (usage)."""
    from runbook.plan.grid import phase_points

    if not overrides or not phase.sweep:
        return
    swept = [name for name in phase_points(plan, phase, file)[0] if name in overrides]
    if swept:
        name = swept[0]
        raise RunbookError(
            f"--set {name}: {phase.display_name} sweeps {name} (`Sweep:` at {file}:{phase.field_lines.get('sweep', '?')}), "
            f"so `runbook next` runs the plan's points of it", "usage", file=file,
            hint=f"for other points: runbook sweep {phase.id} --set {name}=V1,V2 --pick {phase.pick} --yes; "
                 "or edit the `Sweep:` line")


def points_text(spec: SweepSpec, done: dict[int, RunRecord], pick: str | None) -> str:
    """The sweep's points, one a line, each `done` (with its run and verdict) or `to run`."""
    todo = len(spec.points) - len([i for i in done if i <= len(spec.points)])
    lines = [f"sweep {spec.sweep_id}: {spec.phase}, {len(spec.points)} point(s), {todo} to run"
             + (f", then pick {pick}" if pick else "")]
    lines += [f"  {'done' if i in done else 'to run':6}  {i}/{len(spec.points)}  {_point_text(p)}"
              + (f"  (run {done[i].run_id}, {done[i].verdict})" if i in done else "")
              for i, p in enumerate(spec.points, 1)]
    return "\n".join(lines)


def _point_text(point: dict[str, str]) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in point.items())


def run_sweep(req: SweepRequest, talk: Talk) -> SweepRun:
    """Run the sweep `req` asks for (new, or continued) under the run lock; pick when asked."""
    from runbook.run.executor import Interrupts
    from runbook.store.workspace import Workspace

    ws = Workspace.open(req.plan_opt)
    plan = ws.load_plan()
    for w in ws.warnings:
        talk.note(str(w))
    spec, resumed = _spec_for(ws, plan, req, talk.say)
    phase = plan.find_phase(spec.phase)
    if phase is None:
        raise RunbookError(f"sweep {spec.sweep_id} runs {spec.phase}, which is no longer in {ws.plan_rel}",
                           "unknown_phase")
    done = trials_of(ws, spec)
    todo = [(i, p) for i, p in enumerate(spec.points, 1) if i not in done]
    talk.say(points_text(spec, done, req.pick or spec.pick))
    if not req.yes:
        asked = not req.as_json and talk.interactive()
        if not asked:
            raise RunbookError("refusing to run without confirmation: "
                               + ("--json never asks" if req.as_json else "no terminal to ask"),
                               "confirmation_required", hint="pass --yes to run the sweep")
        if not talk.confirm(f"\nRun {len(todo)} trial(s) of {phase.display_name}?"):
            raise RunbookError("not confirmed: nothing ran", "not_confirmed")
    commit = may_commit(ws, req.no_commit, talk.warn)
    interrupts = Interrupts().__enter__()
    try:
        with holding_run_lock(ws, talk.warn) as lock:
            out = run_locked(ws, spec, lock, talk=talk, interrupts=interrupts, commit=commit,
                             pick=req.pick or spec.pick, jobs=req.jobs, plan_opt=req.plan_opt)
    finally:
        interrupts.__exit__(None, None, None)
    out.resumed = resumed
    return out


def run_locked(ws: Workspace, spec: SweepSpec, lock: RunLock, *, talk: Talk, interrupts: Interrupts, commit: bool,
               pick: str | None, jobs: int = 1, plan_opt: str | None = None) -> SweepRun:
    """Run the sweep `spec`'s points that have no finished trial, under the run lock the caller
    holds (`runbook sweep`, or `runbook next` on a phase with `Sweep:`), then pick when asked and
    every point ran: the choice is recorded as the phase's run (`SweepRun.chosen`)."""
    from runbook.run import runner
    from runbook.store import gitops, sweeps
    from runbook.store.lock import write_lock
    from runbook.store.workspace import Workspace

    phase = ws.load_plan().find_phase(spec.phase)
    if phase is None:
        raise RunbookError(f"sweep {spec.sweep_id} runs {spec.phase}, which is no longer in {ws.plan_rel}",
                           "unknown_phase")
    out = SweepRun(spec=spec)

    def options(point: dict[str, str] | None = None, trial: Trial | None = None) -> RunOptions:
        return runner.RunOptions(commit=commit, echo=talk.echo(), say=talk.say, warn=talk.warn,
                                 interrupts=interrupts, overrides=dict(point or {}), trial=trial)

    refuse_hand_edits(ws, ws.load_plan())
    runner.settle_orphans(ws, lock, options())  # a trial killed with -9 is recorded as interrupted
    # refused before the sweep's file is written: Needs: unmet, Inputs: not the deciding runs'
    current = ws.load_plan()
    first = runner.select(ws, current, phase_ref=spec.phase, restart=True, overrides=spec.points[0])
    if first.phase is None:
        raise RunbookError(first.message, "blocked", hint="run the phases it needs first")
    if first.phase.inputs:
        from runbook.plan.overrides import effective
        from runbook.run.inputs import refuse_stale_inputs

        refuse_stale_inputs(ws, effective(current, spec.points[0]), first.phase)
    path = sweeps.sweep_path(ws.state, spec.sweep_id)
    if not path.exists():
        with write_lock(ws.state):
            sweeps.save(ws.state, spec)
            if commit:
                gitops.commit_paths(ws.root, [ws.rel(path)], f"runbook: sweep {spec.sweep_id} of {spec.phase} "
                                    f"({len(spec.points)} points)")
    done = trials_of(ws, spec)
    todo = [(i, p) for i, p in enumerate(spec.points, 1) if i not in done]
    jobs = max(1, jobs)

    def run_point(i: int, point: dict[str, str], here: Workspace, echo: bool) -> RunRecord:
        current = here.load_plan()
        refuse_hand_edits(here, current)
        sel = runner.select(here, current, phase_ref=spec.phase, restart=True, overrides=point)
        if sel.phase is None:
            raise RunbookError(sel.message, "blocked", hint="run the phases it needs first")
        talk.say(f"\n── trial {i}/{len(spec.points)} of sweep {spec.sweep_id}: {_point_text(point)} ──")
        trial = Trial(sweep=spec.sweep_id, point=point, index=i, of=len(spec.points))
        opts = options(point, trial)
        if not echo:
            opts.echo = None  # several at once: their output goes to their logs only
            opts.together = True
        record = runner.run_selected(here, current, sel, lock, opts).record
        talk.say(f"trial {i}/{len(spec.points)}: {record.verdict} · {record.reason} · run {record.run_id}")
        return record

    if jobs == 1 or len(todo) <= 1:
        for i, point in todo:
            if interrupts.signum is not None:
                out.interrupted = True
                break
            record = run_point(i, point, ws, True)
            out.ran.append(record)
            if record.verdict == "interrupted" or interrupts.signum is not None:
                out.interrupted = True
                break
    else:
        out.ran += _run_together(todo, jobs, lambda i, p: run_point(i, p, Workspace.open(plan_opt), False),
                                 interrupts)
        out.interrupted = interrupts.signum is not None or any(r.verdict == "interrupted" for r in out.ran)
    ws.ledger_changed()
    done = trials_of(ws, spec)
    out.trials = [done[i] for i in sorted(done)]
    out.pending = [p for i, p in enumerate(spec.points, 1) if i not in done]
    if pick and not out.pending and not out.interrupted:
        best, why = pick_trial(out.trials, pick, phase)
        chosen = choose_run(ws, best, options(), by="pick", why=why, sweep=spec.sweep_id)
        out.chosen = chosen.record
        talk.say(f"\npicked run {best.run_id} ({_point_text(best.trial.point if best.trial else {})}): "
                 f"{why}; {phase.display_name} is now {best.verdict}")
    return out


def _run_together(todo: list[tuple[int, dict[str, str]]], jobs: int, run_point: Callable[[int, dict[str, str]], RunRecord],
                  interrupts: Interrupts) -> list[RunRecord]:
    """Run the points `jobs` at a time (threads: each trial's steps are subprocesses or cluster jobs,
    its recording serialised by the write lock), each judged and committed as it finishes; no new
    trial starts once a signal came. The trials in the order they finished."""
    import concurrent.futures as cf

    finished: list[RunRecord] = []
    failure: BaseException | None = None
    queue = list(todo)
    with cf.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="trial") as pool:
        running: set[cf.Future[RunRecord]] = set()
        while queue or running:
            while queue and len(running) < jobs and interrupts.signum is None and failure is None:
                i, point = queue.pop(0)
                running.add(pool.submit(run_point, i, point))
            if not running:
                break
            done, running = cf.wait(running, timeout=0.5, return_when=cf.FIRST_COMPLETED)
            for future in done:
                try:
                    finished.append(future.result())
                except BaseException as exc:  # noqa: BLE001 - raised once the others ended
                    failure = failure or exc
            if interrupts.signum is not None or failure is not None:
                queue.clear()
    if failure is not None:
        raise failure
    return finished


def exit_code(run: SweepRun) -> int:
    """0: every point ran (and the picked trial passed); 1: the picked trial failed; 3: inconclusive;
    4: a trial ended error / timeout / interrupted, or the sweep was stopped."""
    from runbook.model import EXIT_CODES

    if run.interrupted or run.pending:
        return 4
    if run.chosen is not None:
        return EXIT_CODES[run.chosen.verdict]
    return 4 if any(t.verdict not in JUDGED and t.verdict != "inconclusive" for t in run.trials) else 0
