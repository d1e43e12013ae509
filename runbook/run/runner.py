"""`runbook next` end to end: select a phase, show it, run it, judge it, record it, write it back, commit.

The session (`runbook/run/session.py`, behind the click command `runbook/commands/next.py`) asks and
prints; the work is here:

- `select`: the phase to run (`runbook.run.select`, the same function runbook/run/planstate.py asks, so
  `runbook next` does what status and brief say), and `render_preview`: what will run;
- `run_selected`: one run of the selected phase under the run lock, returning its `RunRecord`.

The workspace (plan, root, state/, git) is runbook/store/workspace.py's `Workspace`; refusals are
`RunbookError`s.

Order inside a run: run id -> the plan's own uncommitted edits committed alone ("plan edits before run
<id>"), then runs a killed runbook left uncommitted ("record run <id> (left uncommitted)"), both by
`runbook.run.pending.commit_pending` -> environment fingerprint -> steps (`runbook.run.local`) -> verdict -> under the write lock:
ledger JSON; edits a person made to the plan while the run ran committed alone ("plan edits during
run <id>"); plan write-back; one commit of exactly the plan and the ledger file.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from runbook.errors import RunbookError
from runbook.files import atomic_write_text
from runbook.formatting import format_value, iso, parse_iso, utc_now
from runbook.model import Expr, Metrics, OutputInfo, Phase, Plan, RunRecord, Trial, merge_metrics
from runbook.plan import writeback
from runbook.plan.mdtext import to_lf
from runbook.redact import redact_credentials
from runbook.run.executor import Executor, Interrupts, StepContext, StepHooks, StepSpec, phase_executor
from runbook.run.local import judge
from runbook.run.select import Selection, select_phase
from runbook.store import gitops, ledger
from runbook.store.lock import RunLock, write_lock
from runbook.store.workspace import Workspace

if TYPE_CHECKING:
    from runbook.contract import Selected
    from runbook.plan.crossref import Refs
    from runbook.store.live import JobRef, LiveRun

Say = Callable[[str], None]


# ---- before running -----------------------------------------------------------------------


def old_phase_source(ws: Workspace, run: RunRecord, phase: Phase) -> str | None:
    """The phase's text as it was when `run` ran (from the plan blob in git), or None."""
    if not ws.git:
        return None
    from runbook.plan.parse import parse_plan

    old_text = gitops.show_blob(ws.root, run.plan_blob)
    if old_text is None:
        return None
    old_plan, _ = parse_plan(old_text, ws.plan_rel)
    old_phase = old_plan.find_phase(run.phase) if old_plan else None
    if old_phase is None:
        return None
    return writeback.phase_source(old_text, old_phase)


def select(ws: Workspace, plan: Plan, *, phase_ref: str | None, restart: bool,
           overrides: dict[str, str] | None = None) -> Selection:
    """The phase `runbook next` runs (runbook/run/select.py) on the workspace's ledger. `overrides`:
    the `--set` values given; other values than a repeated failure ran with make it a new attempt."""
    problems: list[str] = []
    runs = ws.latest_runs(problems)  # each phase's latest run: all the selection depends on
    if problems:
        # what runs next is decided from the ledger: a record that cannot be read could be the
        # pass of a days-long phase, which would silently run again
        first = problems[0].split(": skipped", 1)[0]
        rel = ws.rel(Path(first)) if first.startswith("/") else first
        raise RunbookError(
            "\n".join(problems) + "\nrefusing to choose a phase while the ledger has unreadable run records",
            "io", file=rel,
            hint=f"restore it (`git checkout -- {rel}`) or remove it (`git rm {rel}`), then run again",
        )

    def diff(run: RunRecord, phase: Phase) -> str | None:
        old = old_phase_source(ws, run, phase)
        if old is None:
            return None
        return writeback.phase_diff(old, writeback.phase_source(plan.text, phase), phase.display_name)

    from runbook.run import attempts

    tried = attempts.for_workspace(ws)
    if overrides:
        tried = attempts.with_other_values(tried, overrides)
    return select_phase(
        plan,
        runs,
        phase_ref=phase_ref,
        restart=restart,
        current_hash=lambda phase: writeback.phase_text_hash(plan.text, phase),
        old_diff=diff,
        attempts=tried,
    )


