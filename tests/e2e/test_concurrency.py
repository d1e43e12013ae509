"""Concurrency: many `runbook next` / `runbook record` processes on one repository at once.

- Parallel `runbook next`: exactly one runs; every other one exits 5 naming the holder (its pid
  and run id); the one run is recorded once.
- Parallel `runbook record` (while a `runbook next` runs a phase): none is lost. Every milestone is
  in the notes exactly once, every record has its own commit, history is linear, the work tree
  is clean, and the commit sections of different processes never overlap in time (one writer at
  a time: checked from a log written by a `git` wrapper).

RUNBOOK_CONCURRENCY=N sets the number of parallel records (default 6).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import helpers as H
import pytest

PLAN = """\
---
runbook: 1
title: Concurrency
notes: notes.md
---

# Many hands

## Phase 0: Gate

Steps:
- [ ] Wait for the gate: `echo $$ > started; i=0; while [ ! -f go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done`
- [ ] Score: `echo '{"m": 1}' > "$RUNBOOK_METRICS"`

Pass: `m >= 1`
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return H.make_repo(tmp_path / "repo", PLAN, ignore=("started", "go"))


def _logging_git(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A git wrapper that logs `ppid start end index` for every call made with a temporary index."""
    real = shutil.which("git")
    log = tmp_path / "git-calls.log"
    wrapper = tmp_path / "loggit"
    wrapper.write_text(
        "#!/bin/sh\n"
        "t0=$(date +%s.%N)\n"
        f"{real} \"$@\"\n"
        "rc=$?\n"
        f"case \"$GIT_INDEX_FILE\" in *index.runbook*) echo \"$PPID $t0 $(date +%s.%N) $1\" >> {log};; esac\n"
        "exit $rc\n"
    )
    wrapper.chmod(0o755)
    return {"GIT_PYTHON_GIT_EXECUTABLE": str(wrapper)}, log


def _wait(path: Path) -> None:
    H.wait_for_file(path, timeout=60)


@pytest.mark.slow
def test_parallel_next_one_runs_others_refused_naming_the_holder(repo: Path, counts) -> None:
    n = 4
    procs = [H.popen_runbook(repo, "next", "--yes") for _ in range(n)]
    _wait(repo / "started")
    # every process but the holder ends with exit 5 while the holder waits at the gate
    deadline = time.monotonic() + 90
    while sum(p.poll() is not None for p in procs) < n - 1:
        assert time.monotonic() < deadline, "the refused runs did not exit"
        time.sleep(0.05)
    lock = json.loads((repo / "state" / "lock").read_text())
    (repo / "go").write_text("")
    results = [(p, *p.communicate(timeout=90)) for p in procs]
    winners = [r for r in results if r[0].returncode == 0]
    refused = [r for r in results if r[0].returncode == 5]
    assert len(winners) == 1 and len(refused) == n - 1, [(p.returncode, err[-500:]) for p, _, err in results]
    holder = winners[0][0]
    assert lock["pid"] == holder.pid
    for _p, _out, err in refused:
        # the holder by pid and host (its run id too, once it has one), and the way out
        assert f"pid {holder.pid} on " in err and "since" in err and str(repo / "state" / "lock") in err, err
        assert "Traceback" not in err
    runs = list((repo / "state" / "runs").glob("*.json"))
    assert len(runs) == 1
    assert H.git(repo, "status", "--porcelain") == ""
    counts.report("concurrent_next_runs", n)


@pytest.mark.slow
def test_parallel_records_while_a_phase_runs_lose_nothing(repo: Path, tmp_path: Path, counts) -> None:
    n = int(os.environ.get("RUNBOOK_CONCURRENCY", "6"))
    env, log = _logging_git(tmp_path)
    runner = H.popen_runbook(repo, "next", "--yes", env=env)
    _wait(repo / "started")
    records = [
        H.popen_runbook(repo, "record", f"Parallel milestone {i}", "--metric", f"m{i}={i}",
                        "--lesson", f"parallel lesson {i}", env=env)
        for i in range(n)
    ]
    time.sleep(0.5)
    (repo / "go").write_text("")  # the phase finishes and writes back while records are still going
    outs = [(p, *p.communicate(timeout=180)) for p in records]
    out, err = runner.communicate(timeout=180)
    assert runner.returncode == 0, out[-1000:] + err[-1000:]
    for p, o, e in outs:
        assert p.returncode == 0, (o, e)
        assert "Traceback" not in e
    notes = (repo / "plans" / "notes.md").read_text()
    for i in range(n):
        assert len(re.findall(rf"^### .*Parallel milestone {i}\b", notes, re.M)) == 1, notes
        assert notes.count(f"parallel lesson {i}") == 1
    # every record has its own commit; history linear; the disk is what HEAD says
    subjects = H.git(repo, "log", "--format=%s").splitlines()
    assert sorted(s for s in subjects if s.startswith("runbook: record")) == sorted(
        s for s in subjects if s.startswith("runbook: record Parallel milestone"))
    assert sum(s.startswith("runbook: record Parallel milestone") for s in subjects) == n
    assert any(s.startswith("runbook: phase-0 pass") for s in subjects)
    assert H.git(repo, "rev-list", "--merges", "HEAD") == ""
    assert H.git(repo, "show", "HEAD:plans/notes.md") == notes
    assert H.git(repo, "status", "--porcelain") == ""
    # one writer at a time: the commit sections of different processes never overlap
    spans: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        ppid, t0, t1, _verb = line.split()
        span = spans.setdefault(ppid, [float(t0), float(t1)])
        span[0], span[1] = min(span[0], float(t0)), max(span[1], float(t1))
    assert len(spans) >= n  # one per record (plus the run's own commit)
    ordered = sorted(spans.values())
    for (a0, a1), (b0, _b1) in zip(ordered, ordered[1:], strict=False):
        assert a1 <= b0, f"two writers at once: {a0}-{a1} overlaps {b0}"
    counts.report("concurrent_records", n)
    counts.report("concurrent_next_runs", 1)


@pytest.mark.slow
def test_parallel_next_and_record_mixed(repo: Path, counts) -> None:
    nexts = [H.popen_runbook(repo, "next", "--yes") for _ in range(3)]
    records = [H.popen_runbook(repo, "record", f"Mixed {i}", "--next", f"go on {i}") for i in range(3)]
    _wait(repo / "started")
    deadline = time.monotonic() + 90
    while sum(p.poll() is not None for p in nexts) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (repo / "go").write_text("")
    codes = sorted(p.wait(timeout=120) for p in nexts)
    assert codes == [0, 5, 5]
    for p in records:
        _o, e = p.communicate(timeout=120)
        assert p.returncode == 0, e
    notes = (repo / "plans" / "notes.md").read_text()
    assert all(f"Mixed {i}" in notes for i in range(3))
    assert H.git(repo, "status", "--porcelain") == ""
    counts.report("concurrent_next_runs", 3)
    counts.report("concurrent_records", 3)
