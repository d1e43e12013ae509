"""The state of a run while it runs: `state/runs/<run-id>/live.json` (a `LiveRun`), with a heartbeat.

The runner writes it when a run starts and rewrites it (atomically) whenever something happens:
a step starts or ends, a cluster job is submitted, and every `heartbeat_s` seconds from a
heartbeat thread. It says which process runs the run (pid and its start time, host, boot), what
it runs (phase, the steps as planned, the current step and its log, the cluster job of each step),
what is done (each finished step's result, metrics included) and when the process last beat.
Once the run is recorded in the ledger the file is removed: the run record says it all.

Readers: runbook/run/planstate.py (status, show, brief, history show the run in progress: step,
elapsed, log tail, last heartbeat), `runbook logs`, `runbook cancel`, and `runbook next`, which
settles runs whose process died (`orphans`): a run of the Slurm executor whose job may still run
is continued (re-attached, same run id); any other is recorded as `interrupted`
(`interrupted_record`), its partial logs kept, and then resumed like any interrupted run.

A run is dead when its process is gone on this host (pid and start time, or a reboot since). On
another host runbook cannot look: such a run is shown with the age of its last heartbeat, and a
heartbeat older than `stale_after(heartbeat_s)` is reported as silent, never taken over.

The interval comes from $RUNBOOK_HEARTBEAT_S (default 10 s; tests set it low).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runbook.files import atomic_write_text
from runbook.formatting import iso, parse_iso, utc_now
from runbook.model import EnvFingerprint, Metrics, RunRecord, StepResult, Trial, merge_metrics
from runbook.store import procs
from runbook.store.ledger import run_dir, runs_dir, tail_lines

__all__ = [
    "JobRef",
    "LiveRun",
    "LiveWriter",
    "PlannedStep",
    "heartbeat_interval",
    "interrupted_record",
    "is_alive",
    "live_path",
    "live_runs",
    "orphans",
    "read_live",
    "stale_after",
]

LIVE_NAME = "live.json"
LIVE_SCHEMA_VERSION = 1
DEFAULT_HEARTBEAT_S = 10.0
LIVE_MAX_BYTES = 4 * 1024 * 1024


def seconds_from_env(name: str, default: float) -> float:
    """An interval in seconds from environment variable `name` (tests shorten them); `default`
    when it is unset, not a number, or outside 0.05 s .. 1 h."""
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if 0.05 <= value <= 3600 else default


def heartbeat_interval() -> float:
    return seconds_from_env("RUNBOOK_HEARTBEAT_S", DEFAULT_HEARTBEAT_S)


def stale_after(heartbeat_s: float) -> float:
    """Seconds without a heartbeat after which a run is reported as silent."""
    return max(3 * heartbeat_s, heartbeat_s + 5.0)


class PlannedStep(BaseModel):
    """A step as the run planned it: what runs, and whether it was done before this run."""

    step_id: str
    command: str
    skip: bool = False
    carried_metrics: Metrics = {}


class JobRef(BaseModel):
    """A cluster job runbook submitted for a step."""

    step_id: str
    job_id: str
    name: str  # the job name runbook gave it (runbook-<run>-<step>): proves the job is this run's
    submitted: str


class LiveRun(BaseModel):
    model_config = ConfigDict(extra="ignore")

    schema_version: int = LIVE_SCHEMA_VERSION
    run_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    plan: str
    plan_blob: str
    phase: str
    phase_label: str
    phase_text_hash: str
    criterion: str | None = None
    metric_names: list[str] = []
    started: str
    timeout_s: float | None = None
    commit_before: str | None = None
    dirty: bool | None = None
    dirty_files: list[str] = []
    env: EnvFingerprint | None = None
    executor: Literal["local", "slurm"] = "local"
    detached: bool = False
    # the process that runs it
    pid: int = Field(ge=1)
    pid_start: str | None = None
    host: str
    boot_id: str | None = None
    heartbeat: str
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    # what it runs and how far it got
    planned: list[PlannedStep] = []
    results: list[StepResult] = []  # steps finished (or skipped) so far, in order
    step: str | None = None  # the step running now
    step_started: str | None = None
    step_log: str | None = None  # its log, repo-relative
    jobs: list[JobRef] = []
    resources: dict[str, str] = {}  # slurm: what each job asks for (defaults merged)
    sbatch_args: list[str] = []
    record: RunRecord | None = None  # judged, and being recorded (ledger, plan, commit)
    supervisor_log: str | None = None  # repo-relative, detached runs only
    stopping: str | None = None  # why it is being stopped (a signal, a timeout), once it is
    vars: dict[str, str] = {}  # the vars its commands use, with their values (runbook/plan/overrides.py)
    overrides: list[str] = []  # those set with `runbook next --set`
    trial: Trial | None = None  # a sweep's point (`runbook sweep`): recorded as a trial whatever ends it
    outputs: list[str] = []  # the phase's `Outputs:`, vars resolved: their identity goes into the record

    def job_for(self, step_id: str) -> JobRef | None:
        found = None
        for job in self.jobs:
            if job.step_id == step_id:
                found = job
        return found

    def metrics_so_far(self) -> Metrics:
        return merge_metrics(self.results)

    def heartbeat_age(self, now: _dt.datetime | None = None) -> float | None:
        try:
            beat = parse_iso(self.heartbeat)
        except ValueError:
            return None
        return round(((now or utc_now()) - beat).total_seconds(), 1)


def live_path(state_dir: str | os.PathLike[str], run_id: str) -> Path:
    return run_dir(state_dir, run_id) / LIVE_NAME


def read_live(path: str | os.PathLike[str]) -> LiveRun | None:
    """The live state in `path`; None when there is none or it is not ours to read."""
    from runbook.files import NotReadable, read_bounded

    try:
        data = read_bounded(Path(path), LIVE_MAX_BYTES)
        return LiveRun.model_validate(json.loads(data.decode("utf-8")))
    except (OSError, NotReadable, UnicodeDecodeError, json.JSONDecodeError, ValidationError):
        return None


def live_runs(state_dir: str | os.PathLike[str], plan: str | None = None,
              among: Iterable[str] | None = None) -> list[LiveRun]:
    """Every run with a live state file (of `plan` when given), oldest first. `among`: look only in
    these run folders (the ledger's index names those without a record: `unrecorded_dirs`), instead
    of in every one of them."""
    folder = runs_dir(state_dir)
    if not folder.is_dir():
        return []
    found = []
    paths = folder.glob(f"*/{LIVE_NAME}") if among is None else (folder / name / LIVE_NAME for name in among)
    for path in paths:
        live = read_live(path)
        if live is not None and (plan is None or live.plan == plan):
            found.append(live)
    found.sort(key=lambda r: (r.started, r.run_id))
    return found


def is_alive(live: LiveRun) -> bool | None:
    """True / False for a run on this host; None when it runs on another host (runbook cannot look)."""
    if live.host != socket.gethostname():
        return None
    if live.boot_id is not None and live.boot_id != procs.boot_id():
        return False
    return procs.pid_alive(live.pid, live.pid_start)


def orphans(state_dir: str | os.PathLike[str], plan: str | None, recorded: set[str], *,
            clean: bool = False, among: Iterable[str] | None = None) -> list[LiveRun]:
    """Runs whose process died on this host before they were recorded (`recorded`: run ids in the
    ledger). With `clean` (the run lock held), a live file of a run already in the ledger (its
    runbook died between the ledger and removing it) is removed. `among`: as for `live_runs`."""
    out = []
    for live in live_runs(state_dir, plan, among):
        if live.run_id in recorded:
            if clean:
                with contextlib.suppress(OSError):
                    live_path(state_dir, live.run_id).unlink()
            continue
        if is_alive(live) is False:
            out.append(live)
    return out


def interrupted_record(live: LiveRun, root: Path, reason: str) -> RunRecord:
    """The run record of a run whose process died: what it finished, the step it was in (with its
    log's last lines), verdict `interrupted`."""
    steps = list(live.results)
    done = {r.step_id for r in steps}
    if live.step and live.step not in done:
        planned = next((p for p in live.planned if p.step_id == live.step), None)
        log = root / live.step_log if live.step_log else None
        job = live.job_for(live.step)
        steps.append(StepResult(
            step_id=live.step, command=planned.command if planned else "", started=live.step_started,
            log_path=live.step_log, log_tail=tail_lines(log) if log else [],
            job_id=job.job_id if job else None,
        ))
    metrics = merge_metrics(steps)
    now = utc_now()
    try:
        duration = round((now - parse_iso(live.started)).total_seconds(), 3)
    except ValueError:
        duration = None
    return RunRecord(
        run_id=live.run_id, plan=live.plan, plan_blob=live.plan_blob, phase=live.phase, phase_label=live.phase_label,
        phase_text_hash=live.phase_text_hash, started=live.started, finished=iso(now), duration_s=duration,
        steps=steps, metrics=metrics, criterion=live.criterion, verdict="interrupted", reason=reason,
        commit_before=live.commit_before, dirty=live.dirty, dirty_files=list(live.dirty_files), env=live.env,
        executor=live.executor, detached=live.detached, vars=dict(live.vars), overrides=list(live.overrides),
        trial=live.trial,
    )


def death_reason(live: LiveRun) -> str:
    """One line: which process died, when it last beat, where the partial log is."""
    who = "the supervisor" if live.detached else "runbook"
    at = f" during {live.step}" if live.step else ""
    log = f"; partial log kept in {live.step_log}" if live.step_log else ""
    return f"{who} (pid {live.pid}) died{at}, last heartbeat {live.heartbeat[11:19]} UTC{log}"


class LiveWriter:
    """Owns one run's live.json: every update rewrites it; a thread beats every `heartbeat_s`."""

    def __init__(self, state_dir: Path, live: LiveRun) -> None:
        self.path = live_path(state_dir, live.run_id)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.live = live
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.write()

    def write(self) -> None:
        with self._lock:
            self.live.heartbeat = iso(utc_now())
            text = self.live.model_dump_json(indent=2) + "\n"
            with contextlib.suppress(OSError):  # a full disk must not kill the run; the beat is lost
                atomic_write_text(self.path, text)

    def update(self, **fields: object) -> None:
        with self._lock:
            for name, value in fields.items():
                setattr(self.live, name, value)
        self.write()

    def add_result(self, result: StepResult) -> None:
        with self._lock:
            self.live.results = [*self.live.results, result]
            if self.live.step == result.step_id:
                self.live.step = None
        self.write()

    def add_job(self, job: JobRef) -> None:
        with self._lock:
            self.live.jobs = [*self.live.jobs, job]
        self.write()

    def start(self) -> LiveWriter:
        def beat() -> None:
            while not self._stop.wait(self.live.heartbeat_s):
                self.write()

        self._thread = threading.Thread(target=beat, name="runbook-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def remove(self) -> None:
        """The run is recorded: its live state is no longer needed."""
        self.stop()
        with contextlib.suppress(OSError):
            self.path.unlink()


def new_live(**fields: object) -> LiveRun:
    """A LiveRun for a run this process starts now (pid, host, boot, heartbeat filled in)."""
    pid = os.getpid()
    return LiveRun(
        pid=pid, pid_start=procs.proc_start(pid), host=socket.gethostname(), boot_id=procs.boot_id(),
        heartbeat=iso(utc_now()), heartbeat_s=heartbeat_interval(), **fields,
    )
