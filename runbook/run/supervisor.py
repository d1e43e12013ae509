"""`runbook next --detach`: the phase runs under a supervisor that outlives the caller.

The caller (`runbook next --detach`) does everything a foreground `runbook next` does before a
run — validates the plan, shows the phase, checks git, takes the run lock (a second caller gets
exit 5 here) — then starts the supervisor, `python -m runbook.run.supervisor SPEC`, in a session and
process group of its own (stdin /dev/null, stdout and stderr into
`state/runs/<run>/supervisor.log`), hands it the run lock (`lock.adopt`: the lock then names
the supervisor's pid and start time) and waits on a pipe until the run's live state exists
(runbook/store/live.py: heartbeat, step, logs). Then the caller exits 0; nothing of the run depends on
it, its terminal or its ssh connection any more.

The supervisor is the same `runbook next` code (commands/next.py `_Next.loop` -> runner.py):
it settles runs a dead runbook left, runs the phase with the phase's executor (local or Slurm),
judges it, writes the results back and commits — exactly what a foreground run would have
written, plus `detached: true` in the run record. SIGTERM (what `runbook cancel` sends) stops the
running step (its process group, or its Slurm job with scancel) and records the run as
`interrupted`, as Ctrl-C does in the foreground. A supervisor killed with -9 leaves its live
state with a pid that is gone: the next runbook command that looks shows the run as interrupted,
and the next `runbook next` records it so (partial logs kept) and resumes it, or re-attaches to
its Slurm job.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import BaseModel

from runbook.errors import RunbookError

if TYPE_CHECKING:
    from runbook.store.live import LiveRun
    from runbook.store.lock import RunLock
    from runbook.store.workspace import Workspace

__all__ = ["Started", "SupervisorSpec", "main", "start"]

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
        fd=write_end, supervisor_log=ws.rel(log_path),
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "runbook.run.supervisor", spec.model_dump_json()],
                cwd=os.getcwd(), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, pass_fds=(write_end,),
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


# ---- the supervisor ------------------------------------------------------------------------------


class _Pipe:
    """The handshake pipe to the caller; closed once the run has started (the caller then exits)."""

    def __init__(self, fd: int) -> None:
        self.handle: TextIO | None = os.fdopen(fd, "w", encoding="utf-8")

    def send(self, event: str, **fields: object) -> None:
        if self.handle is None:
            return
        try:
            self.handle.write(json.dumps({"event": event, **fields}) + "\n")
            self.handle.flush()
        except OSError:
            self.close()

    def close(self) -> None:
        if self.handle is not None:
            with contextlib.suppress(OSError):
                self.handle.close()
            self.handle = None


def main(argv: list[str] | None = None) -> int:
    """The supervisor's life: adopt the lock, run `runbook next`'s loop, release the lock."""
    args = sys.argv[1:] if argv is None else argv
    spec = SupervisorSpec.model_validate_json(args[0])
    pipe = _Pipe(spec.fd)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # else replaced by something else: leave it as it is
            with contextlib.suppress(ValueError):
                stream.reconfigure(line_buffering=True)
    print(f"supervisor pid {os.getpid()} (started by pid {spec.caller_pid}) for run {spec.run_id}", flush=True)
    code = 2
    try:
        os.chdir(spec.cwd)
        code = _supervise(spec, pipe)
    except RunbookError as exc:
        print(exc.text(), flush=True)
        code = exc.exit_code
    except Exception as exc:  # a bug: the caller shows this line; the traceback only on request
        if os.environ.get("RUNBOOK_DEBUG"):
            import traceback

            traceback.print_exc()
        print(f"runbook supervisor: internal error ({type(exc).__name__}: {exc})", flush=True)
        code = 2
    finally:
        pipe.send("ended", code=code)
        pipe.close()
        print(f"supervisor exits {code}", flush=True)
    return code


def _supervise(spec: SupervisorSpec, pipe: _Pipe) -> int:
    from runbook.commands.next import _Next
    from runbook.store.lock import LockError, adopt
    from runbook.store.workspace import Workspace

    ws = Workspace.open(spec.plan_opt)
    try:
        lock = adopt(ws.state, from_pid=spec.caller_pid, from_start=spec.caller_start)
    except LockError as exc:
        raise RunbookError(str(exc), "locked") from None
    pipe.send("adopted", pid=os.getpid())
    try:
        runner = _Next(spec.plan_opt, spec.phase_ref, spec.restart, spec.until_stop, True, spec.no_commit, False,
                       spec.sets)

        def started(live: LiveRun) -> None:
            pipe.send("started", run_id=live.run_id, phase=live.phase, reattached=bool(live.jobs))
            pipe.close()

        runner.supervised(run_id=spec.run_id, supervisor_log=spec.supervisor_log, on_started=started)
        out = runner.loop(ws, lock, not spec.no_commit)
        return out.exit_code
    finally:
        lock.release()


if __name__ == "__main__":
    sys.exit(main())
