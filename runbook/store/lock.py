"""The two locks of a state directory.

- The run lock `state/lock`: one `runbook next` at a time. A JSON file (schema `LockInfo`) written
  whole to a temporary file and linked into place (so a crash or a full disk never leaves an empty
  or partial lock), naming the holder (pid and its start time, host, boot id, start time, run id) and
  the process group of the step now running with its leader's start time. A lock whose holder is
  dead on this host (or ran before the last reboot) is stale and is taken over with a warning.
  Before that, what provably belongs to the dead run is stopped (`runbook.store.procs`: its step group
  when the leader's recorded start time matches or a member carries the run's RUNBOOK_RUN_ID,
  and any process carrying that run id), and git's own locks it left are removed unless a live
  git process works in the repository. Nothing else is ever signalled: not group 1, not
  runbook's own group, not a group none of whose members is proven to be the run's.
- The write lock `state/write.lock`: a short `fcntl.flock` around file writes and commits (plan,
  notes, ledger), so `runbook record` can write while a long phase runs.

A lock file with nonsense fields (a pid or group <= 1, an unparsable time, a run id with odd
characters, more than 64 KiB, not a regular file) is refused as `LockCorrupt`: a hand-made or
cloned lock cannot steer runbook into signalling anything.

Public surface: `run_lock(state_dir, ...)` and `write_lock(state_dir)` context managers;
`LockHeld` (another live run holds the lock), `LockCorrupt` (the lock file is not ours to read),
`WriteLockTimeout`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runbook.files import NotReadable, atomic_write_text, read_bounded
from runbook.formatting import iso_utc, parse_iso, utc_now
from runbook.store import procs
from runbook.store.procs import group_alive, pid_alive

__all__ = [
    "LockCorrupt",
    "adopt",
    "LockError",
    "LockHeld",
    "LockInfo",
    "RunLock",
    "WriteLockTimeout",
    "group_alive",
    "pid_alive",
    "read_lock",
    "run_lock",
    "write_lock",
]

LOCK_NAME = "lock"
WRITE_LOCK_NAME = "write.lock"


_TICKS = r"^[0-9]{1,20}$"
LOCK_MAX_BYTES = 64 * 1024


class LockInfo(BaseModel):
    """What `state/lock` holds. Every field is checked: a lock is read before anything is signalled."""

    model_config = ConfigDict(extra="ignore")

    pid: int = Field(ge=1, le=2**22)
    host: str = Field(min_length=1, max_length=255, pattern=r"^[^\s/]+$")
    started: str  # ISO 8601 UTC
    run_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    step_pgid: int | None = Field(default=None, ge=2, le=2**22)
    step_start: str | None = Field(default=None, pattern=_TICKS)  # the step leader's start (clock ticks)
    pid_start: str | None = Field(default=None, pattern=_TICKS)  # the holder's start (guards against pid reuse)
    boot_id: str | None = Field(default=None, max_length=64)  # /proc/sys/kernel/random/boot_id
    plan: str | None = Field(default=None, max_length=4096)  # repo-relative plan path of the run (for status while it runs)
    phase: str | None = Field(default=None, max_length=200)  # phase id of the run
    step: str | None = Field(default=None, max_length=200)  # id of the step now running

    @field_validator("started")
    @classmethod
    def _iso_time(cls, value: str) -> str:
        if _parse_time(value) is None:
            raise ValueError(f"{value[:40]!r} is not an ISO 8601 time")
        return value


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
            else f"wait for it to finish (`runbook logs -f` follows it), or stop it with `runbook cancel` (its lock: {path})"
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


def read_lock(path: Path) -> LockInfo | None:
    """The lock's content, None if there is no lock; raises LockCorrupt on a foreign file."""
    try:
        data = read_bounded(path, LOCK_MAX_BYTES)
    except FileNotFoundError:
        return None
    except NotReadable as exc:
        raise LockCorrupt(path, str(exc)) from None
    except OSError as exc:
        raise LockCorrupt(path, f"cannot read it: {exc.strerror or exc}") from None
    if not data.strip():
        # created by O_EXCL but not yet written, or its writer died right there
        raise LockCorrupt(path, "empty")
    try:
        return LockInfo.model_validate(json.loads(data.decode("utf-8")))
    except UnicodeDecodeError:
        raise LockCorrupt(path, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise LockCorrupt(path, f"not JSON: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the file"
        value = json.dumps(first.get("input"), default=str)[:60]
        raise LockCorrupt(path, f"{where} = {value}: {first['msg']}") from None


class RunLock:
    """A held run lock. `set_step(pgid)` records the running step's process group."""

    def __init__(self, path: Path, info: LockInfo) -> None:
        self.path = path
        self.info = info

    def set_run(self, run_id: str | None) -> None:
        self.info = self.info.model_copy(update={"run_id": run_id})
        self._write()

    def set_step(self, pgid: int | None) -> None:
        """Record the running step's process group and its leader's start time (None: no step)."""
        start = procs.proc_start(pgid) if pgid else None
        self.info = self.info.model_copy(update={"step_pgid": pgid, "step_start": start})
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
    """Create the lock file exclusively and whole; False if it exists.

    The content is written and fsynced in a temporary file beside it, which is then hard-linked to
    `path` (the link fails when `path` exists, as O_EXCL would): a crash or a full disk leaves no
    lock or a complete one, never an empty or partial one that blocks the workspace."""
    _remove_dead_temps(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(info.model_dump_json(indent=2) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _remove_dead_temps(path: Path) -> None:
    """Remove the temporary lock files of processes that died between writing and linking them
    (`.lock.PID.N.tmp`, kill -9 in that instant), so they never linger untracked in the repository."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _clear_stale(path: Path, stale: LockInfo, git_dir: Path | None, warn: Warn) -> None:
    msg = (
        f"taking over a stale run lock {path}: pid {stale.pid} (run {stale.run_id or '?'}, since "
        f"{stale.started}) is no longer running"
    )
    msg += _stop_leftovers(stale)
    if git_dir is not None:
        msg += _clear_git_locks(stale, git_dir)
    warn(msg)


def _same_boot(info: LockInfo) -> bool:
    return info.boot_id is None or info.boot_id == procs.boot_id()


def _stop_leftovers(stale: LockInfo) -> str:
    """Stop what provably belongs to the dead run; a sentence for the warning."""
    if not _same_boot(stale):
        return "; the machine restarted since, so nothing of that run is left to stop"
    since = _parse_time(stale.started)
    group = stale.step_pgid
    leader = (group, stale.step_start) if group and stale.step_start else None

    def find() -> list[procs.Proc]:
        return procs.proven_run_processes(stale.run_id, since=since, leader=leader)

    groups = [group] if group and procs.safe_to_signal_group(group) else []
    stopped = procs.terminate_proven(find, groups=groups)
    parts = []
    if stopped:
        shown = ", ".join(f"group {-x}" if x < 0 else f"pid {x}" for x in stopped)
        parts.append(f"stopped what was left of that run ({shown})")
    if group and -group not in stopped and group_alive(group):
        why = (
            "it holds runbook itself" if not procs.safe_to_signal_group(group)
            else f"none of its processes is provably from run {stale.run_id or '?'}"
        )
        parts.append(f"left process group {group} alone: {why}")
    return "".join(f"; {p}" for p in parts)


def _work_tree(git_dir: Path) -> Path:
    """The work tree of a git directory (a linked worktree names its `.git` file in `gitdir`)."""
    pointer = git_dir / "gitdir"
    with contextlib.suppress(OSError, ValueError):
        if pointer.is_file():
            return Path(pointer.read_text(encoding="utf-8").strip()).parent
    return git_dir.parent


def _clear_git_locks(stale: LockInfo, git_dir: Path) -> str:
    """Remove git's locks the dead run left (never while a live git works here); a sentence."""
    started = _parse_time(stale.started)
    # git's own locks (the index, HEAD, a branch ref) made since the dead run started
    candidates = [git_dir / "index.lock", git_dir / "HEAD.lock", *git_dir.glob("refs/heads/**/*.lock")]
    fresh = []
    for lock in candidates:
        with contextlib.suppress(FileNotFoundError):
            if started is None or lock.stat().st_mtime >= started - 1:
                fresh.append(lock)
    removed: list[str] = []
    kept = ""
    if fresh:
        busy = procs.git_processes_in(_work_tree(git_dir), git_dir)
        if busy:
            pids = ", ".join(str(p.pid) for p in busy[:5])
            kept = f"; left {', '.join(map(str, fresh))} alone: a live git process works here (pid {pids})"
            fresh = []
    # the temporary index of its commit is named after its pid
    own = [] if pid_alive(stale.pid) else list(git_dir.glob(f"index.runbook.{stale.pid}*"))
    for lock in fresh + own:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
            removed.append(str(lock))
    return (f"; removed the {', '.join(removed)} it left" if removed else "") + kept


def _parse_time(iso: str) -> float | None:
    try:
        return parse_iso(iso).timestamp()
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
    is not a lock we can read or its fields are nonsense. A stale lock (dead pid on this host) is
    taken over after stopping what provably belongs to the dead run and removing git locks it
    left; `warn` is told about it.
    """
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    path = state / LOCK_NAME
    host = socket.gethostname()
    me = LockInfo(
        pid=os.getpid(),
        host=host,
        started=iso_utc(utc_now()),
        run_id=run_id,
        pid_start=procs.proc_start(os.getpid()),
        boot_id=procs.boot_id(),
    )
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
                if _same_boot(held) and pid_alive(held.pid, held.pid_start):
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


def adopt(state_dir: str | os.PathLike[str], *, from_pid: int, from_start: str | None) -> RunLock:
    """Take the run lock over from the process that holds it and hands it on (`runbook next
    --detach` to its supervisor, runbook/run/supervisor.py): the lock then names this process.

    Raises LockError when the lock is no longer held by `from_pid` (with that start time) on this
    host: the handing process died or gave it up, and the lock is not ours to take."""
    state = Path(state_dir)
    path = state / LOCK_NAME
    with write_lock(state):
        held = read_lock(path)
        if (held is None or held.pid != from_pid or held.host != socket.gethostname()
                or (from_start is not None and held.pid_start != from_start)):
            raise LockError(f"{path}: the run lock was not handed over (pid {from_pid} no longer holds it)")
        info = held.model_copy(update={"pid": os.getpid(), "pid_start": procs.proc_start(os.getpid())})
        lock = RunLock(path, info)
        lock._write()
    return lock


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
