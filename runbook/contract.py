"""The agent contract: every model `runbook ... --json` prints, and the envelope around them.

One module, so that the words mean one thing everywhere (docs/json.md has the reference):

- a phase is named by `id` ("phase-1", or its explicit `{#id}`) and `label` ("Phase 1");
- a run's `verdict` is one of pass, fail, inconclusive, error, timeout, interrupted;
- a phase's `state` is one of not_run, running, passed, failed, inconclusive, stale, resumable;
- the next action's `kind` is one of run, resume, rerun, retry, nothing, blocked, running;
- times are ISO 8601 UTC to the second, `2026-11-30T11:32:05Z`;
- a run's `commit` is the commit its code ran on (HEAD when it started); `recorded_in` is the
  commit that recorded it, known only to the `runbook next` that made it.

Every command's `--json` prints exactly one `Envelope` on stdout:
`{"schema_version", "runbook_version", "command", "ok", "exit_code", "warnings", "result"}` or, when
the command refused, `{..., "ok": false, "exit_code", "warnings", "error": {"code", "message", "file",
"line", "col", "hint", ...}}`. `output_schema(command)` is the JSON Schema of a command's envelope
(the MCP server uses them as tool output schemas); `python -m runbook.contract DIR` writes them all.
"""

from __future__ import annotations

import json
import math
import re
import signal as _signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from runbook.formatting import iso_utc
from runbook.model import (
    Decision,
    OutputInfo,
    Problem,
    RunRecord,
    SeriesInfo,
    StepResult,
    Trial,
    Verdict,
    criterion_display,
)
from runbook.plan.criteria import Comparison

SCHEMA_VERSION: Literal[1] = 1
V = TypeVar("V")

PhaseState = Literal["not_run", "running", "passed", "failed", "inconclusive", "stale", "resumable"]
NextKind = Literal["run", "resume", "rerun", "retry", "nothing", "blocked", "running"]
# For kind "nothing": finished (the end, or a stop after a pass), failed (stopped after a fail and
# nothing changed since), repeated (the phase to resume or rerun ended the same failure twice with
# nothing changed since), empty (no phases), loop (the transitions cycle).
Outcome = Literal["finished", "failed", "repeated", "empty", "loop"]
SelectMode = Literal["fresh", "resume", "rerun", "changed", "restart", "stale"]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- shared pieces -------------------------------------------------------------------------------


def phase_label(label: str) -> str:
    """The one label form: "Phase 1" (from the heading's label "1")."""
    return f"Phase {label}"


class ProblemView(Model):
    file: str
    line: int
    col: int
    message: str
    severity: Literal["error", "warning"]

    @classmethod
    def of(cls, problem: Problem) -> ProblemView:
        return cls(file=problem.file, line=problem.line, col=problem.col, message=problem.message,
                   severity=problem.severity)


class LockHolder(Model):
    """The process holding the run lock (`state/lock`): a run in progress."""

    pid: int
    host: str
    started: str | None  # when the lock was taken
    elapsed_s: float | None  # seconds since then
    alive: bool | None  # None: it runs on another host, so runbook cannot tell
    run_id: str | None = None
    plan: str | None = None  # repo-relative plan path of the run
    phase: str | None = None
    label: str | None = None
    step: str | None = None  # the step now running
    log_path: str | None = None  # that step's log, repo-relative
    # from the run's live state (runbook/store/live.py), when it has one
    detached: bool = False  # run by a supervisor (`runbook next --detach`)
    executor: str | None = None  # local or slurm
    step_started: str | None = None
    job_id: str | None = None  # the Slurm job of the step now running
    heartbeat: str | None = None  # when the run's process last beat
    heartbeat_age_s: float | None = None
    silent: bool = False  # no heartbeat for longer than three intervals
    steps_done: int = 0  # steps finished (or skipped) so far
    steps_total: int = 0
    metrics: dict[str, float | int | str | bool | None] = {}  # metrics so far, merged
    log_tail: list[str] = []  # the last lines of the running step's log
    supervisor_log: str | None = None