def resolved(plan: Plan, phase: Phase) -> list[str]:
    from runbook.plan.resolve import resolve_command

    return [resolve_command(step.command, plan.vars) for step in phase.steps]


def selected_view(plan: Plan, sel: Selection) -> Selected:
    from runbook.contract import Selected, StepLine

    phase = sel.phase
    assert phase is not None
    return Selected(
        phase=phase.id, label=phase.display_name, mode=sel.mode, why=sel.message,
        start_step=phase.steps[sel.start].id if sel.start < len(phase.steps) else None,
        steps=[StepLine(id=s.id, text=s.text, command=c, done=i < sel.start)
               for i, (s, c) in enumerate(zip(phase.steps, resolved(plan, phase), strict=True))],
        diff=sel.diff,
    )


def render_preview(ws: Workspace, plan: Plan, sel: Selection) -> str:
    """The phase exactly as written, then what will run (resolved), with changes marked."""
    phase = sel.phase
    assert phase is not None
    lines = [f"{ws.plan_rel}:{phase.span.start_line}: {sel.message}", ""]
    source = to_lf(plan.text[phase.span.start : phase.span.end]).rstrip("\n")
    lines += ["    " + line if line else "" for line in source.split("\n")]
    lines.append("")
    if sel.mode == "changed":
        lines.append(f"The text of {phase.display_name} changed since run {sel.last.run_id if sel.last else '?'}:")
        lines += ["    " + line for line in (sel.diff or "(the old text is not in git: no diff to show)\n").splitlines()]
        lines.append("")
    before = {s.step_id: s.command for s in sel.last.steps} if sel.last else {}
    lines.append("Will run (cwd = repository root, vars resolved):")
    commands = resolved(plan, phase)
    if not phase.steps:
        lines.append("    (no steps: the verdict comes from the criterion alone)")
    for i, (step, cmd) in enumerate(zip(phase.steps, commands, strict=True)):
        if i < sel.start:
            mark = "done, skipped"
        elif step.id in before and before[step.id] != redact_credentials(cmd):  # records keep no URL passwords
            mark = f"CHANGED since run {sel.last.run_id}" if sel.last else ""
        elif sel.last is not None and step.id not in before and sel.last.verdict in ("pass", "fail", "inconclusive"):
            mark = f"NEW since run {sel.last.run_id}"
        else:
            mark = ""
        head = f"  {step.id}" + (f"  ({mark})" if mark else "")
        lines.append(head)
        lines += ["      " + line for line in cmd.split("\n")]
    crit = phase.criterion
    lines.append(f"Pass: {crit.text.strip('`') if crit else '(none: passes when every step exits 0)'}")
    if phase.timeout_s:
        lines.append(f"Timeout: {phase.timeout_s:g}s")
    return "\n".join(lines)


# ---- running --------------------------------------------------------------------------------


@dataclass
class RunOptions:
    commit: bool = True
    echo: BinaryIO | None = None  # where step output streams (None: logs only)
    say: Say = print
    warn: Say = print
    grace_s: float = 5.0
    probe_env: bool | None = None  # None: RUNBOOK_ENV_PROBE decides
    interrupts: Interrupts | None = None
    run_id: str | None = None  # the id of the next fresh run (a detached caller chose it); None: a new one
    detached: bool = False  # this process is a supervisor (runbook/run/supervisor.py)
    supervisor_log: str | None = None  # repo-relative
    on_started: Callable[[LiveRun], None] | None = None  # a run's live state exists (the detach handshake)
    overrides: dict[str, str] = field(default_factory=dict)  # `--set NAME=VALUE` for this run
    trial: Trial | None = None  # the run is a sweep's point (runbook/run/sweep.py): it decides nothing by itself
    together: bool = False  # other runs of this process write the plan while it runs (`runbook sweep --jobs N`)


