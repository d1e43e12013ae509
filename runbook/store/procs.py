"""The process table (Linux `/proc`), read to prove which processes belong to a run.

runbook only ever signals processes it can prove are its own. A proof is one of:

- the process carries `RUNBOOK_RUN_ID=<run id>` in its environment (every step, and whatever a
  step starts without scrubbing its environment, inherits it), and started after the run did;
  a stale lock's leftovers must also carry a `RUNBOOK_METRICS` path inside that state directory's
  `runs/<run>/` (a copy of the repository runs the same run id elsewhere). A recorded start time
  of a group's leader is no proof on its own: a hand-made lock can copy a live one's.

A process group may be signalled as a whole once one of its members is proven: a group id stays
taken while any member lives, and a step's group is a session of its own, which no outside
process can join. runbook's own process, its own group and its ancestors are never signalled.
Nor is a process started by Slurm (a descendant of `slurmstepd`): a cluster job that carries the
run id belongs to Slurm, is stopped with `scancel` (runbook/run/slurm.py), and may be a job that a
re-attaching runbook is about to follow.

Public surface: `Proc`, `read_proc`, `processes`, `pid_alive`, `group_alive`, `boot_id`,
`proven_run_processes`, `signal_proven`, `terminate_proven`, `git_processes_in`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Proc",
    "boot_id",
    "git_processes_in",
    "group_alive",
    "pid_alive",
    "proc_start",
    "processes",
    "proven_run_processes",
    "read_proc",
    "safe_to_signal_group",
    "signal_proven",
    "started_at",
    "terminate_proven",
    "under_slurm",
]

_PROC = Path("/proc")
_ENVIRON_MAX = 1 << 20  # bytes of /proc/<pid>/environ read at most


@dataclass(frozen=True)
class Proc:
    """One process as `/proc/<pid>/stat` describes it."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start: str  # clock ticks since boot, as text (compared, never computed with)
    comm: str

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def read_proc(pid: int) -> Proc | None:
    """The process `pid`, or None when it does not exist (or /proc is unreadable)."""
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes().decode("utf-8", "replace")
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    open_, close = raw.find("("), raw.rfind(")")
    fields = raw[close + 2 :].split()
    if open_ < 0 or close < 0 or len(fields) < 20:
        return None
    try:
        return Proc(
            pid=pid,
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            sid=int(fields[3]),
            state=fields[0],
            start=fields[19],
            comm=raw[open_ + 1 : close],
        )
    except ValueError:
        return None