class StepView(Model):
    id: str
    command: str  # as run, vars resolved
    exit_code: int | None  # None: not started, or killed before it exited
    signal: str | None = None  # "SIGTERM" when a signal ended it
    skipped: bool = False  # done in an earlier run of the phase (resume)
    started: str | None = None
    finished: str | None = None
    duration_s: float | None = None
    log_path: str | None = None
    log_tail: list[str] = []
    metrics: dict[str, float | int | str | bool | None] = {}
    job_id: str | None = None  # the Slurm job that ran it
    job_state: str | None = None  # its final state (COMPLETED, FAILED, TIMEOUT, ...)

    @classmethod
    def of(cls, step: StepResult) -> StepView:
        sig = None
        if step.exit_code is not None and step.exit_code < 0:
            try:
                sig = _signal.Signals(-step.exit_code).name
            except ValueError:
                sig = f"signal {-step.exit_code}"
        return cls(
            id=step.step_id, command=step.command, exit_code=step.exit_code, signal=sig, skipped=step.skipped,
            started=iso_utc(step.started), finished=iso_utc(step.finished), duration_s=step.duration_s,
            log_path=step.log_path, log_tail=list(step.log_tail), metrics=dict(step.metrics),
            job_id=step.job_id, job_state=step.job_state,
        )


def top_metrics(metrics: Mapping[str, V]) -> dict[str, V]:
    """Merged metrics without the per-step "<step-id>.<name>" copies."""
    return {k: v for k, v in metrics.items() if not re.match(r"^step-[^.]+\.", k)}


class RunView(Model):
    """One run of a phase, from the ledger."""

    run_id: str
    plan: str
    phase: str
    label: str
    verdict: Verdict
    reason: str  # one line; failed comparisons marked with ✗
    started: str | None
    finished: str | None
    duration_s: float | None
    commit: str | None  # the commit the run's code ran on (HEAD when it started)
    recorded_in: str | None = None  # the commit that recorded it (only `runbook next` knows it)
    criterion: str | None  # the Pass: it was judged by, as written then
    comparisons: list[Comparison] = []  # each comparison of that criterion against the run's metrics
    failures: list[str] = []  # what went wrong, one line each: "✗ accept_len 1.31 >= 1.5", "step-2 exited 3: `cmd`"
    metrics: dict[str, float | int | str | bool | None] = {}  # merged, without the "step-N." copies
    vars: dict[str, str] = {}  # every var its commands used, with the value they ran with
    overrides: list[str] = []  # those set with `runbook next --set`
    ref_runs: dict[str, str] = {}  # phase id -> the run whose metrics its criterion read (`phase-0.acc`)
    series: list[SeriesInfo] = []  # metric series its steps wrote ($RUNBOOK_SERIES), summarised
    steps: list[StepView] = []
    executor: str = "local"  # where its steps ran: local or slurm
    detached: bool = False  # run by a supervisor (`runbook next --detach`)
    pending: bool = False  # not in the ledger yet: its runbook died; the next `runbook next` records it
    trial: Trial | None = None  # a sweep's point (`runbook sweep`): shown, never the phase's verdict by itself
    decision: Decision | None = None  # the record of a choice: the run chosen (`runbook choose`, `--pick`)
    outputs: list[OutputInfo] = []  # the phase's `Outputs:` as the run left them (size, mtime, hash)

    @classmethod
    def of(cls, record: RunRecord, recorded_in: str | None = None, pending: bool = False) -> RunView:
        comparisons = _comparisons(record)
        return cls(
            run_id=record.run_id, plan=record.plan, phase=record.phase, label=phase_label(record.phase_label),
            verdict=record.verdict, reason=record.reason, started=iso_utc(record.started),
            finished=iso_utc(record.finished), duration_s=record.duration_s, commit=record.commit_before,
            recorded_in=recorded_in, criterion=criterion_display(record.criterion) if record.criterion else record.criterion, comparisons=comparisons,
            failures=failures(record, comparisons), metrics=top_metrics(record.metrics),
            vars=dict(record.vars), overrides=list(record.overrides), ref_runs=dict(record.ref_runs),
            series=list(record.series),
            steps=[StepView.of(s) for s in record.steps], executor=record.executor, detached=record.detached,
            pending=pending, trial=record.trial, decision=record.decision, outputs=list(record.outputs),
        )




