"""`runbook cancel`: stop the run in progress cleanly, or record one whose runbook died.

- A live run on this host (the run lock's holder: a foreground `runbook next` or a detached
  supervisor): its pid, proven the holder of THIS workspace's lock (`lock.holds`: the state
  directory's flock is held, the lock file names this state directory, the pid lives with the
  recorded start time) and with `runbook` in its command line, is sent SIGTERM, nothing else. A lock
  that fails the proof (copied with the repository, naming pid 1 or a foreign process) is never
  signalled. The holder does what it does on Ctrl-C: it stops the running step
  (its process group, SIGTERM then SIGKILL after the grace period; or its Slurm job with
  scancel, waiting until squeue no longer lists it), records the run as `interrupted`, writes the
  plan back and commits. `cancel` waits for that (`--wait`) and reports the recorded run.
- A run whose runbook died (its live state names a pid that is gone): `cancel` takes the stale run
  lock over (stopping only what provably belongs to the dead run, runbook/store/lock.py), cancels the
  run's Slurm jobs that are still queued or running (each proven by its job name
  `runbook-<run>-<step>`), and records the run as `interrupted`, partial logs kept.
- A holder on another host cannot be signalled from here: refused (exit 5), with the host named.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from runbook.contract import CancelResult, RunView
from runbook.errors import RunbookError

if TYPE_CHECKING:
    from runbook.store.workspace import Workspace

__all__ = ["CANCEL_MARK", "cancel"]

CANCEL_MARK = "cancel-requested"  # in state/runs/<run>/: the runner says "cancelled" instead of the signal's name

Say = Callable[[str], None]


def _is_runbook(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"runbook" in handle.read(65536)
    except OSError:
        return False


def cancel(ws: Workspace, *, wait_s: float, say: Say, warn: Say) -> CancelResult:
    from runbook.store.index import find_run
    from runbook.store.lock import holds, read_lock
    from runbook.store.procs import pid_alive

    info = ws.lock_info()
    if info is not None and info.host != socket.gethostname():
        raise RunbookError(
            f"run {info.run_id or '?'} runs on host {info.host}, not here: runbook signals only processes on "
            "its own host", "locked", file=ws.rel(ws.state / "lock"),
            hint=f"run `runbook cancel` on {info.host}")
    if info is not None and not holds(info, ws.state) and pid_alive(info.pid, info.pid_start):
        warn(f"{ws.rel(ws.state / 'lock')} names pid {info.pid}, which does not hold this workspace's run lock "
             "(a lock copied with the repository, or not runbook's); nothing was signalled")
    if info is not None and holds(info, ws.state):
        if not _is_runbook(info.pid):
            raise RunbookError(f"{ws.rel(ws.state / 'lock')} names pid {info.pid}, which is not a runbook process; "
                               "nothing was signalled", "io", hint="see `runbook status`")
        live = ws.live_of(info.run_id)
        who = "the supervisor" if live is not None and live.detached else "runbook next"
        if info.run_id:
            from runbook.store.ledger import run_dir

            with contextlib.suppress(OSError):
                (run_dir(ws.state, info.run_id) / CANCEL_MARK).write_text(f"{os.getpid()}\n", encoding="utf-8")
        os.kill(info.pid, signal.SIGTERM)
        how = f"SIGTERM to pid {info.pid} ({who}) of run {info.run_id or '?'}"
        say(f"sent {how}; waiting for it to stop the step and record the run")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:  # until it has recorded the run and exited
            if not pid_alive(info.pid, info.pid_start):
                break
            time.sleep(0.1)
        else:
            raise RunbookError(f"run {info.run_id or '?'} did not stop within {wait_s:g}s; it is still stopping "
                               f"(pid {info.pid})", "cancel_timeout",
                               hint="wait, and see `runbook status`; `runbook cancel` again sends another SIGTERM")
        record = find_run(ws.state, info.run_id) if info.run_id else None
        if record is not None:
            jobs = [s.job_id for s in record.steps if s.job_id and s.job_state == "CANCELLED"]
            return CancelResult(cancelled=True, how=how, run=RunView.of(record, recorded_in=record.commit), jobs=jobs)
        if pid_alive(info.pid, info.pid_start) or read_lock(ws.state / "lock") is None:
            return CancelResult(cancelled=True, how=how + "; it stopped before a run was recorded")
        # it died without recording: settle it below
    return _settle_dead(ws, say, warn)


def _settle_dead(ws: Workspace, say: Say, warn: Say) -> CancelResult:
    from runbook.run import runner
    from runbook.run.slurm import SlurmError, cancel_job
    from runbook.store.live import death_reason, orphans
    from runbook.store.lock import LockBusy, LockHeld, run_lock

    if not orphans(ws.state, ws.plan_rel, ws.ledger().run_ids()):
        return CancelResult(cancelled=False, how="nothing to cancel: no run in progress")
    try:
        with run_lock(ws.state, git_dir=ws.git_dir, warn=warn) as lock:
            ws.ledger_changed()  # under the run lock now: look at state/runs/ afresh
            dead = orphans(ws.state, ws.plan_rel, ws.ledger().run_ids(), clean=True)
            if not dead:
                return CancelResult(cancelled=False, how="nothing to cancel: no run in progress")
            opts = runner.RunOptions(commit=ws.git, say=say, warn=warn)
            live = dead[-1]
            for other in dead[:-1]:
                runner.record_dead(ws, other, opts)
            lock.set_run(live.run_id)
            jobs: list[str] = []
            notes: list[str] = []
            for job in live.jobs:
                try:
                    note = cancel_job(job.job_id, job.name)
                except SlurmError as exc:
                    note = str(exc)
                notes.append(note)
                if note.startswith("cancelled"):
                    jobs.append(job.job_id)
            why = f"cancelled by `runbook cancel` after {death_reason(live)}"
            if notes:
                why += "; " + "; ".join(notes)
            result = runner.record_dead(ws, live, opts, why)
            how = f"recorded run {live.run_id}, whose runbook had died" + (f"; {'; '.join(notes)}" if notes else "")
            return CancelResult(cancelled=True, how=how, run=RunView.of(result.record, recorded_in=result.record.commit),
                                jobs=jobs)
    except (LockHeld, LockBusy) as exc:
        raise RunbookError(str(exc), "locked") from None