@dataclass
class RunResult:
    record: RunRecord
    plan_written: bool = True
    problems: list[str] = field(default_factory=list)  # write-back / commit trouble, already warned
    commit_failed: bool = False  # git refused the run's commit (a hook, signing, an ignored file)
    edited_during: str | None = None  # the commit of a person's plan edits made while the run ran
    reattached: bool = False  # a run whose runbook died, continued on its still-running cluster job


def _carried(sel: Selection, step_id: str) -> Metrics:
    if sel.last is None:
        return {}
    for result in sel.last.steps:
        if result.step_id == step_id and result.completed:
            return dict(result.metrics)
    return {}


def commit_message(record: RunRecord, metric_names: list[str]) -> str:
    shown = [f"{n}={format_value(record.metrics[n])}" for n in metric_names if n in record.metrics]
    detail = ", ".join(shown) if shown else " ".join(record.reason.split())[:80]
    subject = f"runbook: {record.phase} {record.verdict}" + (f" ({detail})" if detail else "")
    if record.trial is not None:
        point = " ".join(f"{k}={v}" for k, v in record.trial.point.items())
        subject += f" [trial {record.trial.index}/{record.trial.of} of sweep {record.trial.sweep}: {point}]"
    elif record.decision is not None:
        subject = (f"runbook: {record.phase} {record.verdict} decided by run {record.decision.run} "
                   f"({record.decision.why})")
    return subject


def _commit_plan_edits_first(
    ws: Workspace, run_id: str, opts: RunOptions, plan_text: str
) -> tuple[str, str | None, list[str] | None]:
    """Commit the plan's uncommitted edits, then runs a killed runbook left uncommitted, each alone,
    before run `run_id` (`runbook.run.pending`); (the plan text the run starts with, HEAD, the other
    tracked files with uncommitted changes: None outside git)."""
    if not ws.git:
        return plan_text, None, None
    if opts.commit:
        from runbook.run.pending import commit_pending

        try:
            with write_lock(ws.state):
                done = commit_pending(ws, f"run {run_id}", stop=_a_new_signal(opts), say=opts.say, warn=opts.warn)
        except gitops.GitStateError as exc:
            raise RunbookError(f"refusing to run: could not commit the plan's own edits first: {exc}",
                               "git_state") from None
        if done.runs:
            plan_text = ws.plan_file.read_text(encoding="utf-8")
    commit_before = gitops.head_commit(ws.root)
    state_rel = ws.rel(ws.state) + "/"
    dirty_files = [p for p in gitops.changed_tracked(ws.root) if p != ws.plan_rel and not p.startswith(state_rel)]
    if dirty_files:
        shown = ", ".join(dirty_files[:5]) + (f" and {len(dirty_files) - 5} more" if len(dirty_files) > 5 else "")
        opts.warn(f"uncommitted changes to {len(dirty_files)} tracked file(s) ({shown}): this run's numbers "
                  f"come from code that is not commit {gitops.short(commit_before) or '(none yet)'}; the run "
                  "record lists them (commit first to keep the record exact)")
    return plan_text, commit_before, dirty_files


def with_overrides(sel: Selection, given: dict[str, str] | None) -> tuple[Selection, dict[str, str], str | None]:
    """The overrides a selected run uses, and the selection they leave: a resumed run keeps the
    `--set` values its interrupted run had unless others are given; other values than those rerun
    the phase from its first step (the done steps ran with the old ones). Returns (selection,
    overrides, a note to print or None)."""
    from runbook.plan.overrides import run_overrides

    if sel.phase is None or sel.mode != "resume" or sel.last is None:
        return sel, dict(given or {}), None
    before = run_overrides(sel.last)
    hidden = [k for k, v in before.items() if redact_credentials(v) == v and ":***@" in v]
    if given is None and hidden:
        # the record keeps no URL passwords, so it cannot give the value back
        names = " ".join(f"--set {k}=..." for k in hidden)
        raise RunbookError(f"run {sel.last.run_id} was started with {names} holding a URL password, which the "
                           "run record does not keep; give the value again to resume it", "usage",
                           hint=f"runbook next {names}")
    if given is None:
        shown = " ".join(f"--set {k}={shlex.quote(v)}" for k, v in before.items())
        return sel, before, (f"resuming with the values run {sel.last.run_id} was started with: {shown}"
                             if before else None)
    if given == before:
        return sel, given, None
    why = (f"{sel.message}; but --set differs from what run {sel.last.run_id} ran with, so it runs from its "
           "first step")
    return Selection(sel.phase, 0, "restart", why, sel.last), given, None