def _comparisons(record: RunRecord) -> list[Comparison]:
    if not record.criterion:
        return []
    from runbook.plan.criteria import CriterionError, evaluate, parse_criterion

    try:
        return evaluate(parse_criterion(record.criterion), {**record.metrics, **record.ref_metrics}).comparisons
    except (CriterionError, RecursionError, ValueError):
        return []


def failures(record: RunRecord, comparisons: list[Comparison]) -> list[str]:
    """What went wrong in a run, one line each (log lines indented by four spaces)."""
    from runbook.plan.criteria import FAILED_MARK

    out: list[str] = []
    if record.verdict == "fail":
        out += [FAILED_MARK + c.text for c in comparisons if c.held is False]
    elif record.verdict == "inconclusive":
        for c in comparisons:
            if c.held is not None:
                continue
            if c.operands or any(_phase_ref_like(n) for n in (c.metric, c.threshold_metric)):
                unknown = [n for n, v in c.operands.items() if v is None] or [str(c.metric or c.threshold_metric)]
                out.append(f"{c.text}: no value for {', '.join(str(n) for n in unknown)}")
            else:
                out.append(f"{c.text}: no step wrote {c.metric or c.threshold_metric}")
    for step in record.steps:
        if step.skipped:
            continue
        if step.exit_code not in (0, None):
            view = StepView.of(step)
            how = f"was killed by {view.signal}" if view.signal else f"exited {step.exit_code}"
            out.append(f"{step.step_id} {how}: `{step.command}`")
            out.extend(f"    {line}" for line in step.log_tail[-3:] if line.strip())
        elif step.started and step.exit_code is None and record.verdict in ("timeout", "interrupted"):
            out.append(f"{step.step_id} was running when the run ended ({record.verdict}): `{step.command}`")
    if not out and record.verdict != "pass" and record.reason:
        out.append(record.reason)
    return out


def _phase_ref_like(name: str | None) -> bool:
    """`phase-0.acc`-like: a dotted name that is not a step's own copy (`step-2.loss`)."""
    return name is not None and "." in name and not re.match(r"^step-[^.]+\.", name)


class StepLine(Model):
    """A step of the phase the next action runs."""

    id: str
    text: str
    command: str  # vars resolved: exactly what will run
    done: bool  # already done: skipped on resume


class NextAction(Model):
    """THE next action (runbook/run/planstate.py): what `runbook next` does now, as data."""

    kind: NextKind
    why: str  # one paragraph, self-contained
    phase: str | None = None  # the phase it acts on (for blocked: the blocked phase)
    label: str | None = None
    title: str | None = None
    estimate: str | None = None
    goal: str = ""
    # the command to run, as an argument list, argv[0] the running runbook by its absolute path (blocked: the
    # run of the first phase it needs); None: nothing runbook can run now
    argv: list[str] | None = None
    command: str | None = None  # the same with a bare `runbook`, shell-quoted, to paste
    outcome: Outcome | None = None  # kind "nothing": why nothing
    start_step: str | None = None  # the first step that will run (resume starts after the done ones)
    steps: list[StepLine] = []
    criterion: str | None = None
    unmet_needs: list[str] = []  # kind "blocked": phase ids that must pass first
    changed: list[str] = []  # kind "retry": what changed since the failed run
    run_id: str | None = None  # resume: the run it continues; rerun, nothing/repeated: the phase's latest run
    overrides: dict[str, str] = {}  # the `--set` values it runs with (a resume keeps its run's); `steps` show them
    attempts: int = 0  # resume, rerun, nothing/repeated: the phase's runs in a row that ended this same failure
    look_at: list[str] = []  # what to read first: the log, the failed step and its last lines, what was missing


