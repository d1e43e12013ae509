"""Crash safety: kill -9 of `runbook next` / `runbook record` at random moments, and a full disk.

Each kill round starts the real console script in its own session, waits a random time (from the
start, or from the moment its steps finished, to land in write-back and commit), and kills
either the runbook process alone or its whole process group (git children included, which can
leave `.git/*.lock` files behind). A `git` wrapper that sleeps before each call widens the commit
window. After every kill:

- the plan and the notes parse without errors; every run JSON on disk loads;
- at HEAD, the committed run JSONs and the runs in the plan's results tables are the same set;
- the next `runbook next` (or `runbook record`) succeeds, taking over the stale run lock and
  clearing the `.git` locks the killed run left; afterwards nothing is left uncommitted.

Disk full (RLIMIT_FSIZE in the child, SIGXFSZ ignored): a clear message naming the file, exit
!= 0, no traceback, the plan / notes byte-identical, no temp files left.

RUNBOOK_KILL_ROUNDS=N sets the rounds per kill test (default 6).
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import helpers as H
import pytest

from runbook.plan.parse import parse_plan, read_plan
from runbook.report import notes as notes_mod
from runbook.store.ledger import load_run

PLAN = """\
---
runbook: 1
title: Crash
notes: notes.md
---

# Crash test plan

Prose that must survive every kill.

## Phase 0: A (~1 min)

Steps:
- [ ] One: `sleep 0.2; echo '{"m": 1}' > "$RUNBOOK_METRICS"`
- [ ] Two: `touch stepdone`

Pass: `m >= 1`
On pass: Phase 1

## Phase 1: B

Steps:
- [ ] Three: `echo '{"m": 2}' > "$RUNBOOK_METRICS"; touch stepdone`