def run_selected(ws: Workspace, plan: Plan, sel: Selection, lock: RunLock, opts: RunOptions) -> RunResult:
    """Run the selected phase once and record it everywhere. Call with the run lock held.

    `opts.overrides` (`--set`) replace plan vars for this run; `plan` is the plan as written."""
    from runbook.plan.criteria import metric_names as names_in
    from runbook.plan.outputs import output_paths
    from runbook.plan.overrides import effective, used_vars
    from runbook.run.envprint import fingerprint
    from runbook.store.live import PlannedStep, new_live

    phase = sel.phase
    assert phase is not None
    written = plan
    plan = effective(plan, opts.overrides)
    if phase.inputs:
        from runbook.run.inputs import refuse_stale_inputs

        refuse_stale_inputs(ws, plan, phase)  # before anything is written: a stale input refuses the run
    run_id, opts.run_id = opts.run_id or ledger.new_run_id(), None
    lock.set_run(run_id)
    lock.note(plan=ws.plan_rel, phase=phase.id, step=None)
    text_hash = writeback.phase_text_hash(plan.text, phase)
    metric_names = names_in(phase.criterion.expr) if phase.criterion else []

    plan_text, commit_before, dirty_files = _commit_plan_edits_first(ws, run_id, opts, plan.text)
    plan_blob = gitops.blob_hash(plan_text.encode("utf-8"))
    env = fingerprint(probe=opts.probe_env)

    specs = [
        StepSpec(step.id, cmd, skip=i < sel.start, carried_metrics=_carried(sel, step.id) if i < sel.start else {})
        for i, (step, cmd) in enumerate(zip(phase.steps, resolved(plan, phase), strict=True))
    ]
    executor = phase_executor(phase)
    resources, sbatch_args = _slurm_settings(ws, phase) if executor == "slurm" else ({}, [])
    live = new_live(
        run_id=run_id, plan=ws.plan_rel, plan_blob=plan_blob, phase=phase.id, phase_label=phase.label,
        phase_text_hash=text_hash, criterion=phase.criterion.display if phase.criterion else None,
        metric_names=metric_names, started=iso(utc_now()), timeout_s=phase.timeout_s,
        commit_before=commit_before, dirty=bool(dirty_files) if dirty_files is not None else None,
        dirty_files=dirty_files or [], env=env, executor=executor, detached=opts.detached,
        planned=[PlannedStep(step_id=s.step_id, command=s.command, skip=s.skip, carried_metrics=s.carried_metrics)
                 for s in specs],
        supervisor_log=opts.supervisor_log, resources=resources, sbatch_args=sbatch_args,
        vars=used_vars(phase, plan.vars), overrides=[name for name in opts.overrides if name in written.vars],
        trial=opts.trial, outputs=output_paths(phase.outputs, plan.vars),
    )
    # trials of a sweep run together write the plan back while this one runs: those are not a person's edits
    return _execute(ws, live, specs, lock, opts, started_from=None if opts.together else plan_text,
                    criterion=phase.criterion.expr if phase.criterion else None)


def _slurm_settings(ws: Workspace, phase: Phase) -> tuple[dict[str, str], list[str]]:
    from runbook.plan.resources import merge, parse_resources

    defaults = parse_resources(ws.config.slurm.resources) if ws.config.slurm.resources else {}
    return merge(defaults, phase.resources), list(ws.config.slurm.sbatch_args)


