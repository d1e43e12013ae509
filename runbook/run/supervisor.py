"""The supervisor of a detached run: `python -m runbook.run.supervisor SPEC`, started by
runbook/run/detach.py's `start` (the caller's side of `runbook next --detach`).

It adopts the run lock from its caller, tells it over the handshake pipe when the run has started,
and is the same `runbook next` code (runbook/run/session.py `Session.loop` -> runner.py):
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
import sys
from typing import TYPE_CHECKING, TextIO

from runbook.errors import RunbookError
from runbook.run.detach import SupervisorSpec

if TYPE_CHECKING:
    from runbook.store.live import LiveRun

__all__ = ["main"]


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
    from runbook.run.session import NextRequest, Session
    from runbook.store.lock import LockError, adopt
    from runbook.store.workspace import Workspace

    ws = Workspace.open(spec.plan_opt)
    try:
        lock = adopt(ws.state, from_pid=spec.caller_pid, from_start=spec.caller_start, anchor=spec.lock_fd)
    except LockError as exc:
        raise RunbookError(str(exc), "locked") from None
    pipe.send("adopted", pid=os.getpid())
    try:
        runner = Session(NextRequest(plan_opt=spec.plan_opt, phase_ref=spec.phase_ref, restart=spec.restart,
                                     until_stop=spec.until_stop, yes=True, no_commit=spec.no_commit, as_json=False,
                                     sets=tuple(spec.sets)))

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