class PhaseView(Model):
    """One row of the phase table."""

    id: str
    label: str
    title: str
    estimate: str | None = None
    state: PhaseState
    verdict: Verdict | None = None  # of its latest run
    run_id: str | None = None  # its latest run
    finished: str | None = None
    reason: str = ""
    key_metrics: dict[str, float | int | str | bool | None] = {}  # the metrics its Pass: names, latest run
    steps_done: int = 0
    steps_total: int = 0
    note: str | None = None  # why stale, a status block the ledger does not back, ...
    next: bool = False  # the next action acts on this phase
    # the run whose verdict this is, and why that one: "last run" (its latest run), "chosen by
    # `runbook choose`", "picked by best:acc ..." (a sweep's trial); run_id is then the record of the choice
    decided_by: str | None = None
    decided_how: str | None = None


class PlanStateView(Model):
    """Where a plan stands (`runbook status --json`)."""

    plan: str  # repo-relative
    title: str | None
    summary: str  # one line
    phases: list[PhaseView]
    next: NextAction
    running: LockHolder | None = None  # a run in progress (or a lock held on another host)
    last_run: RunView | None = None
    failed: list[str] = []  # ids of phases whose latest run failed


# ---- command results -----------------------------------------------------------------------------


class PlanCheck(Model):
    plan: str
    valid: bool
    phases: list[str]
    problems: list[ProblemView]


class ValidateResult(Model):
    valid: bool  # no plan has an error (exit 0); warnings do not count
    plans: list[PlanCheck]


class StatusResult(PlanStateView):
    pass


class ShowStep(Model):
    id: str
    text: str
    command: str  # as written
    resolved: str  # vars resolved
    done: bool
    line: int


class PhaseDetail(Model):
    id: str
    label: str
    title: str
    estimate: str | None
    goal: str
    text: str  # the phase's source, exactly as written
    line: int
    steps: list[ShowStep]
    criterion: str | None
    metrics: list[str]  # the metric names its Pass: reads
    on_pass: str | None
    on_fail: str | None
    needs: list[str]
    timeout_s: float | None
    state: PhaseView


class ShowResult(Model):
    plan: str
    phase: PhaseDetail | None  # None: no PHASE given and nothing is left to run (see `next`)
    next: NextAction


class Selected(Model):
    """What `runbook next` chose to run (or, with --dry-run, would run)."""

    phase: str
    label: str
    mode: SelectMode
    why: str
    start_step: str | None  # None: every step is done, only the verdict remains
    steps: list[StepLine]
    diff: str | None = None  # mode "changed": the phase's text since its last run


class DetachedView(Model):
    """`runbook next --detach`: the supervisor it started."""

    run_id: str
    phase: str
    pid: int  # the supervisor's
    supervisor_log: str  # repo-relative
    reattached: bool = False  # it continued a run on its still-running Slurm job


class NextResult(Model):
    plan: str
    dry_run: bool
    selected: Selected | None  # the first phase run (or that would run); None: nothing ran
    runs: list[RunView]  # the runs made, in order (with --detach: none; see `detached`)
    next: NextAction  # what comes after them
    settled: list[RunView] = []  # runs a dead runbook left unrecorded, recorded by this one first
    detached: DetachedView | None = None  # --detach: the supervisor now running the phase


class HistoryResult(Model):
    plan: str | None  # None: runs of every plan
    phase: str | None
    runs: list[RunView]  # oldest first (--desc: newest first), or as --sort asked: the last --limit runs (since --since)
    omitted: int = 0  # earlier runs of the plan / phase not listed (--limit, --since)
    running: LockHolder | None = None
    columns: list[str] = []  # the --metric columns asked for (each a metric, another phase's metric, or a var)
    sort: str | None = None  # the column the runs are sorted by (--sort), None: by when they started
    descending: bool = False  # --desc: highest first with a sort, else newest first
    warnings: list[str] = []  # --metric / --sort names no run has, with a "did you mean"