def continue_run(ws: Workspace, live: LiveRun, lock: RunLock, opts: RunOptions) -> RunResult:
    """Continue a run whose runbook died while its cluster job ran: re-attach to the job (no new
    submission), run the steps after it, judge and record the run once, under its own id."""
    from runbook.plan.criteria import CriterionError, parse_criterion
    from runbook.store.live import new_live

    lock.set_run(live.run_id)
    lock.note(plan=live.plan, phase=live.phase, step=live.step)
    me = new_live(**live.model_dump(exclude={"pid", "pid_start", "host", "boot_id", "heartbeat", "heartbeat_s"}))
    me.detached = live.detached or opts.detached  # started by a supervisor: a detached run, whoever ends it
    if opts.supervisor_log:
        me.supervisor_log = opts.supervisor_log
    specs = [StepSpec(p.step_id, p.command, skip=p.skip, carried_metrics=p.carried_metrics) for p in live.planned]
    started_from = gitops.show_blob(ws.root, live.plan_blob) if ws.git else None
    try:
        criterion = parse_criterion(live.criterion) if live.criterion else None
    except (CriterionError, RecursionError):
        criterion = None
    return _execute(ws, me, specs, lock, opts, started_from=started_from, criterion=criterion, reattach=True)


def _execute(ws: Workspace, live: LiveRun, specs: list[StepSpec], lock: RunLock, opts: RunOptions, *,
             started_from: str | None, criterion: Expr | None, reattach: bool = False) -> RunResult:
    """Run the steps with the run's executor (live state and heartbeat kept), judge, record."""
    from runbook.run.slurm import poll_interval
    from runbook.store.live import JobRef, LiveWriter

    writer = LiveWriter(ws.state, live).start()
    label = f"Phase {live.phase_label}"

    def announce(spec: StepSpec) -> None:
        lock.note(step=spec.step_id)
        writer.update(step=spec.step_id, step_started=iso(utc_now()),
                      step_log=ws.rel(ledger.run_dir(ws.state, live.run_id) / f"{spec.step_id}.log"))
        opts.say(f"\n── {label} · {spec.step_id} ──\n$ {spec.command}")

    def on_job(step_id: str, job_id: str, name: str) -> None:
        writer.add_job(JobRef(step_id=step_id, job_id=job_id, name=name, submitted=iso(utc_now())))
        opts.say(f"submitted Slurm job {job_id} for {step_id}")

    prior = {r.step_id: r for r in live.results} if reattach else {}
    jobs = {}
    if reattach and live.step is not None and (job := live.job_for(live.step)) is not None:
        jobs[live.step] = (job.job_id, job.name)
        opts.say(f"re-attaching to Slurm job {job.job_id} ({live.step}) of run {live.run_id}")
    started = parse_iso(live.started)
    elapsed_before = max((utc_now() - started).total_seconds(), 0.0) if reattach else 0.0
    ctx = StepContext(
        run_id=live.run_id, phase_id=live.phase, repo_root=ws.root, state_dir=ws.state, timeout_s=live.timeout_s,
        elapsed_s=elapsed_before, echo=opts.echo, interrupts=opts.interrupts, grace_s=opts.grace_s,
        hooks=StepHooks(announce=announce, on_pgid=lock.set_step, on_result=writer.add_result, on_job=on_job),
        prior=prior, jobs=jobs, resources=dict(live.resources), sbatch_args=list(live.sbatch_args),
        poll_s=poll_interval(ws.config.slurm.poll_s), bin_path=ws.config.runbook_bin,
    )
    if opts.on_started is not None:
        opts.on_started(live)
    t0 = time.monotonic()
    try:
        outcome = executor_for(live.executor).run_steps(specs, ctx)
    finally:
        writer.stop()
    metrics = merge_metrics(outcome.results)
    refs = _refs(ws, live.phase, criterion)
    if outcome.stopped:
        verdict, reason = outcome.stopped, outcome.reason
        if verdict == "interrupted" and (ledger.run_dir(ws.state, live.run_id) / "cancel-requested").exists():
            reason = f"cancelled (runbook cancel): {reason}"
    else:
        verdict, reason = judge(criterion, {**metrics, **refs.values}, outcome.results, refs.missing)
    record = RunRecord(
        run_id=live.run_id,
        plan=live.plan,
        plan_blob=live.plan_blob,
        phase=live.phase,
        phase_label=live.phase_label,
        phase_text_hash=live.phase_text_hash,
        started=live.started,
        finished=iso(utc_now()),
        duration_s=round(elapsed_before + time.monotonic() - t0, 3),
        steps=outcome.results,
        metrics=metrics,
        criterion=live.criterion,
        verdict=verdict,
        reason=reason,
        commit_before=live.commit_before,
        dirty=live.dirty,
        dirty_files=list(live.dirty_files),
        env=live.env,
        executor=live.executor,
        detached=live.detached,
        vars=dict(live.vars),
        overrides=list(live.overrides),
        ref_metrics=refs.values,
        ref_runs=refs.runs,
        trial=live.trial,
    )
    if live.outputs:
        record.outputs = _outputs(ws, record, live.outputs, opts)
    writer.update(record=record, step=None)  # judged: a runbook killed from here on is recorded as judged
    result = record_run(ws, record, live.metric_names, opts, started_from=started_from)
    result.reattached = reattach
    writer.remove()
    return result


