"""The stale-lock takeover signals only what provably belongs to the dead run.

Every scenario whose failure could signal a process this test did not start (a lock naming group
1, an unrelated group, runbook's own group) runs as pid 1 of a fresh PID namespace
(`unshare -fp --mount-proc`): there, even `kill(-1, ...)` reaches only the namespace's own
processes, all started by the scenario. The scenarios use the real `run_lock` on real processes
and report what happened as one JSON line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runbook.store.lock import LockCorrupt, read_lock, run_lock
from runbook.store.procs import proc_start

REPO = Path(__file__).resolve().parents[2]


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(["unshare", "-fp", "--mount-proc", "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


needs_namespace = pytest.mark.skipif(
    not _namespaces_work(), reason="needs `unshare -fp --mount-proc` (root): these locks could signal foreign groups"
)

# What every scenario has at hand, inside its namespace.
PRELUDE = '''
import json, os, socket, subprocess, sys, time
from pathlib import Path
from runbook.store.lock import LockCorrupt, LockHeld, read_lock, run_lock
from runbook.store.procs import proc_start

STATE = Path(sys.argv[1])
HOST = socket.gethostname()

def dead_pid():
    p = subprocess.Popen(["true"]); p.wait(); return p.pid

def sentinel(env=None):
    """A process of our own in a session (and group) of its own."""
    return subprocess.Popen(["sleep", "60"], start_new_session=True, env=env)

def write(**fields):
    """A lock as `run_lock` writes it for this state directory (it names its workspace)."""
    base = {"pid": dead_pid(), "host": HOST, "started": "2020-01-01T00:00:00Z", "workspace": os.path.realpath(STATE)}
    base.update(fields)
    (STATE / "lock").write_text(json.dumps(base))

def takeover():
    warnings = []
    try:
        with run_lock(STATE, warn=warnings.append):
            pass
    except LockCorrupt as exc:
        return {"outcome": "corrupt", "message": str(exc)}
    except LockHeld as exc:
        return {"outcome": "held", "message": str(exc)}
    return {"outcome": "taken", "message": " | ".join(warnings)}

def alive(proc):
    time.sleep(0.3)
    return proc.poll() is None

def report(**result):
    print(json.dumps(result))
'''


def in_namespace(tmp_path: Path, body: str, timeout: float = 60) -> dict:
    """Run `body` (Python, after PRELUDE) as pid 1 of a new PID namespace; its last line is JSON."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    code = PRELUDE + textwrap.dedent(body)
    result = subprocess.run(
        ["unshare", "-fp", "--mount-proc", sys.executable, "-c", code, str(state)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@needs_namespace
def test_lock_naming_group_1_is_refused_and_signals_nothing(tmp_path):
    got = in_namespace(tmp_path, """
        keep = sentinel()
        write(step_pgid=1, step_start="1", run_id="20260101-000000-abcd")
        before = (STATE / "lock").read_bytes()
        result = takeover()
        report(result=result, sentinel_alive=alive(keep), lock_kept=(STATE / "lock").read_bytes() == before)
    """)
    assert got["result"]["outcome"] == "corrupt", got
    message = got["result"]["message"]
    assert "step_pgid" in message and "nothing was signalled" in message and "remove it" in message
    assert got["sentinel_alive"] and got["lock_kept"]


@needs_namespace
@pytest.mark.parametrize(
    "fields, named",
    [
        ({"step_pgid": 0}, "step_pgid"),
        ({"step_pgid": -1}, "step_pgid"),
        ({"step_pgid": 2**40}, "step_pgid"),
        ({"step_pgid": "1"}, "step_pgid"),
        ({"pid": 0}, "pid"),
        ({"pid": -1}, "pid"),
        ({"started": "yesterday"}, "started"),
        ({"run_id": "../../x"}, "run_id"),
        ({"host": ""}, "host"),
        ({"step_start": "soon"}, "step_start"),
    ],
)
def test_nonsense_lock_fields_are_refused(tmp_path, fields, named):
    got = in_namespace(tmp_path, f"""
        keep = sentinel()
        write(**{fields!r})
        report(result=takeover(), sentinel_alive=alive(keep), lock_kept=(STATE / "lock").exists())
    """)
    assert got["result"]["outcome"] == "corrupt", got
    assert named in got["result"]["message"]
    assert got["sentinel_alive"] and got["lock_kept"]


@needs_namespace
def test_unrelated_live_group_is_left_alone(tmp_path):
    """pid reuse: the recorded group id now names another live group (its leader started later)."""
    got = in_namespace(tmp_path, """
        other = sentinel()
        write(step_pgid=other.pid, step_start="1", run_id="20260101-000000-abcd")
        result = takeover()
        report(result=result, other=other.pid, alive=alive(other), lock_mine=read_lock(STATE / "lock") is None)
    """)
    assert got["result"]["outcome"] == "taken", got
    assert got["alive"], got
    assert f"left process group {got['other']} alone" in got["result"]["message"]


@needs_namespace
def test_a_hand_made_lock_copying_a_live_groups_real_start_time_signals_it_not(tmp_path):
    """A lock written by hand naming a live group with its leader's real start time (read from /proc)
    proves nothing: none of the group carries the run's environment, so it is left alone."""
    got = in_namespace(tmp_path, """
        other = sentinel()
        write(step_pgid=other.pid, step_start=proc_start(other.pid), run_id="20260101-000000-abcd")
        result = takeover()
        report(result=result, other=other.pid, alive=alive(other))
    """)
    assert got["result"]["outcome"] == "taken", got
    assert got["alive"], got
    assert f"left process group {got['other']} alone" in got["result"]["message"]


@needs_namespace
def test_group_of_a_process_from_another_run_is_left_alone(tmp_path):
    """The group's processes carry another run's id: not proven to be the dead run's."""
    got = in_namespace(tmp_path, """
        other = sentinel(env={**os.environ, "RUNBOOK_RUN_ID": "20260101-000000-ffff"})
        write(step_pgid=other.pid, run_id="20260101-000000-abcd")
        result = takeover()
        report(result=result, alive=alive(other))
    """)
    assert got["result"]["outcome"] == "taken" and got["alive"], got


OWN_GROUP = """
import json, os, sys, socket, subprocess
from pathlib import Path
from runbook.store.lock import run_lock
from runbook.store.procs import proc_start
state = Path(sys.argv[1])
p = subprocess.Popen(["true"]); p.wait()
me = os.getpid()
(state / "lock").write_text(json.dumps({"pid": p.pid, "host": socket.gethostname(),
    "started": "2020-01-01T00:00:00Z", "step_pgid": os.getpgrp(), "step_start": proc_start(me),
    "run_id": "20260101-000000-abcd", "workspace": os.path.realpath(state)}))
warnings = []
with run_lock(state, warn=warnings.append):
    pass
print(json.dumps({"pgid": os.getpgrp(), "me": me, "message": " | ".join(warnings)}))
"""


@needs_namespace
def test_runbooks_own_group_is_never_signalled(tmp_path):
    """A lock naming the group of the very process taking it over, with its leader's true start time."""
    got = in_namespace(tmp_path, f"""
        done = subprocess.run([sys.executable, "-c", {OWN_GROUP!r}, str(STATE)], start_new_session=True,
                              capture_output=True, text=True, timeout=30)
        report(code=done.returncode, out=done.stdout, err=done.stderr[-2000:])
    """)
    assert got["code"] == 0, got  # killed by its own takeover would be -15 / -9
    inner = json.loads(got["out"].strip().splitlines()[-1])
    assert inner["pgid"] == inner["me"]
    assert f"left process group {inner['pgid']} alone: it holds runbook itself" in inner["message"]


@needs_namespace
def test_lock_from_before_a_reboot_signals_nothing(tmp_path):
    """Same pid numbers, even a matching leader start time, but another boot: nothing is signalled."""
    got = in_namespace(tmp_path, """
        keep = sentinel()
        write(step_pgid=keep.pid, step_start=proc_start(keep.pid), run_id="20260101-000000-abcd",
              boot_id="00000000-0000-0000-0000-000000000000")
        result = takeover()
        report(result=result, alive=alive(keep))
    """)
    assert got["result"]["outcome"] == "taken" and got["alive"], got
    assert "restarted" in got["result"]["message"]


@needs_namespace
def test_proven_leftovers_are_stopped_and_nothing_else(tmp_path):
    """The step's leader (recorded start time) and what it left, all carrying the step's environment
    (the run id, a metrics path in this state directory's runs/<run>/): the leader, a member of a
    group whose leader died, a setsid daemon: all stopped. A process of another run, and one with
    this run id whose metrics lie in another state directory (a copy of the repository), survive."""
    got = in_namespace(tmp_path, """
        run = "20260101-000000-abcd"
        env = {**os.environ, "RUNBOOK_RUN_ID": run,
               "RUNBOOK_METRICS": f"{os.path.realpath(STATE)}/runs/{run}/train.metrics.json"}
        leader = sentinel(env=env)
        orphan_group = subprocess.Popen(["bash", "-c", "sleep 60 & echo $!; exit 0"], start_new_session=True,
                                        stdout=subprocess.PIPE, text=True, env=env)
        member = int(orphan_group.stdout.readline()); orphan_group.wait()
        daemon = subprocess.Popen(["setsid", "sleep", "60"], env=env)
        other = sentinel(env={**os.environ, "RUNBOOK_RUN_ID": "20260101-000000-ffff"})
        copy = STATE.parent / "copy" / "state"
        copy.mkdir(parents=True)
        elsewhere = sentinel(env={**os.environ, "RUNBOOK_RUN_ID": run,
                                  "RUNBOOK_METRICS": f"{os.path.realpath(copy)}/runs/{run}/train.metrics.json"})
        time.sleep(0.2)
        from datetime import datetime, timezone
        now = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        write(step_pgid=leader.pid, step_start=proc_start(leader.pid), run_id=run, started="2020-01-01T00:00:00Z")
        result = takeover()
        time.sleep(0.3)
        def gone(pid):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            st = Path(f"/proc/{pid}/stat")
            return not st.exists() or st.read_text().split(")")[-1].split()[0] in "ZX"
        report(result=result, leader=gone(leader.pid), member=gone(member), daemon=gone(daemon.pid),
               other_alive=alive(other), elsewhere_alive=alive(elsewhere))
    """)
    assert got["result"]["outcome"] == "taken", got
    assert got["leader"] and got["member"] and got["daemon"], got
    assert got["other_alive"] and got["elsewhere_alive"], got
    assert "stopped what was left of that run" in got["result"]["message"]


def test_fresher_index_lock_of_a_live_git_is_kept(tmp_path):
    """A dead run's lock, and an index.lock held by a live `git commit` (its pre-commit hook is
    running): the takeover leaves git's lock alone and says why. Nothing is signalled here."""
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.name", "T")
    git("config", "user.email", "t@example.com")
    (repo / "f").write_text("1\n")
    git("add", "f")
    git("commit", "-qm", "init", "--no-verify")
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nsleep 4\n")
    hook.chmod(0o755)
    (repo / "f").write_text("2\n")
    dead = subprocess.Popen(["true"])
    dead.wait()
    state = repo / "state"
    state.mkdir()
    (state / "lock").write_text(json.dumps(
        {"pid": dead.pid, "host": socket.gethostname(), "started": "2020-01-01T00:00:00Z", "run_id": "20200101-000000-abcd"}
    ))
    committer = subprocess.Popen(["git", "commit", "-aqm", "user's own commit"], cwd=repo)
    try:
        index_lock = repo / ".git" / "index.lock"
        deadline = time.monotonic() + 10
        while not index_lock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index_lock.exists()
        warnings: list[str] = []
        with run_lock(state, git_dir=repo / ".git", warn=warnings.append):
            assert index_lock.exists()
        assert "live git process" in warnings[0] and "index.lock" in warnings[0]
        assert committer.wait(timeout=20) == 0  # the user's commit went through untouched
    finally:
        if committer.poll() is None:
            committer.kill()
            committer.wait()


def test_lock_that_is_a_fifo_or_huge_is_refused_without_hanging(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "lock")
    t0 = time.monotonic()
    with pytest.raises(LockCorrupt, match="not a regular file"):
        read_lock(state / "lock")
    (state / "lock").unlink()
    (state / "lock").write_text(" " * (100 * 1024))
    with pytest.raises(LockCorrupt, match="bytes"):
        with run_lock(state):
            pass
    assert time.monotonic() - t0 < 5


def test_a_real_step_group_is_recorded_with_its_leader_start(tmp_path):
    """What a run writes while a step runs is what the takeover later checks."""
    leader = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        with run_lock(tmp_path, run_id="20260101-000000-abcd") as lock:
            lock.set_step(leader.pid)
            info = read_lock(tmp_path / "lock")
            assert info.step_pgid == leader.pid and info.step_start == proc_start(leader.pid)
            assert info.boot_id and info.pid_start
            lock.set_step(None)
            assert read_lock(tmp_path / "lock").step_start is None
    finally:
        leader.send_signal(signal.SIGKILL)
        leader.wait()


COPY_PLAN = """\
---
runbook: 1
title: Copy
---
# Copy

## Phase 0: Wait for go
Steps:
- [ ] Wait: `while [ ! -e go ]; do sleep 0.05; done; echo '{"m": 1}' > "$RUNBOOK_METRICS"`
Pass: `m >= 1`
"""


@needs_namespace
def test_a_copy_of_a_repository_with_a_run_in_progress_signals_nothing_of_the_original(tmp_path):
    """`cp -a` of a repository while its `runbook next` runs: in the copy, status shows no live run,
    `runbook cancel` and `runbook next` signal nothing (next takes the copied lock over, saying so),
    and the original run goes on to pass, recorded once, not interrupted."""
    import helpers as H

    repo = H.make_repo(tmp_path / "a", COPY_PLAN)
    (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "go\n")
    H.git(repo, "commit", "-qam", "ignore go")
    got = in_namespace(tmp_path, """
        import shutil
        RB = [str(Path(sys.executable).parent / "runbook")]
        A = STATE.parent / "a"
        B = STATE.parent / "b"
        def rb(where, *args):
            done = subprocess.run([*RB, *args], cwd=where, capture_output=True, text=True, timeout=60,
                                  stdin=subprocess.DEVNULL)
            return {"code": done.returncode, "out": done.stdout, "err": done.stderr}
        original = subprocess.Popen([*RB, "next", "--yes"], cwd=A, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = read_lock(A / "state" / "lock") if (A / "state" / "lock").exists() else None
            if info is not None and info.step_pgid:
                break
            time.sleep(0.05)
        subprocess.run(["cp", "-a", str(A), str(B)], check=True)
        status = rb(B, "status", "--json")
        cancel = rb(B, "cancel", "--json")
        time.sleep(0.5)
        after_cancel = original.poll() is None
        (B / "go").write_text("")
        copy_next = rb(B, "next", "--yes")
        after_next = original.poll() is None
        (A / "go").write_text("")
        out, err = original.communicate(timeout=60)
        runs = [json.loads(p.read_text()) for p in (A / "state" / "runs").glob("*.json")]
        report(status=json.loads(status["out"]), cancel=cancel, after_cancel=after_cancel, copy_next=copy_next,
               after_next=after_next, original_code=original.returncode, original_err=err,
               outcomes=[r["verdict"] for r in runs])
    """, timeout=180)
    assert got["status"]["result"]["running"] is None, got["status"]
    assert got["after_cancel"] and got["after_next"], got
    assert got["cancel"]["code"] == 0 and "SIGTERM" not in got["cancel"]["out"], got["cancel"]
    assert got["copy_next"]["code"] == 0, got["copy_next"]
    assert "nothing was signalled" in got["copy_next"]["err"] and "copied repository" in got["copy_next"]["err"]
    assert got["original_code"] == 0 and got["outcomes"] == ["pass"], got


# ---- every reader sees the same lock ------------------------------------------------------------

_READERS_BODY = '''
    REPO = Path(sys.argv[2])
    RUNBOOK = sys.argv[3]

    def rb(*args):
        done = subprocess.run([RUNBOOK, *args, "--json"], cwd=REPO, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "RUNBOOK_ENV_PROBE": "0"})
        return {"code": done.returncode, "doc": json.loads(done.stdout), "stderr": done.stderr}

    keep = sentinel()
    locks = {
        "pid 1": {"pid": 1, "host": HOST, "started": "2026-01-01T00:00:00Z", "run_id": "20260101-000000-abcd",
                  "workspace": os.path.realpath(REPO / "state")},
        "a live foreign process": {"pid": keep.pid, "host": HOST, "started": "2026-01-01T00:00:00Z",
                                   "pid_start": proc_start(keep.pid), "step_pgid": keep.pid,
                                   "step_start": proc_start(keep.pid), "run_id": "20260101-000000-abcd",
                                   "workspace": os.path.realpath(REPO / "state")},
        "garbage": None,
    }
    seen = {}
    for name, fields in locks.items():
        lock = REPO / "state" / "lock"
        lock.parent.mkdir(exist_ok=True)
        lock.write_text("garbage{" if fields is None else json.dumps(fields))
        seen[name] = {verb: rb(*verb.split()) for verb in ("status", "brief", "next --dry-run", "cancel")}
        lock.unlink(missing_ok=True)
    report(seen=seen, sentinel_alive=alive(keep))
'''


@needs_namespace
def test_a_lock_naming_pid_1_a_foreign_process_or_garbage_is_no_run_to_every_reader(tmp_path):
    """status, brief, next --dry-run and cancel read one lock the same way: a lock naming pid 1 (here
    the namespace's own first process), a live process that is not runbook's, or garbage is no run in
    progress (never `running`, never waited for), and cancel signals nothing. In a PID namespace: a
    wrong answer could signal pid 1."""
    import helpers as H

    repo = H.make_repo(tmp_path / "repo", "---\nrunbook: 1\ntitle: Locks\n---\n# Locks\n\n## Phase 0: Only\n"
                       "Steps:\n- [ ] Go: `true`\n")
    state = tmp_path / "state"
    state.mkdir()
    code = PRELUDE + textwrap.dedent(_READERS_BODY)
    done = subprocess.run(["unshare", "-fp", "--mount-proc", sys.executable, "-c", code, str(state), str(repo),
                           H.RUNBOOK[0]], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["sentinel_alive"], "cancel signalled a process that is not runbook's"
    for name, verbs in got["seen"].items():
        status, brief, dry, cancel = (verbs[v] for v in ("status", "brief", "next --dry-run", "cancel"))
        assert status["code"] == 0 and status["doc"]["result"]["running"] is None, (name, status)
        assert status["doc"]["result"]["next"]["kind"] == "run", (name, status["doc"]["result"]["next"])
        assert brief["code"] == 0 and brief["doc"]["result"]["running"] is None, (name, brief)
        assert brief["doc"]["result"]["next"] == status["doc"]["result"]["next"], name
        assert dry["code"] == 0 and dry["doc"]["result"]["next"]["kind"] == "run", (name, dry)
        assert cancel["code"] == 0 and cancel["doc"]["ok"], (name, cancel)
        assert "nothing was signalled" in cancel["stderr"] or not cancel["doc"]["result"].get("signalled"), (name, cancel)
        for verb in verbs.values():  # the hint never tells anyone to kill a pid or delete the lock by hand
            text = json.dumps(verb["doc"]) + verb["stderr"]
            assert "kill 1" not in text and "rm state/lock" not in text, (name, text[-500:])