Pass: `m >= 1`
On pass: Phase 0
"""

RUN_ROW = re.compile(r"^\| (\d{8}-\d{6}-[0-9a-f]{4}) \|", re.M)


def _slow_git(tmp_path: Path) -> dict[str, str]:
    real = shutil.which("git")
    wrapper = tmp_path / "slowgit"
    wrapper.write_text(f"#!/bin/sh\nsleep 0.1\nexec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    return {"GIT_PYTHON_GIT_EXECUTABLE": str(wrapper)}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return H.make_repo(tmp_path / "repo", PLAN, ignore=("stepdone",))


def git_locks(repo: Path) -> list[str]:
    gdir = repo / ".git"
    found = [p for p in gdir.rglob("*.lock")] + list(gdir.glob("index.runbook*"))
    return sorted(str(p.relative_to(repo)) for p in found)


def kill_group(proc: subprocess.Popen, whole_group: bool) -> None:
    try:
        if whole_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=30)
    # with only runbook killed, its git children finish on their own: wait for the group to empty
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process group {proc.pid} still alive 30 s after the kill")


def check_consistent(repo: Path, where: str) -> None:
    """Plan (and notes) parse; run JSONs load; HEAD's ledger == HEAD's results tables."""
    plan, problems = read_plan(repo / "plans" / "plan.md")
    errors = [str(p) for p in problems if p.severity == "error"]
    assert plan is not None and not errors, f"{where}: plan broken: {errors}"
    notes = repo / "plans" / "notes.md"
    if notes.exists():
        assert notes_mod.problems(notes.read_text()) == [], f"{where}: notes broken"
    for path in (repo / "state" / "runs").glob("*.json"):
        load_run(path)  # raises on a half-written record
    committed = H.committed_runs(repo)
    head_plan = H.git(repo, "show", "HEAD:plans/plan.md")
    parsed, _ = parse_plan(head_plan, "HEAD:plans/plan.md")
    assert parsed is not None
    rows = set(RUN_ROW.findall(head_plan))
    assert set(committed) == rows, (
        f"{where}: ledger and plan disagree at HEAD: only in ledger {set(committed) - rows}, "
        f"only in the plan {rows - set(committed)}"
    )
    fsck = subprocess.run(["git", "fsck", "--no-dangling", "--no-progress"], cwd=repo, capture_output=True, text=True)
    assert fsck.returncode == 0, f"{where}: git fsck: {fsck.stdout}{fsck.stderr}"


def check_clean(repo: Path, where: str) -> None:
    status = H.git(repo, "status", "--porcelain")
    assert status == "", f"{where}: left uncommitted:\n{status}"
    assert git_locks(repo) == [], f"{where}: git locks left: {git_locks(repo)}"
    assert not (repo / "state" / "lock").exists(), f"{where}: run lock left"


@pytest.mark.slow
def test_kill_9_runbook_next_at_random_moments(repo: Path, tmp_path: Path, counts) -> None:
    rng = random.Random(os.environ.get("RUNBOOK_KILL_SEED", "runbook"))
    env = _slow_git(tmp_path)
    rounds = H.kill_rounds(6)
    survived = 0
    for i in range(rounds):
        (repo / "stepdone").unlink(missing_ok=True)
        whole_group = rng.random() < 0.5
        after_steps = rng.random() < 0.7
        proc = H.popen_runbook(repo, "next", "--yes", env=env, start_new_session=True)
        if after_steps:
            deadline = time.monotonic() + 60
            while not (repo / "stepdone").exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            delay = rng.uniform(0, 1.5)
        else:
            delay = rng.uniform(0, 2.5)
        time.sleep(delay)
        finished = proc.poll() is not None
        kill_group(proc, whole_group)
        where = f"round {i} (delay {delay:.2f}s {'after steps' if after_steps else 'from start'}, " \
                f"{'group' if whole_group else 'pid'} kill, finished first: {finished})"
        print(where, "git locks:", git_locks(repo))
        check_consistent(repo, where + " after the kill")
        again = H.runbook(repo, "next", "--yes", env=env)
        H.assert_no_traceback(again, where)
        assert again.returncode == 0, f"{where}: runbook next did not continue:\n{again.stdout[-1500:]}\n{again.stderr[-1500:]}"
        check_consistent(repo, where + " after the next run")
        check_clean(repo, where + " after the next run")
        survived += 1
    counts.report("kills_survived_next", survived)


@pytest.mark.slow
def test_kill_9_runbook_record_at_random_moments(repo: Path, tmp_path: Path, counts) -> None:
    rng = random.Random(os.environ.get("RUNBOOK_KILL_SEED", "record"))
    env = _slow_git(tmp_path)
    notes = repo / "plans" / "notes.md"
    rounds = H.kill_rounds(6)
    survived = 0
    for i in range(rounds):
        title = f"Milestone {i}"
        args = ["record", title, "--metric", f"m{i}={i}.5", "--lesson", f"lesson number {i}", "--next", f"step {i}"]
        whole_group = rng.random() < 0.5
        proc = H.popen_runbook(repo, *args, env=env, start_new_session=True)
        delay = rng.uniform(0.2, 2.0)
        time.sleep(delay)
        kill_group(proc, whole_group)
        where = f"record round {i} (delay {delay:.2f}s, {'group' if whole_group else 'pid'} kill)"
        print(where, "git locks:", git_locks(repo))
        check_consistent(repo, where)
        if notes.exists():
            text = notes.read_text()
            # all or nothing: the milestone and its lesson are written together
            assert ("### " in text and title in text) == (f"lesson number {i}" in text), where
        again = H.runbook(repo, *args, env=env)
        H.assert_no_traceback(again, where)
        if again.returncode != 0:
            # a git lock left by the killed group: the message must name it; removing it is the way out
            assert again.returncode == 1 and ".lock" in again.stderr, (where, again.stdout, again.stderr)
            for lock in git_locks(repo):
                (repo / lock).unlink()
            again = H.runbook(repo, *args, env=env)
        assert again.returncode == 0, (where, again.stdout, again.stderr)
        text = notes.read_text()
        for j in range(i + 1):
            assert f"Milestone {j}" in text and f"lesson number {j}" in text, (where, j)
        assert text.count(f"lesson number {i}") == 1  # a lesson is never added twice
        check_consistent(repo, where + " after the retry")
        check_clean(repo, where + " after the retry")
        survived += 1
    counts.report("kills_survived_record", survived)


def test_stale_index_lock_and_run_lock_are_taken_over(repo: Path, counts) -> None:
    """A dead run's state/lock plus the .git locks it left: the next run clears them and goes on."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5))
    (repo / "state").mkdir(exist_ok=True)
    (repo / "state" / "lock").write_text(json.dumps(
        {"pid": dead.pid, "host": os.uname().nodename, "started": started, "run_id": "20261129-000000-dead"}))
    (repo / ".git" / "index.lock").write_text("")
    result = H.runbook(repo, "next", "--yes")
    H.assert_no_traceback(result)
    assert result.returncode == 0, result.stderr
    assert "stale run lock" in result.stderr and "index.lock" in result.stderr
    check_consistent(repo, "after takeover")
    check_clean(repo, "after takeover")
    counts.add("stale_locks_taken_over")