def _outputs(ws: Workspace, record: RunRecord, paths: list[str], opts: RunOptions) -> list[OutputInfo]:
    """The run's `Outputs:` as it left them (size, mtime, hash); copies kept under `keep_outputs`
    (runbook.toml) for a judged run, so that `runbook choose` can put them back."""
    from runbook.store import outputs

    found = [outputs.identity(ws.root, path) for path in paths]
    folder = ws.config.keep_outputs
    if folder and record.verdict in ("pass", "fail", "inconclusive"):
        try:
            outputs.keep(ws.root, folder, record.run_id, found)
        except OSError as exc:
            opts.warn(f"the outputs of run {record.run_id} were not kept under {folder}/: {exc.strerror or exc}")
    return found


def _refs(ws: Workspace, phase_id: str, expr: Expr | None) -> Refs:
    """Other phases' metrics the criterion reads (`phase-0.acc`), from this plan's ledger."""
    from runbook.plan import crossref
    from runbook.plan.criteria import metric_names

    if expr is None or not any("." in name for name in metric_names(expr)):
        return crossref.Refs()
    plan = ws.plan
    phase = plan.find_phase(phase_id)
    if phase is None:
        return crossref.Refs()
    # each phase's latest counted run is all `resolve` reads
    return crossref.resolve(plan, phase, expr, ws.ledger().latest_runs(ws.plan_rel, verdicts=crossref.COUNTED))


def settle_orphans(ws: Workspace, lock: RunLock, opts: RunOptions) -> tuple[list[RunResult], list[RunResult]]:
    """Runs of this plan whose runbook died before recording them (runbook/store/live.py), settled under
    the run lock: (continued, recorded). A Slurm run whose current step has a job is continued on
    that job (`continue_run`); a judged run is recorded as judged; any other is recorded as
    `interrupted` with its partial logs, to be resumed like any interrupted run."""
    from runbook.store.live import orphans

    continued: list[RunResult] = []
    recorded: list[RunResult] = []
    ws.ledger_changed()  # under the run lock now: look at state/runs/ afresh
    ids = ws.ledger().run_ids()
    for live in orphans(ws.state, ws.plan_rel, ids, clean=True):
        job = _reattachable(live)
        if job is not None:
            if live.job_for(live.step or "") is None and live.step is not None:
                live.jobs = [*live.jobs, job]
            continued.append(continue_run(ws, live, lock, opts))
            continue
        recorded.append(record_dead(ws, live, opts))
    return continued, recorded


def record_dead(ws: Workspace, live: LiveRun, opts: RunOptions, why: str | None = None) -> RunResult:
    """Record a run whose runbook died (call under the run lock): as judged when it was judged,
    else `interrupted` with what it finished and the partial log of the step it was in."""
    from runbook.store.live import death_reason, interrupted_record, live_path

    reason = why or death_reason(live)
    record = live.record or interrupted_record(live, ws.root, reason)
    started_from = gitops.show_blob(ws.root, live.plan_blob) if ws.git else None
    opts.warn(f"run {live.run_id} ({live.phase}) was not recorded: {death_reason(live)}; recording it as "
              f"{record.verdict}")
    result = record_run(ws, record, live.metric_names, opts, started_from=started_from)
    live_path(ws.state, live.run_id).unlink(missing_ok=True)
    return result


