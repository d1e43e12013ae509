"""Signals, concurrent runs and a killed runbook, against the real `runbook next` process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import helpers as H
import pytest

RUNBOOK = H.RUNBOOK  # the console script, or python -m runbook.cli

# step-2 records its shell's pid, then waits until the file `ok` exists (at most 20 s)
PLAN = """\
---
runbook: 1
title: Signals
---

## Phase 0: Wait

Steps:
- [ ] Count: `echo run >> count.txt; echo '{"n": 1}' > $RUNBOOK_METRICS`
- [ ] Wait: `echo $$ > step2.pid; i=0; while [ ! -f ok ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done`

Pass: `n == 1`
"""


git = H.git


@pytest.fixture
def repo(tmp_path):
    return H.make_repo(tmp_path / "repo", PLAN, ignore=("step2.pid", "count.txt", "ok"))


ENV = {**os.environ, "RUNBOOK_ENV_PROBE": "0"}


def start(repo: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*RUNBOOK, "next", "--yes", *args], cwd=repo, env=ENV, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RUNBOOK, "next", "--yes", *args], cwd=repo, env=ENV, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


def wait_for(path: Path) -> None:
    H.wait_for_file(path, timeout=30, nonempty=True)


def gone(pid: int) -> bool:
    return H.gone(pid, timeout=5)


def last_run(repo: Path) -> dict:
    recs = [json.loads(p.read_text()) for p in (repo / "state" / "runs").glob("*.json")]
    return max(recs, key=lambda r: r["started"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_mid_step_is_interrupted_then_resumes(repo, sig):
    proc = start(repo)
    wait_for(repo / "step2.pid")
    step_pid = int((repo / "step2.pid").read_text())
    t0 = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 4, out + err
    assert time.monotonic() - t0 < 10
    assert gone(step_pid)  # the step's whole group was killed
    rec = last_run(repo)
    assert rec["verdict"] == "interrupted" and signal.Signals(sig).name in rec["reason"]
    assert [s["exit_code"] for s in rec["steps"]] == [0, -15]
    text = (repo / "plans" / "plan.md").read_text()
    assert "- [x] Count" in text and "- [ ] Wait" in text and "**Status:** interrupted" in text
    assert git(repo, "log", "-1", "--format=%s").startswith("runbook: phase-0 interrupted")
    assert not (repo / "state" / "lock").exists()

    (repo / "ok").write_text("")
    again = run(repo)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "at step 2" in again.stdout
    assert (repo / "count.txt").read_text() == "run\n"  # step 1 was not repeated
    assert last_run(repo)["verdict"] == "pass"


def test_two_runs_at_once_one_refused(repo):
    first = start(repo)
    wait_for(repo / "step2.pid")
    step_pid = int((repo / "step2.pid").read_text())
    deadline = time.monotonic() + 5
    while (lock := json.loads((repo / "state" / "lock").read_text()))["step_pgid"] != step_pid:
        assert time.monotonic() < deadline, lock  # the lock names the running step's group
        time.sleep(0.05)
    assert lock["pid"] == first.pid
    second = run(repo)
    assert second.returncode == 5, second.stdout + second.stderr
    assert f"pid {first.pid}" in second.stderr and lock["run_id"] in second.stderr
    assert "since" in second.stderr and "`runbook cancel`" in second.stderr and "`runbook logs -f`" in second.stderr
    (repo / "ok").write_text("")
    out, err = first.communicate(timeout=30)
    assert first.returncode == 0, out + err
    assert len(list((repo / "state" / "runs").glob("*.json"))) == 1


def test_kill_9_then_stale_lock_taken_over(repo):
    proc = start(repo)
    wait_for(repo / "step2.pid")
    step_pid = int((repo / "step2.pid").read_text())
    proc.kill()
    proc.communicate(timeout=10)
    assert (repo / "state" / "lock").exists()
    os.kill(step_pid, 0)  # the step outlived runbook (its own session)
    (repo / "step2.pid").unlink()

    (repo / "ok").write_text("")
    again = run(repo)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "stale run lock" in again.stderr and f"pid {proc.pid}" in again.stderr
    assert gone(step_pid)
    from runbook.plan.parse import read_plan

    plan, problems = read_plan(repo / "plans" / "plan.md")
    assert plan is not None and not [p for p in problems if p.severity == "error"]
    assert plan.phases[0].status.verdict == "pass"
    assert not (repo / "state" / "lock").exists()