class PlotResult(Model):
    """`runbook plot --json`: the files written and what they show."""

    metric: str
    kind: Literal["series", "runs"]  # a metric's series by step, or a metric across runs
    png: str  # repo-relative (or absolute when outside the repository)
    svg: str | None
    runs: list[str]  # the run ids drawn
    points: int  # data points drawn
    curves: list[str] = []  # a series chart: each curve's legend label (`step-2` where several steps logged it)


class ValueChange(Model):
    """One value in two runs: a var, a metric, an environment field."""

    name: str
    a: float | str | None  # None: run A has none
    b: float | str | None
    delta: float | None = None  # b - a, when both are finite numbers
    rel: float | None = None  # (b - a) / |a|, when a is a number other than 0
    changed: bool


class CommandChange(Model):
    step: str
    a: str | None  # the command as run A ran it (vars resolved); None: no such step
    b: str | None
    diff: list[str] = []  # unified-diff lines (`-old`, `+new`, ` context`)


class ComparisonChange(Model):
    """The n-th comparison of each run's criterion, as judged then."""

    a: str | None
    b: str | None
    a_held: bool | None
    b_held: bool | None


class CodeDiff(Model):
    a: str | None  # the commit run A's code ran on
    b: str | None
    same: bool
    files: list[str] | None = None  # tracked files changed between the two commits; None: unknown
    a_dirty_files: list[str] = []  # uncommitted changes run A ran with
    b_dirty_files: list[str] = []


class DiffRun(Model):
    run_id: str
    plan: str
    phase: str
    label: str
    verdict: Verdict
    reason: str
    finished: str | None
    commit: str | None
    duration_s: float | None


class DiffResult(Model):
    """`runbook diff RUN_A RUN_B --json`: what differs from run A to run B."""

    a: DiffRun
    b: DiffRun
    same_phase: bool
    verdict: ValueChange
    vars: list[ValueChange]  # every var either run used (`changed` tells)
    commands: list[CommandChange]  # only steps whose commands differ
    metrics: list[ValueChange]  # every metric either run wrote, without the per-step copies
    ref_metrics: list[ValueChange] = []  # other phases' metrics their criteria read
    comparisons: list[ComparisonChange] = []
    code: CodeDiff
    env: list[ValueChange] = []  # only environment fields that differ
    duration: ValueChange


class LogsResult(Model):
    """`runbook logs --json`: the last lines of a step's log."""

    run_id: str
    phase: str
    step: str
    log_path: str  # repo-relative
    running: bool  # the run is in progress
    lines: list[str]
    job_id: str | None = None
    from_record: bool = False  # the log is not here (a fresh clone): `lines` are those its run record keeps


class CancelResult(Model):
    """`runbook cancel --json`."""

    cancelled: bool  # false: there was no run to cancel
    how: str  # what runbook did: "SIGTERM to pid 4242 (the supervisor)", "recorded the dead run", ...
    run: RunView | None = None  # the run as recorded (verdict interrupted), when it was
    jobs: list[str] = []  # Slurm jobs cancelled


WaitState = Literal["running", "finished", "died"]


class WaitResult(Model):
    """`runbook wait --json`: a run's state after waiting (at most --timeout seconds) for it to end."""

    run_id: str  # the run waited for
    state: WaitState  # running: still going; finished: recorded in the ledger; died: its runbook died unrecorded
    waited_s: float  # how long this call waited
    running: LockHolder | None = None  # the run in progress now (running: this run; finished: a later one, if any)
    run: RunView | None = None  # finished: as recorded; died: as the next `runbook next` records it (pending)


