"""The two locks of a state directory.

- The run lock: one `runbook next` at a time. Held as an exclusive `flock` on the state directory
  itself, kept open by the holder for as long as it runs (a `--detach`ed supervisor inherits that
  very open directory from its caller, so the lock is never free in between). The kernel drops it
  when the holder dies; a copy of the repository (`cp -a` while a run is in progress) or a lock
  file made by hand carries no flock. Beside it, `state/lock` (schema `LockInfo`) says who holds it
  for readers: pid and its start time, host, boot id, start time, run id, the workspace (the state
  directory's real path), plan, phase and step, and the process group of the step now running. It
  is written whole to a temporary file and linked into place (a crash or a full disk never leaves
  an empty or partial lock).
  `holds(info, state_dir)` is the one reading of "a run is in progress here" for every command
  (status, brief, history, next, cancel): the directory's flock is held, the lock file names this
  very state directory, and its pid is alive with the recorded start time. A lock file nobody holds
  that way (its holder died, or it was copied or written by hand) is stale and is taken over with a
  warning. Before that, and only when it names this workspace and its pid is dead, what provably
  belongs to the dead run is stopped (`runbook.store.procs`: processes carrying the run's
  RUNBOOK_RUN_ID together with a RUNBOOK_METRICS path under this state directory's `runs/<run>/`,
  and the step group holding one of them), and git's own locks it left are removed unless a live
  git process works in the repository. Nothing else is ever signalled: not group 1, not runbook's
  own group, not a live pid a lock file names without holding the lock, not a group none of whose
  members is proven to be the run's (a recorded start time alone proves nothing: a hand-made lock
  can copy it). On a file system without flock (rare; some network mounts) the proof falls back to
  the pid and its start time.
- The write lock `state/write.lock`: a short `fcntl.flock` around file writes and commits (plan,
  notes, ledger), so `runbook record` can write while a long phase runs.

A lock file with nonsense fields (a pid or group <= 1, an unparsable time, a run id with odd
characters, more than 64 KiB, not a regular file) is refused as `LockCorrupt`: a hand-made or
cloned lock cannot steer runbook into signalling anything.

Public surface: `run_lock(state_dir, ...)` and `write_lock(state_dir)` context managers; `holds`;
`adopt` (the supervisor's hand-over); `LockHeld` (another live run holds the lock), `LockBusy` (held,
its holder not written yet), `LockCorrupt` (the lock file is not ours to read), `WriteLockTimeout`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
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
    "LockBusy",
    "LockCorrupt",
    "adopt",
    "holds",
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
    workspace: str | None = Field(default=None, max_length=4096)  # real path of the state directory

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


class LockBusy(LockError):
    """The run lock is held, and its holder has not said who it is (it is taking the lock this
    instant, or it is not runbook)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(
            f"another process holds the run lock of {path.parent} and has not written {path} yet: a "
            "`runbook next` is starting there. See `runbook status`, and try again in a moment."
        )


