"""The run lock (O_EXCL, pid-aware, stale takeover) and the short write lock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runbook.store.lock import (
    LockCorrupt,
    LockHeld,
    LockInfo,
    WriteLockTimeout,
    group_alive,
    holds,
    read_lock,
    run_lock,
    write_lock,
)
from runbook.store.procs import proc_start


def test_lock_holds_and_releases(tmp_path):
    with run_lock(tmp_path, run_id="r1") as lock:
        info = read_lock(tmp_path / "lock")
        assert info.pid == os.getpid() and info.run_id == "r1" and info.host == socket.gethostname()
        lock.set_step(4242)
        assert read_lock(tmp_path / "lock").step_pgid == 4242
    assert not (tmp_path / "lock").exists()


def test_second_holder_refused_naming_holder(tmp_path):
    # a live holder: another process that really holds this state directory's lock
    code = ("import sys, time; from runbook.store.lock import run_lock\n"
            "with run_lock(sys.argv[1], run_id='r9'):\n    print('ready', flush=True); time.sleep(30)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(LockHeld) as exc:
            with run_lock(tmp_path):
                pass
        msg = str(exc.value)
        assert f"pid {holder.pid}" in msg and "r9" in msg and "since" in msg
        # the way out is runbook's own verbs, never a bare kill or deleting a live lock
        assert "`runbook cancel`" in msg and "`runbook logs -f`" in msg and "kill" not in msg and "delete" not in msg
        assert (tmp_path / "lock").exists()  # the holder keeps it
    finally:
        holder.kill()
        holder.wait()


def test_lock_copied_with_its_workspace_is_not_held_there(tmp_path):
    """`cp -a` of a workspace while a run holds its lock: in the copy, the lock's live holder does not
    hold the copy's lock (it names the original workspace, and the copy's directory carries no flock)."""
    original, copy = tmp_path / "a", tmp_path / "b"
    original.mkdir()
    copy.mkdir()
    with run_lock(original, run_id="r1") as lock:
        assert holds(lock.info, original) is True
        (copy / "lock").write_bytes((original / "lock").read_bytes())
        info = read_lock(copy / "lock")
        assert holds(info, copy) is False
        forged = info.model_copy(update={"workspace": os.path.realpath(copy)})  # a hand-edited copy: still no flock
        assert holds(forged, copy) is False
        warnings = []
        with run_lock(copy, warn=warnings.append):  # taken over, nothing signalled
            pass
        assert "nothing was signalled" in warnings[0] and "copied" in warnings[0]
        assert read_lock(original / "lock").pid == os.getpid()


def test_pid_1_lock_is_not_held(tmp_path):
    info = LockInfo(pid=1, host=socket.gethostname(), started="2026-01-01T00:00:00Z", pid_start=proc_start(1),
                    workspace=os.path.realpath(tmp_path))
    assert holds(info, tmp_path) is False


def test_other_host_is_never_taken_over(tmp_path):
    (tmp_path / "lock").write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "2026-01-01T00:00:00Z"}))
    with pytest.raises(LockHeld, match="another host"):
        with run_lock(tmp_path):
            pass


def test_stale_lock_taken_over_kills_group_and_index_lock(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = "20260101-000000-abcd"  # a real step carries its run id and a metrics path in this state dir
    leftover = subprocess.Popen(["sleep", "30"], start_new_session=True, env={
        **os.environ, "RUNBOOK_RUN_ID": run, "RUNBOOK_METRICS": f"{os.path.realpath(tmp_path)}/runs/{run}/s.metrics.json"})
    gitdir = tmp_path / "repo.git"
    gitdir.mkdir()
    (gitdir / "index.lock").write_text("")
    # as a real run writes it: the step group and its leader's start time
    (tmp_path / "lock").write_text(
        json.dumps(
            {"pid": dead.pid, "host": socket.gethostname(), "started": "2020-01-01T00:00:00Z",
             "step_pgid": leftover.pid, "step_start": proc_start(leftover.pid), "run_id": run,
             "workspace": os.path.realpath(tmp_path)}
        )
    )
    warnings = []
    try:
        with run_lock(tmp_path, git_dir=gitdir, warn=warnings.append):
            assert read_lock(tmp_path / "lock").pid == os.getpid()
        assert leftover.wait(timeout=5) == -signal.SIGTERM
        assert not group_alive(leftover.pid)
        assert not (gitdir / "index.lock").exists()
        assert len(warnings) == 1 and "stale" in warnings[0] and str(leftover.pid) in warnings[0]
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()


def test_corrupt_lock_is_named(tmp_path):
    (tmp_path / "lock").write_text("hello")
    with pytest.raises(LockCorrupt, match="not a runbook lock"):
        with run_lock(tmp_path):
            pass


def test_write_lock_excludes_and_times_out(tmp_path):
    held = threading.Event()
    release = threading.Event()

    def hold():
        with write_lock(tmp_path):
            held.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    t0 = time.monotonic()
    with pytest.raises(WriteLockTimeout):
        with write_lock(tmp_path, timeout_s=0.3):
            pass
    assert time.monotonic() - t0 >= 0.3
    release.set()
    t.join()
    with write_lock(tmp_path, timeout_s=1):
        pass


def test_temporary_lock_of_a_dead_process_is_removed_and_a_live_ones_kept(tmp_path):
    """A `runbook next` killed between writing its temporary lock and linking it leaves
    `.lock.PID.N.tmp`: the next lock taken removes it (never another live process's)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone, live = tmp_path / f".lock.{dead.pid}.1.tmp", tmp_path / f".lock.{os.getpid()}.2.tmp"
    gone.write_text("{}")
    live.write_text("{}")
    with run_lock(tmp_path, run_id="r1"):
        assert read_lock(tmp_path / "lock").run_id == "r1"
    assert not gone.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]


def test_a_holder_killed_while_rewriting_the_lock_file_leaves_nothing_behind(tmp_path):
    """RunLock's updates of `state/lock` (run id, step) are atomic writes through a temp file beside it,
    `.lock.XXXXXXXX.tmp`; a holder killed in that instant left it untracked in the repository (a killed
    `runbook sweep`, 2026-12-04). The next holder, with the directory's flock, removes it, and a
    `.lock.PID.N.tmp` of a live process stays (test above)."""
    interrupted, live = tmp_path / ".lock.9v0hb8o4.tmp", tmp_path / f".lock.{os.getpid()}.3.tmp"
    interrupted.write_text('{"pid": 1')
    live.write_text("{}")
    with run_lock(tmp_path, run_id="r2") as lock:
        assert not interrupted.exists() and live.exists()
        lock.set_run("r3")  # its own rewrite leaves no temp either
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]