def proc_start(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot, or None when unknown."""
    proc = read_proc(pid)
    return proc.start if proc is not None else None


def processes() -> Iterator[Proc]:
    """Every process this host's /proc shows (those that vanish while reading are skipped)."""
    try:
        names = os.listdir(_PROC)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            proc = read_proc(int(name))
            if proc is not None:
                yield proc


def boot_id() -> str | None:
    """This boot's random id (changes at every reboot), or None when unknown."""
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


def pid_alive(pid: int, pid_start: str | None = None) -> bool:
    """True when `pid` runs on this host (and, if `pid_start` is given, is still that process)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OverflowError:
        return False
    proc = read_proc(pid)
    if proc is None:
        return True  # no /proc to ask: trust kill(0)
    if proc.zombie:
        return False
    return pid_start is None or proc.start == pid_start  # else the pid was reused


def group_alive(pgid: int) -> bool:
    if pgid <= 1:
        return False
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def _environ_has_all(pid: int, entries: list[bytes]) -> bool:
    try:
        with open(_PROC / str(pid) / "environ", "rb") as handle:
            data = handle.read(_ENVIRON_MAX)
    except OSError:
        return False
    if not all(entry in data for entry in entries):  # cheap test first
        return False
    have = set(data.split(b"\0"))
    return all(entry in have for entry in entries)


def _environ_has_prefix(pid: int, prefix: tuple[bytes, ...]) -> bool:
    try:
        with open(_PROC / str(pid) / "environ", "rb") as handle:
            data = handle.read(_ENVIRON_MAX)
    except OSError:
        return False
    return any(entry.startswith(prefix) for entry in data.split(b"\0"))


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


def _boot_time() -> float | None:
    try:
        for line in (_PROC / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def started_at(proc: Proc) -> float | None:
    """A process's start as a Unix time (to the clock tick), None when unknown."""
    boot = _boot_time()
    try:
        return boot + int(proc.start) / _clock_ticks() if boot is not None else None
    except ValueError:
        return None


def _protected() -> tuple[set[int], set[int]]:
    """(pids, pgids) runbook must never signal: itself, its ancestors, and their groups."""
    pids: set[int] = set()
    groups: set[int] = {os.getpgrp()}
    pid = os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        proc = read_proc(pid)
        if proc is None:
            break
        groups.add(proc.pgid)
        pid = proc.ppid
    pids.add(1)
    groups.add(1)
    return pids, groups


def safe_to_signal_group(pgid: int) -> bool:
    """False for group ids that are nonsense or hold runbook itself or one of its ancestors."""
    _pids, groups = _protected()
    return pgid > 1 and pgid not in groups


def proven_run_processes(
    run_id: str | None,
    *,
    since: float | None = None,
    env: Iterable[str] = (),
    env_prefix: tuple[str, ...] = (),
) -> list[Proc]:
    """The live processes proven to belong to run `run_id` (see the module docstring).

    `since`: the run's start (Unix time); a process that started earlier is not the run's.
    `env`: further `NAME=value` entries a process must carry too (`RUNBOOK_METRICS=<path>` pins
    one step of one run in one state directory).
    `env_prefix`: when given, an entry of the environment must start with one of them
    (`RUNBOOK_METRICS=<state>/runs/<run>/` pins the run to one state directory: a copy of the
    repository runs the same run id elsewhere).
    """
    pids, _groups = _protected()
    wanted = [f"RUNBOOK_RUN_ID={run_id}".encode()] if run_id else []
    wanted += [entry.encode() for entry in env]
    found: list[Proc] = []
    for proc in processes():
        if proc.pid in pids or proc.zombie:
            continue
        if not wanted or not _environ_has_all(proc.pid, wanted):
            continue
        if env_prefix and not _environ_has_prefix(proc.pid, tuple(p.encode() for p in env_prefix)):
            continue
        if under_slurm(proc):
            continue
        if since is not None:
            began = started_at(proc)
            if began is not None and began < since - 2.0:  # /proc's btime is whole seconds
                continue
        found.append(proc)
    return found


def under_slurm(proc: Proc) -> bool:
    """True when `proc` descends from `slurmstepd` (a Slurm job's process on this node)."""
    seen: set[int] = set()
    current: Proc | None = proc
    while current is not None and current.pid > 1 and current.pid not in seen:
        if current.comm == "slurmstepd":
            return True
        seen.add(current.pid)
        current = read_proc(current.ppid)
    return False


def signal_proven(procs: Iterable[Proc], sig: int, *, groups: Iterable[int] = ()) -> list[int]:
    """Send `sig` to each proven process that is still the same process, and to each group in
    `groups` that still holds one of them. Returns the pids and -pgids signalled."""
    pids, protected_groups = _protected()
    sent: list[int] = []
    live: list[Proc] = []
    for proc in procs:
        now = read_proc(proc.pid)
        if now is None or now.start != proc.start or now.zombie or proc.pid in pids:
            continue  # gone, or the pid now names another process
        live.append(now)
    for pgid in groups:
        if pgid in protected_groups or pgid <= 1 or not any(p.pgid == pgid for p in live):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
            sent.append(-pgid)
    for proc in live:
        if proc.pgid in groups and -proc.pgid in sent:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, sig)
            sent.append(proc.pid)
    return sent


def terminate_proven(
    find: Callable[[], list[Proc]], *, groups: Iterable[int] = (), grace_s: float = 3.0
) -> list[int]:
    """SIGTERM what `find()` proves, then SIGKILL what it still proves after `grace_s`.

    `find` is called again before each signal, so a process is signalled only while it is
    proven. Returns the pids (and -pgids) that were sent SIGTERM.
    """
    groups = list(groups)
    first = signal_proven(find(), signal.SIGTERM, groups=groups)
    if not first:
        return []
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        left = find()
        if not left:
            return first
        time.sleep(0.05)
    signal_proven(find(), signal.SIGKILL, groups=groups)
    return first


def git_processes_in(work_tree: Path, git_dir: Path) -> list[Proc]:
    """Live `git` processes working in this repository (cwd inside it, or GIT_DIR naming it)."""
    roots = {work_tree.resolve(), git_dir.resolve()}
    found: list[Proc] = []
    for proc in processes():
        if proc.zombie or not (proc.comm == "git" or proc.comm.startswith("git-")):
            continue
        try:
            cwd = Path(os.readlink(_PROC / str(proc.pid) / "cwd"))
        except OSError:
            cwd = None
        if cwd is not None and any(cwd == r or cwd.is_relative_to(r) for r in roots):
            found.append(proc)
        elif _environ_has_all(proc.pid, [f"GIT_DIR={git_dir}".encode()]):
            found.append(proc)
    return found