class LockCorrupt(LockError):
    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        super().__init__(
            f"{path}: not a runbook lock file ({detail}); nothing was signalled. runbook never writes such a "
            "file: if no `runbook next` is running here (`runbook status`), remove it and run again."
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


def _real_state(state_dir: str | os.PathLike[str]) -> str:
    return os.path.realpath(state_dir)


def _open_dir(state_dir: str | os.PathLike[str]) -> int:
    return os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _flock_held_by_another(state_dir: str | os.PathLike[str]) -> bool | None:
    """Whether a process (another open of the directory) holds the state directory's run flock;
    None when it cannot be known here (no such directory, or a file system without flock)."""
    try:
        fd = _open_dir(state_dir)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            return True if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
        fcntl.flock(fd, fcntl.LOCK_UN)  # this probe's own open only; a holder's lock is another's
        return False
    finally:
        os.close(fd)


def holds(info: LockInfo, state_dir: str | os.PathLike[str]) -> bool | None:
    """Whether the lock's holder is a live process holding THIS state directory's run lock.

    True only when it runs on this host and boot, the lock names this state directory's real path,
    the pid is alive with the recorded start time, and the directory's flock is held (where the
    file system has flock). None when the holder is on another host (runbook cannot look). The one
    test every command makes before it shows a run as live or signals its holder."""
    if info.host != socket.gethostname():
        return None
    if not _same_boot(info) or info.pid_start is None or info.pid <= 1:
        return False
    if info.workspace != _real_state(state_dir) or not pid_alive(info.pid, info.pid_start):
        return False
    return _flock_held_by_another(state_dir) is not False


class RunLock:
    """A held run lock. `set_step(pgid)` records the running step's process group.

    `anchor` is the open state directory whose flock is the lock; it is closed on release (never
    unlocked explicitly: a supervisor that inherited it keeps the lock)."""

    def __init__(self, path: Path, info: LockInfo, anchor: int | None) -> None:
        self.path = path
        self.info = info
        self.anchor = anchor

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
        """Remove the lock file if it still names this process, then let the flock go (in that
        order: a newcomer that gets the flock never finds this holder's file)."""
        try:
            try:
                current = read_lock(self.path)
            except LockCorrupt:
                current = None
            if current is not None and current.pid == self.info.pid and current.host == self.info.host:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
        finally:
            anchor, self.anchor = self.anchor, None
            if anchor is not None:
                os.close(anchor)


Warn = Callable[[str], None]


def _create(path: Path, info: LockInfo) -> bool:
    """Create the lock file exclusively and whole; False if it exists.

    The content is written and fsynced in a temporary file beside it, which is then hard-linked to
    `path` (the link fails when `path` exists, as O_EXCL would): a crash or a full disk leaves no
    lock or a complete one, never an empty or partial one that blocks the workspace."""
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


def _remove_dead_temps(path: Path, flocked: bool) -> None:
    """Remove the temporary files dead writers of the lock file left beside it, so that they never
    linger untracked in the repository: `.lock.PID.N.tmp` of a process that died between writing its
    new lock and linking it (_create; kept while that pid lives), and `.lock.XXXXXXXX.tmp` of a holder
    killed while rewriting its file (RunLock._write's atomic write; a killed `runbook sweep` left one),
    removed only when `flocked`: with the directory's flock taken, no other process writes the file."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        created = re.fullmatch(r"(\d+)\.\d+", tmp.name[len(path.name) + 2:-len(".tmp")])
        if (created and pid_alive(int(created[1]))) or (not created and not flocked):
            continue
        with contextlib.suppress(OSError):
            tmp.unlink()


def _clear_stale(path: Path, stale: LockInfo, git_dir: Path | None, warn: Warn) -> None:
    """Take over a lock file nobody holds: stop what provably is the dead run's (only when the lock
    names this workspace and its pid is dead), remove git's locks left in this repository (never
    while a live git works in it), and say what was done."""
    real = _real_state(path.parent)
    run = f"(run {stale.run_id or '?'}, since {stale.started})"
    if stale.workspace != real:
        where = f"names the workspace {stale.workspace}" if stale.workspace else "names no workspace"
        msg = (f"taking over a stale run lock {path}: it {where}, not {real} (a copied repository, or written by "
               f"hand), so pid {stale.pid} {run} never ran here; nothing was signalled")
    elif _same_boot(stale) and pid_alive(stale.pid, stale.pid_start):
        msg = (f"taking over a stale run lock {path}: pid {stale.pid} {run} is alive but does not hold this "
               "workspace's lock; nothing was signalled")
    else:
        msg = (f"taking over a stale run lock {path}: pid {stale.pid} {run} is no longer running"
               + _stop_leftovers(stale, path.parent))
    if git_dir is not None:
        msg += _clear_git_locks(stale, git_dir)
    warn(msg)


def _same_boot(info: LockInfo) -> bool:
    return info.boot_id is None or info.boot_id == procs.boot_id()


def _stop_leftovers(stale: LockInfo, state: Path) -> str:
    """Stop what provably belongs to the dead run of this state directory; a sentence for the warning."""
    if not _same_boot(stale):
        return "; the machine restarted since, so nothing of that run is left to stop"
    group = stale.step_pgid
    run_id = stale.run_id
    since = _parse_time(stale.started)
    # a step carries its metrics path in this state directory's runs/<run>/ (as runbook wrote it)
    inside = tuple(f"RUNBOOK_METRICS={d}/runs/{run_id}/" for d in dict.fromkeys([str(state), _real_state(state)]))

    def find() -> list[procs.Proc]:
        return procs.proven_run_processes(run_id, since=since, env_prefix=inside) if run_id else []

    groups = [group] if group and procs.safe_to_signal_group(group) else []
    stopped = procs.terminate_proven(find, groups=groups)
    parts = []
    if stopped:
        shown = ", ".join(f"group {-x}" if x < 0 else f"pid {x}" for x in stopped)
        parts.append(f"stopped what was left of that run ({shown})")
    if group and -group not in stopped and group_alive(group):
        why = (
            "it holds runbook itself" if not procs.safe_to_signal_group(group)
            else f"none of its processes is provably from run {run_id or '?'} of this workspace"
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


# How long a newcomer retries the directory's flock: readers probe it for microseconds.
_FLOCK_RETRY_S = 1.0
# How long it waits for a holder it cannot see to write the lock file.
_HOLDER_WAIT_S = 3.0


@contextlib.contextmanager
def run_lock(
    state_dir: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    git_dir: str | os.PathLike[str] | None = None,
    warn: Warn | None = None,
) -> Iterator[RunLock]:
    """Hold the run lock for the duration of the block.

    Raises LockHeld when a live run holds it (or one on another host), LockBusy when it is held by
    a process that has not written `state/lock` yet, LockCorrupt when the file is not a lock we can
    read or its fields are nonsense. A stale lock file (nobody holds the lock) is taken over after
    stopping what provably belongs to the dead run and removing git locks it left; `warn` is told.
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
        workspace=_real_state(state),
    )
    say = warn or (lambda _msg: None)
    gdir = Path(git_dir) if git_dir is not None else None
    anchor = _open_dir(state)
    try:
        lock = _acquire(path, anchor, me, gdir, say)
    except BaseException:
        os.close(anchor)
        raise
    try:
        yield lock
    finally:
        lock.release()