def test_index_lock_of_a_live_git_is_not_removed(repo: Path) -> None:
    """An index.lock with no dead runbook behind it is not ours: refused with the file named."""
    lock = repo / ".git" / "index.lock"
    lock.write_text("")
    result = H.runbook(repo, "record", "Busy", "--lesson", "x")
    H.assert_no_traceback(result)
    assert result.returncode != 0
    assert "index.lock" in result.stderr
    assert lock.exists()
    lock.unlink()


# ---- disk full ---------------------------------------------------------------------------------

BIG_PLAN = PLAN.replace("Prose that must survive every kill.", "Prose that fills the plan up.\n" * 400)


def _limited(limit: int):
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


def _temp_files(repo: Path) -> list[str]:
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*.tmp") if ".git" not in p.parts)


@pytest.mark.parametrize("verb", ["next", "record"])
def test_disk_full_while_writing_back(tmp_path: Path, counts, verb: str) -> None:
    repo = H.make_repo(tmp_path / "repo", BIG_PLAN, notes="# Notes\n\n" + "Old notes line.\n" * 400)
    plan_path, notes_path = repo / "plans" / "plan.md", repo / "plans" / "notes.md"
    plan_before, notes_before = plan_path.read_bytes(), notes_path.read_bytes()
    head = H.git(repo, "rev-parse", "HEAD")
    # the lock and the ledger JSON fit under the limit; the grown plan (or notes) does not
    limit = (len(plan_before) if verb == "next" else len(notes_before)) + 64
    if verb == "next":
        args = ["next", "--yes"]
        target = "plans/plan.md"
    else:
        args = ["record", "Full disk", "--body", "-"]
        target = "plans/notes.md"
    result = subprocess.run(
        [*H.RUNBOOK, *args], cwd=repo, capture_output=True, text=True, env=H.cli_env(), timeout=120,
        preexec_fn=_limited(limit), input="A body long enough to overflow the limit. " * 10,
    )
    H.assert_no_traceback(result, f"disk full during {verb}")
    assert result.returncode != 0, result.stdout
    message = result.stdout + result.stderr
    assert target in message and ("too large" in message.lower() or "no space" in message.lower()), message[-2000:]
    assert plan_path.read_bytes() == plan_before
    assert notes_path.read_bytes() == notes_before
    assert _temp_files(repo) == []
    assert not (repo / "state" / "lock").exists()
    if verb == "next":
        # the run itself is not lost: its ledger record is written and committed
        runs = list((repo / "state" / "runs").glob("*.json"))
        assert len(runs) == 1 and load_run(runs[0]).verdict == "pass"
    else:
        assert H.git(repo, "rev-parse", "HEAD") == head
    # and once there is room again, the work goes on
    again = H.runbook(repo, *args[:2], *(["--yes"] if verb == "next" else []))
    assert again.returncode == 0, again.stdout + again.stderr
    counts.add("disk_full_cases")


def test_atomic_write_under_rlimit_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "plan.md"
    target.write_text("old content\n")
    code = (
        "import sys; from runbook.files import atomic_write_text\n"
        "try:\n atomic_write_text(sys.argv[1], 'x' * 100000)\n"
        "except OSError as e:\n print('ERR', e.filename, e.strerror); sys.exit(3)\n"
    )
    result = subprocess.run([H.BIN / "python", "-c", code, str(target)], capture_output=True, text=True,
                            preexec_fn=_limited(4096))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "plan.md" in result.stdout
    assert target.read_text() == "old content\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.md"]