def _reattachable(live: LiveRun) -> JobRef | None:
    """The cluster job of the run's current step, when there is one to re-attach to."""
    if live.executor != "slurm" or live.step is None or live.record is not None:
        return None
    job = live.job_for(live.step)
    if job is not None:
        return job
    from runbook.run.slurm import SlurmError, find_job, job_name
    from runbook.store.live import JobRef

    name = job_name(live.run_id, live.step)
    try:
        job_id = find_job(name)  # submitted, but runbook died before it wrote the id down
    except SlurmError:
        return None
    if job_id is None:
        return None
    return JobRef(step_id=live.step, job_id=job_id, name=name, submitted=live.step_started or live.started)


def commit_unrecorded(ws: Workspace, opts: RunOptions) -> list[str]:
    """Commit the runs a stopped `runbook next` recorded but never committed (killed, or its commit
    refused or stopped: a hook that hung), when there is nothing to run that would commit them; the
    plan's uncommitted edits go into a commit of their own first (`runbook.run.pending`). The ids of
    the runs committed ([] when none, or when git refuses again: then it says so)."""
    if not ws.git or not opts.commit:
        return []
    from runbook.run.pending import commit_pending

    with write_lock(ws.state):
        try:
            done = commit_pending(ws, "recording a run left uncommitted", stop=_a_new_signal(opts),
                                  say=opts.say, warn=opts.warn, edits=False)
        except gitops.GitStateError as exc:
            opts.warn(f"runs left uncommitted in {ws.rel(ledger.runs_dir(ws.state))}/ are still not committed: {exc}")
            return []
    return done.runs


def record_run(
    ws: Workspace, record: RunRecord, metric_names: list[str], opts: RunOptions, started_from: str | None = None
) -> RunResult:
    """Ledger, plan write-back and commit, under the write lock.

    `started_from`: the plan text the run started with. When a person edited the plan while the
    run ran, their edits are committed first, alone and named as such, so that the run's commit
    holds only what runbook wrote (and the run's verdict is not the subject of someone's edit)."""
    from runbook.plan.parse import parse_plan, read_text

    result = RunResult(record)
    series_file = _keep_series(ws, record, opts)
    with write_lock(ws.state):
        ledger_path = ledger.save_run(ws.state, record)
        ws.ledger_changed()
        text, problem = read_text(str(ws.plan_path))
        if problem is None and started_from is not None and text != started_from:
            result.edited_during = _commit_edits_during(ws, record, opts, text)
        current, problems = (None, [problem]) if problem else parse_plan(text, ws.plan_rel)
        errors = [p for p in problems if p and p.severity == "error"]
        if current is None or errors or current.find_phase(record.phase) is None:
            result.plan_written = False
            why = "; ".join(str(p) for p in errors[:3]) or f"{record.phase} is no longer in it"
            result.problems.append(
                f"{ws.plan_rel} was not updated: it no longer parses ({why}); the run is recorded in "
                f"{ws.rel(ledger_path)}"
            )
        else:
            history, earlier = ws.ledger().runs(ws.plan_rel, record.phase, limit=writeback.RESULTS_ROWS)
            try:
                new_text = writeback.apply_run(text, current, record.phase, record, history, file=ws.plan_rel,
                                               earlier=earlier, decides=record.trial is None)
            except writeback.HandEdited as exc:
                result.plan_written = False
                result.problems.append(f"{exc} The run is recorded in {ws.rel(ledger_path)}.")
            else:
                from runbook.run.restate import restate_phases

                new_text = restate_phases(ws, new_text, skip=(record.phase,), plan=current)  # a stale verdict says so
                if new_text != text:
                    try:
                        atomic_write_text(ws.plan_file, new_text)
                    except OSError as exc:
                        result.plan_written = False
                        result.problems.append(
                            f"{ws.plan_rel} was not updated: cannot write it ({exc.strerror or exc}); it is "
                            f"unchanged, and the run is recorded in {ws.rel(ledger_path)}"
                        )
        for msg in result.problems:
            opts.warn(msg)
        if ws.git and opts.commit:
            paths = [ws.rel(ledger_path)] + ([ws.rel(series_file)] if series_file else [])
            paths += [ws.plan_rel] if result.plan_written else []
            try:
                sha = gitops.commit_paths(ws.root, paths, commit_message(record, metric_names),
                                          stop=_a_new_signal(opts))
            except gitops.GitStateError as exc:
                msg = f"not committed: {exc}. Commit by hand: git add {' '.join(map(shlex.quote, paths))} && git commit"
                opts.warn(msg)
                result.problems.append(msg)
                result.commit_failed = True
            else:
                record.commit = sha
    return result