def _take_flock(anchor: int) -> bool | None:
    """Take the directory's flock (retrying briefly past readers' probes): True when taken, False
    when another holds it, None when this file system has no flock."""
    deadline = time.monotonic() + _FLOCK_RETRY_S
    while True:
        try:
            fcntl.flock(anchor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _acquire(path: Path, anchor: int, me: LockInfo, gdir: Path | None, say: Warn) -> RunLock:
    """Take the lock and write its file (taking a stale one over); the held `RunLock`."""
    state = path.parent
    flocked = _take_flock(anchor)
    if flocked is False:
        raise _held_by_another(path)
    _remove_dead_temps(path, flocked=bool(flocked))
    if not _create(path, me):
        # Decide about the existing file under the write lock too, so that without flock two
        # newcomers cannot both take over the same stale lock (one would delete the other's).
        with write_lock(state):
            try:
                held = read_lock(path)
            except LockCorrupt:
                if flocked:
                    raise  # nobody is writing it this instant: it is not runbook's
                # An empty file may be a lock being created this instant; give it a moment.
                time.sleep(0.2)
                held = read_lock(path)
            if held is not None:
                if held.host != me.host:
                    raise LockHeld(path, held, alive_unknown=True)
                if not flocked and holds(held, state):
                    raise LockHeld(path, held)
                _clear_stale(path, held, gdir, say)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            if not _create(path, me):
                raise LockHeld(path, read_lock(path) or me)
    return RunLock(path, me, anchor)


def _held_by_another(path: Path) -> LockError:
    """The refusal when another open of the directory holds the flock: its holder as the lock
    file names it (waiting a moment for a holder that is writing it this instant)."""
    deadline = time.monotonic() + _HOLDER_WAIT_S
    while True:
        try:
            held = read_lock(path)
        except LockCorrupt:
            held = None
        if held is not None and held.host != socket.gethostname():
            return LockHeld(path, held, alive_unknown=True)
        if held is not None and holds(held, path.parent):
            return LockHeld(path, held)
        if time.monotonic() >= deadline:
            return LockBusy(path)
        time.sleep(0.05)


def adopt(state_dir: str | os.PathLike[str], *, from_pid: int, from_start: str | None,
          anchor: int | None) -> RunLock:
    """Take the run lock over from the process that holds it and hands it on (`runbook next
    --detach` to its supervisor, runbook/run/supervisor.py): `anchor` is the caller's open state
    directory, inherited, whose flock is the lock; the lock file then names this process.

    Raises LockError when the lock is no longer held by `from_pid` (with that start time) on this
    host, or `anchor` is not that directory holding it: the lock is not ours to take."""
    state = Path(state_dir)
    path = state / LOCK_NAME
    refused = LockError(f"{path}: the run lock was not handed over (pid {from_pid} no longer holds it)")
    if anchor is None:
        raise refused
    try:
        mine, there = os.fstat(anchor), os.stat(state)
        if (mine.st_dev, mine.st_ino) != (there.st_dev, there.st_ino):
            raise refused
        if _take_flock(anchor) is False:  # the same open file as the caller's: it is ours already
            raise refused
    except OSError:
        raise refused from None
    with write_lock(state):
        held = read_lock(path)
        if (held is None or held.pid != from_pid or held.host != socket.gethostname()
                or (from_start is not None and held.pid_start != from_start)):
            raise refused
        info = held.model_copy(update={"pid": os.getpid(), "pid_start": procs.proc_start(os.getpid())})
        lock = RunLock(path, info, anchor)
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
