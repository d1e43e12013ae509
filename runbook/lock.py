"""The two locks of a state directory.

- The run lock `state/lock`: one `runbook next` at a time. A JSON file (schema `LockInfo`) created
  with O_EXCL, naming the holder (pid, host, start time, run id) and the process group of the step
  now running. A lock whose pid is dead on this host is stale: its leftover step group is killed,
  a `.git/index.lock` it left behind is removed, and the lock is taken over with a warning.
- The write lock `state/write.lock`: a short `fcntl.flock` around file writes and commits (plan,
  notes, ledger), so `runbook record` can write while a long phase runs.

Public surface: `run_lock(state_dir, ...)` and `write_lock(state_dir)` context managers;
`LockHeld` (another live run holds the lock), `LockCorrupt` (the lock file is not ours to read),
`WriteLockTimeout`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ValidationError

from runbook.atomic import atomic_write_text

LOCK_NAME = "lock"
WRITE_LOCK_NAME = "write.lock"


class LockInfo(BaseModel):
    """What `state/lock` holds."""

    pid: int
    host: str
    started: str  # ISO 8601 UTC
    run_id: str | None = None
    step_pgid: int | None = None
    pid_start: str | None = None  # the holder's start time from /proc (guards against pid reuse)
    plan: str | None = None  # repo-relative plan path of the run (for status while it runs)
    phase: str | None = None  # phase id of the run
    step: str | None = None  # id of the step now running


class LockError(Exception):
    """Base class of lock failures; the message says what to do."""


class LockHeld(LockError):
    def __init__(self, path: Path, info: LockInfo, *, alive_unknown: bool = False) -> None:
        self.path = path
        self.info = info
        where = f"pid {info.pid} on {info.host}"
        run = f", run {info.run_id}" if info.run_id else ""
        hint = (
            f"the holder runs on another host ({info.host}); if you are sure it has stopped, delete {path}"
            if alive_unknown
            else f"wait for it to finish, or stop it (kill {info.pid}); if it is gone, delete {path}"
        )
        super().__init__(f"another `runbook next` is running: {where}, since {info.started}{run}.\n  {hint}")


class LockCorrupt(LockError):
    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        super().__init__(
            f"{path}: not a runbook lock file ({detail}). If no `runbook next` is running, delete it."
        )


class WriteLockTimeout(LockError):
    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path = path
        super().__init__(
            f"could not take the write lock {path} within {timeout_s:g}s: another runbook command is "
            "writing. Try again; if nothing is running, the lock clears itself (it is an flock)."
        )


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _proc_start(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot (Linux), or None when unknown."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _is_zombie(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].startswith("Z")


def pid_alive(pid: int, pid_start: str | None = None) -> bool:
    """True when `pid` runs on this host (and, if `pid_start` is given, is still that process)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if _is_zombie(pid):
        return False
    if pid_start is not None:
        now = _proc_start(pid)
        if now is not None and now != pid_start:
            return False  # the pid was reused by another process
    return True


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, grace_s: float = 3.0) -> bool:
    """SIGTERM the process group, then SIGKILL after `grace_s`. True if it was alive."""
    if not group_alive(pgid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return True


def read_lock(path: Path) -> LockInfo | None:
    """The lock's content, None if there is no lock; raises LockCorrupt on a foreign file."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return LockInfo.model_validate(json.loads(raw))
    except (json.JSONDecodeError, ValidationError) as exc:
        if not raw.strip():
            # created by O_EXCL but not yet written, or its writer died right there
            raise LockCorrupt(path, "empty") from exc
        raise LockCorrupt(path, str(exc).splitlines()[0]) from exc


class RunLock:
    """A held run lock. `set_step(pgid)` records the running step's process group."""

    def __init__(self, path: Path, info: LockInfo) -> None:
        self.path = path
        self.info = info

    def set_run(self, run_id: str | None) -> None:
        self.info = self.info.model_copy(update={"run_id": run_id})
        self._write()

    def set_step(self, pgid: int | None) -> None:
        self.info = self.info.model_copy(update={"step_pgid": pgid})
        self._write()

    def note(self, **fields: str | None) -> None:
        """Record what the run is doing (`plan`, `phase`, `step`) for readers of the lock."""
        self.info = self.info.model_copy(update=fields)
        self._write()

    def _write(self) -> None:
        atomic_write_text(self.path, self.info.model_dump_json(indent=2) + "\n")

    def release(self) -> None:
        try:
            current = read_lock(self.path)
        except LockCorrupt:
            return
        if current is not None and current.pid == self.info.pid and current.host == self.info.host:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


Warn = Callable[[str], None]


def _create(path: Path, info: LockInfo) -> bool:
    """Create the lock file exclusively; False if it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(info.model_dump_json(indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return True


def _clear_stale(path: Path, stale: LockInfo, git_dir: Path | None, warn: Warn) -> None:
    msg = (
        f"taking over a stale run lock {path}: pid {stale.pid} (run {stale.run_id or '?'}, since "
        f"{stale.started}) is no longer running"
    )
    if stale.step_pgid and kill_group(stale.step_pgid):
        msg += f"; killed its leftover step process group {stale.step_pgid}"
    if git_dir is not None:
        started = _parse_time(stale.started)
        # git's own locks (the index, HEAD, a branch ref) made since the dead run started, and the
        # temporary index of its commit (named after its pid)
        candidates = [git_dir / "index.lock", git_dir / "HEAD.lock", *git_dir.glob("refs/heads/**/*.lock")]
        own = list(git_dir.glob(f"index.runbook.{stale.pid}*"))
        removed = []
        for path in candidates + own:
            try:
                mtime = path.stat().st_mtime
            except FileNotFoundError:
                continue
            if path in own or started is None or mtime >= started - 1:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                removed.append(str(path))
        if removed:
            msg += f"; removed the {', '.join(removed)} it left"
    warn(msg)


def _parse_time(iso: str) -> float | None:
    try:
        return _dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@contextlib.contextmanager
def run_lock(
    state_dir: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    git_dir: str | os.PathLike[str] | None = None,
    warn: Warn | None = None,
) -> Iterator[RunLock]:
    """Hold `state/lock` for the duration of the block.

    Raises LockHeld when a live run holds it (or one on another host), LockCorrupt when the file
    is not a lock we can read. A stale lock (dead pid on this host) is taken over after killing its
    leftover step group and removing a `.git/index.lock` it left; `warn` is told about it.
    """
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    path = state / LOCK_NAME
    host = socket.gethostname()
    me = LockInfo(pid=os.getpid(), host=host, started=_utc_now(), run_id=run_id, pid_start=_proc_start(os.getpid()))
    say = warn or (lambda _msg: None)
    gdir = Path(git_dir) if git_dir is not None else None

    if not _create(path, me):
        # Decide about the existing lock under the write lock, so two newcomers cannot both take
        # over the same stale lock (one would delete the other's fresh lock).
        with write_lock(state):
            try:
                held = read_lock(path)
            except LockCorrupt:
                # An empty file may be a lock being created this instant; give it a moment.
                time.sleep(0.2)
                held = read_lock(path)
            if held is not None:
                if held.host != host:
                    raise LockHeld(path, held, alive_unknown=True)
                if pid_alive(held.pid, held.pid_start):
                    raise LockHeld(path, held)
                _clear_stale(path, held, gdir, say)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            if not _create(path, me):
                raise LockHeld(path, read_lock(path) or me)
    lock = RunLock(path, me)
    try:
        yield lock
    finally:
        lock.release()


@contextlib.contextmanager
def write_lock(state_dir: str | os.PathLike[str], timeout_s: float = 30.0) -> Iterator[None]:
    """Hold the short write lock `state/write.lock` (an flock) for the duration of the block.

    Not re-entrant: do not nest it in one process. Raises WriteLockTimeout after `timeout_s`.
    """
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    path = state / WRITE_LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise WriteLockTimeout(path, timeout_s) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