def _a_new_signal(opts: RunOptions) -> Callable[[], bool] | None:
    """True once a signal arrives after now (one during the steps already stopped them; the run is
    still committed): what stops a git command, a hook, that hangs while the run is committed."""
    interrupts = opts.interrupts
    if interrupts is None:
        return None
    seen = interrupts.count
    return lambda: interrupts.count > seen


def _keep_series(ws: Workspace, record: RunRecord, opts: RunOptions) -> Path | None:
    """The metric series the run's steps wrote, kept next to its record (runbook/store/series.py):
    written to `state/runs/<run-id>.series.jsonl`, summarised in `record.series`."""
    from runbook.store import series

    if record.series:  # already kept (a judged run recorded by a later runbook)
        kept = ledger.series_path(ws.state, record.run_id)
        return kept if kept.is_file() else None
    last = None
    if any(step.skipped for step in record.steps):  # their series are in the run they were done in
        index = ws.ledger()
        earlier = [r for r in index.rows(record.plan, record.phase)
                   if (r.started, r.run_id) < (record.started, record.run_id)]
        found_last = index.load(earlier[-1:])
        last = found_last[0] if found_last else None
    found, problems = series.collect(ws.state, record.run_id, record.steps, last)
    for problem in problems:
        opts.warn(problem)
    try:
        path = series.save(ws.state, record.run_id, found, problems)
    except OSError as exc:
        opts.warn(f"the metric series of run {record.run_id} were not kept: {exc.strerror or exc}")
        return None
    record.series = series.summary(found)
    return path


def _commit_edits_during(ws: Workspace, record: RunRecord, opts: RunOptions, text: str) -> str | None:
    """Commit a person's plan edits made while the run ran, alone; warn either way. An edit inside a
    block runbook wrote (`text` is the plan now) is flagged in the commit's subject and warned about."""
    from runbook.plan.parse import parse_plan

    subject = f"runbook: plan edits during run {record.run_id}"
    current, _ = parse_plan(text, ws.plan_rel)
    edited = writeback.hand_edits(current, ws.plan_rel) if current is not None else []
    if edited:
        where = ", ".join(f"{p.file}:{p.line}" for p in edited[:5])
        subject += f" (HAND-EDITED runbook blocks: {where})"
        for problem in edited:
            opts.warn(f"{problem.file}:{problem.line}: {problem.message}")
    sha = None
    if ws.git and opts.commit:
        try:
            sha = gitops.commit_paths(ws.root, [ws.plan_rel], subject, stop=_a_new_signal(opts))
        except gitops.GitStateError as exc:
            opts.warn(f"{ws.plan_rel} was edited while run {record.run_id} ran, and the edits could not be "
                      f"committed on their own ({exc}); they go into the run's commit")
            return None
    done = f"committed alone ({subject})" if sha else "left as they are"
    opts.warn(f"{ws.plan_rel} was edited while run {record.run_id} ran: the edits are {done}; the run was judged "
              "by the text it started with")
    return sha


def record_command(ws: Workspace, phase: Phase, record: RunRecord, plan_arg: str | None) -> str:
    """The `runbook record` line to run after a judged phase."""
    title = f"{phase.title}: {record.verdict}"
    parts = ["runbook", "record", shlex.quote(title), "--run", record.run_id]
    if plan_arg:
        parts += ["--plan", shlex.quote(plan_arg)]
    return " ".join(parts) + ' --lesson "..." --next "..."'


def executor_for(name: str | None) -> Executor:
    """The executor a phase's `Executor:` names (None: local)."""
    if name == "slurm":
        from runbook.run.slurm import SlurmExecutor

        return SlurmExecutor()
    from runbook.run.local import LocalExecutor

    return LocalExecutor()