class MilestoneView(Model):
    title: str
    when: str
    body: str
    metrics: dict[str, float | str]  # "NaN" / "Infinity" for non-finite numbers
    run_id: str | None
    phase: str | None
    label: str | None
    verdict: Verdict | None
    commit: str | None  # the run's commit (its code), as in RunView


class RecordResult(Model):
    notes: str  # repo-relative path of the notes document
    created_notes: bool
    milestone: MilestoneView
    lessons_added: list[str]
    lessons_skipped: list[str]  # already in "Lessons learned"
    next_steps: list[str] | None  # the steps given (--next); None when none was
    next_steps_replaced: bool = False  # they replaced "Next steps" (--replace-next); else they were added
    next_steps_skipped: list[str] = []  # already in "Next steps", not added again
    commit: str | None  # the commit record made; None with --no-commit or when nothing changed
    plots: list[str] = []  # the charts (--plot) the milestone shows, committed with the notes


class MilestoneText(Model):
    heading: str
    text: str


class NoteStep(Model):
    text: str
    stale: str | None = None  # why it may be out of date (written before later runs, phase since passed)


class Brief(Model):
    """`runbook brief --json`: fields appear in the text brief in this order."""

    plan: str
    notes: str | None = None
    title: str | None = None
    goal: str = ""  # the plan's preamble prose
    framing: str = ""  # the notes' prose before their owned parts
    status: str = ""  # one line: where the plan stands
    phases: list[PhaseView] = []
    running: LockHolder | None = None
    last_run: RunView | None = None
    milestones: list[MilestoneText] = []  # newest last
    milestones_omitted: int = 0
    lessons: list[str] = []
    lessons_omitted: int = 0
    next_steps: list[NoteStep] = []  # the notes' "Next steps"
    next_steps_omitted: int = 0
    notes_updated: str | None = None  # when runbook record last wrote the notes
    next: NextAction
    max_chars: int | None = None  # the limit applied (None: nothing was cut)
    truncated: bool = False  # prose was shortened to fit


class InitResult(Model):
    root: str  # absolute
    created: list[str]  # paths relative to root
    plan: str
    notes: str | None
    git_init: bool  # `git init` was run
    mcp_config: dict[str, Any] = {}  # the `mcpServers` entry an agent host needs to start `runbook mcp` here


class ForgetResult(Model):
    forgotten: list[RunView]
    plan_updated: bool  # the plan's status block, checkboxes and results table were rewritten
    commit: str | None


class ResetResult(Model):
    phase: str
    label: str
    forgotten: list[RunView]
    plan_updated: bool
    commit: str | None


class SweepPoint(Model):
    index: int  # 1-based
    point: dict[str, str]  # the values this trial runs with (`--set`)
    run: RunView | None = None  # its latest trial that ran to an end; None: still to run


class SweepResult(Model):
    """`runbook sweep --json`: the sweep, each point and its trial, and the choice `--pick` made."""

    sweep_id: str
    plan: str
    phase: str
    spec: str  # the sweep's file, repo-relative (state/sweeps/<id>.json)
    resumed: bool  # an unfinished sweep was continued (--resume, or the same command again)
    interrupted: bool  # a signal or an interrupted trial stopped it; run it again to go on
    points: list[SweepPoint]
    ran: list[str]  # the trials this invocation ran, run ids in order
    pending: int  # points still without a finished trial
    pick: str | None = None
    chosen: RunView | None = None  # the record of the choice `--pick` made (its `decision` names the trial)
    next: NextAction


class ChooseResult(Model):
    """`runbook choose RUN --json`: the run chosen, and the record that makes it its phase's verdict."""

    chosen: RunView  # the trial (or earlier run) chosen
    record: RunView  # the record of the choice: the phase's latest run now
    next: NextAction


