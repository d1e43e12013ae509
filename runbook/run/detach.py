"""`runbook next --detach`, the caller's side: start the supervisor, hand it the run lock, wait.

The caller (`runbook next --detach`, runbook/run/session.py) does everything a foreground `runbook
next` does before a run — validates the plan, shows the phase, checks git, takes the run lock (a
second caller gets exit 5 here) — then `start` runs the supervisor, `python -m runbook.run.supervisor
SPEC` (runbook/run/supervisor.py: what it does), in a session and process group of its own (stdin
/dev/null, stdout and stderr into `state/runs/<run>/supervisor.log`), hands it the run lock
(it inherits the caller's open state directory, whose flock is the lock, so the lock is never free
in between; `lock.adopt`: the lock file then names the supervisor's pid and start time) and waits on a pipe until
the run's live state exists (runbook/store/live.py: heartbeat, step, logs). Then the caller exits 0;
nothing of the run depends on it, its terminal or its ssh connection any more.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from runbook.errors import RunbookError

if TYPE_CHECKING:
    from runbook.store.lock import RunLock
    from runbook.store.workspace import Workspace

__all__ = ["HANDSHAKE_TIMEOUT_S", "Started", "SupervisorSpec", "start"]

HANDSHAKE_TIMEOUT_S = 120.0


class SupervisorSpec(BaseModel):
    """What the caller hands the supervisor (one JSON argument)."""

    cwd: str
    plan_opt: str | None = None
    phase_ref: str | None = None
    restart: bool = False
    until_stop: bool = False
    no_commit: bool = False
    sets: list[str] = []  # `--set NAME=VALUE` items
    run_id: str  # the id of its first fresh run
    caller_pid: int  # holds the run lock until the supervisor adopts it
    caller_start: str | None = None
    fd: int  # the write end of the handshake pipe
    lock_fd: int | None = None  # the caller's open state directory, whose flock is the run lock (inherited)
    supervisor_log: str  # repo-relative


@dataclass
class Started:
    pid: int  # the supervisor's
    run_id: str  # the run it started (or continued)
    phase: str
    supervisor_log: str  # repo-relative
    reattached: bool = False


def start(ws: Workspace, lock: RunLock, *, plan_opt: str | None, phase_ref: str | None, restart: bool, until_stop: bool,
          no_commit: bool, run_id: str, sets: list[str] | None = None) -> Started:
    """Start the supervisor, hand it the run lock, and wait until its run has started."""
    from runbook.store import procs
    from runbook.store.ledger import run_dir

    folder = run_dir(ws.state, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "supervisor.log"
    read_end, write_end = os.pipe()
    spec = SupervisorSpec(
        cwd=os.getcwd(), plan_opt=plan_opt, phase_ref=phase_ref, restart=restart, until_stop=until_stop,
        no_commit=no_commit, sets=list(sets or []), run_id=run_id, caller_pid=os.getpid(), caller_start=procs.proc_start(os.getpid()),
        fd=write_end, lock_fd=lock.anchor, supervisor_log=ws.rel(log_path),
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "runbook.run.supervisor", spec.model_dump_json()],
                cwd=os.getcwd(), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(write_end,) if lock.anchor is None else (write_end, lock.anchor),
            )
    finally:
        os.close(write_end)
    try:
        events = _handshake(read_end, proc)
    finally:
        os.close(read_end)
    started = next((e for e in events if e.get("event") == "started"), None)
    if started is None:
        code = _exit_code(proc)
        said = _tail(log_path)
        adopted = any(e.get("event") == "adopted" for e in events)
        where = f"; its log: {ws.rel(log_path)}"
        if code is None:
            raise RunbookError(
                f"the supervisor (pid {proc.pid}) did not start the run within {HANDSHAKE_TIMEOUT_S:g}s{where}"
                + (f"\n{said}" if said else ""), "internal")
        message = said or f"the supervisor exited {code} before the run started"
        if not adopted and code != 5:
            message = f"the supervisor could not take the run lock over: {message}"
        raise RunbookError(message + where, "locked" if code == 5 else "usage", exit_code=code)
    return Started(pid=proc.pid, run_id=started["run_id"], phase=started.get("phase", ""),
                   supervisor_log=ws.rel(log_path), reattached=bool(started.get("reattached")))


def _handshake(fd: int, proc: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    buffer = b""
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
            if events and events[-1].get("event") == "started":
                return events
    return events


def _exit_code(proc: subprocess.Popen[bytes]) -> int | None:
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


def _tail(path: Path, n: int = 20) -> str:
    from runbook.store.ledger import tail_lines

    return "\n".join(line for line in tail_lines(path, n) if line.strip())