RESULTS: dict[str, type[BaseModel]] = {
    "init": InitResult,
    "validate": ValidateResult,
    "status": StatusResult,
    "show": ShowResult,
    "next": NextResult,
    "history": HistoryResult,
    "diff": DiffResult,
    "plot": PlotResult,
    "record": RecordResult,
    "brief": Brief,
    "forget": ForgetResult,
    "reset": ResetResult,
    "logs": LogsResult,
    "cancel": CancelResult,
    "wait": WaitResult,
    "sweep": SweepResult,
    "choose": ChooseResult,
}


# ---- the envelope --------------------------------------------------------------------------------


class ErrorInfo(Model):
    code: str  # a stable word: usage, no_plan, several_plans, plan_invalid, locked, ... (runbook/errors.py)
    message: str
    file: str | None = None
    line: int | None = None
    col: int | None = None
    hint: str | None = None
    problems: list[ProblemView] = []  # plan_invalid: every problem found
    lock: LockHolder | None = None  # locked: who holds the lock


T = TypeVar("T", bound=BaseModel)


class Envelope(Model, Generic[T]):
    schema_version: Literal[1] = SCHEMA_VERSION
    runbook_version: str  # the installed runbook-eagle's version
    command: str  # the verb (the schema of each verb fixes it)
    ok: bool  # true: `result` is there and `error` is not; false: the other way round
    exit_code: int
    warnings: list[str] = []  # every `warning:` line the command printed on stderr, in order
    result: T | None = None
    error: ErrorInfo | None = None


def runbook_version() -> str:
    """The installed distribution's version ("unknown" when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("runbook-eagle")
    except PackageNotFoundError:
        return "unknown"


def envelope_json(command: str, exit_code: int, result: BaseModel | None = None, error: ErrorInfo | None = None,
                  warnings: list[str] | None = None) -> str:
    """The one JSON document a `--json` command prints."""
    data: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "runbook_version": runbook_version(), "command": command,
                            "ok": error is None, "exit_code": exit_code, "warnings": list(warnings or [])}
    if error is None:
        data["result"] = _finite(result.model_dump(mode="json")) if result is not None else None
    else:
        data["error"] = error.model_dump(mode="json")
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False, default=str)


def _finite(value: object) -> object:
    """Non-finite numbers (a NaN metric) as the strings the ledger uses: "NaN", "Infinity", "-Infinity"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def output_schema(command: str) -> dict[str, Any]:
    """The JSON Schema of `runbook COMMAND --json`'s output (its envelope)."""
    if command not in RESULTS:
        raise KeyError(f"no command {command!r}; commands: {', '.join(RESULTS)}")
    model = Envelope.__class_getitem__(RESULTS[command])  # Envelope[...] of a model chosen at run time
    assert isinstance(model, type)
    schema = model.model_json_schema()
    # strict where the model cannot say it: the verb is fixed, the error code is one of the known
    # words, and `ok` decides which of result / error is there
    from runbook.errors import EXIT_CODES

    props = schema["properties"]
    props["command"] = {"const": command, "title": "Command", "type": "string"}
    schema["$defs"]["ErrorInfo"]["properties"]["code"] = {"enum": sorted(EXIT_CODES), "title": "Code", "type": "string"}
    schema["required"] = sorted({*schema.get("required", []), "schema_version", "runbook_version", "command", "ok",
                                 "exit_code", "warnings"})
    schema["if"] = {"properties": {"ok": {"const": True}}}
    schema["then"] = {"required": ["result"], "not": {"required": ["error"]}}
    schema["else"] = {"required": ["error"], "not": {"required": ["result"]}}
    schema["title"] = f"runbook {command} --json"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def schema_text(command: str) -> str:
    return json.dumps(output_schema(command), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_schemas(folder: str | Path) -> list[Path]:
    """Write `<command>.schema.json` for every command into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for command in RESULTS:
        path = folder / f"{command}.schema.json"
        path.write_text(schema_text(command), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # python -m runbook.contract docs/schemas
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
        print("usage: python -m runbook.contract [FOLDER]\n  writes every verb's --json schema into FOLDER "
              "(default docs/schemas)", file=sys.stderr)
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    for path in write_schemas(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas"):
        print(path)
