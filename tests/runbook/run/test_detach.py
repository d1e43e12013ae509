"""`runbook next --detach`, the running state, `runbook logs -f` and `runbook cancel`, on real processes.

Every supervisor here is started by the test's own `runbook next --detach`; the only process a
test signals itself is a supervisor whose pid that command printed (and the lock names). Each
test ends with no supervisor and no step of its runs left (checked through /proc).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import helpers as H
import pytest

FAST = {"RUNBOOK_HEARTBEAT_S": "0.2"}

# step-1 waits until the file `go` exists, so the test decides when the run may end
PLAN = """\
---
runbook: 1
title: Detach
---

# Detach

Prose that must survive.

## Phase 0: Wait for go

Steps:
- [ ] Wait: `echo waiting; while [ ! -e go ]; do sleep 0.05; done; echo '{"m": 1}' > "$RUNBOOK_METRICS"`
- [ ] After: `echo after-1; echo after-2`

Pass: `m >= 1`
"""


def rb(repo: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    result = H.runbook(repo, *args, env=FAST, timeout=timeout)
    H.assert_no_traceback(result, " ".join(args))
    return result


def rb_json(repo: Path, *args: str) -> dict:
    result = rb(repo, *args, "--json")
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == result.returncode, result.stdout
    return doc


def make(tmp_path: Path, name: str = "repo") -> Path:
    repo = H.make_repo(tmp_path / name, PLAN)
    (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "go\n")
    H.git(repo, "commit", "-qam", "ignore go")  # the history the tests below assert: init, ignore go, ...
    return repo


def run_processes(run_id: str) -> list[int]:
    """Live processes carrying RUNBOOK_RUN_ID=<run_id> (a step of that run)."""
    entry = f"RUNBOOK_RUN_ID={run_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                env = Path(f"/proc/{name}/environ").read_bytes()
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if entry in env.split(b"\0") and state not in ("Z", "X"):
                found.append(int(name))
    return found


alive, wait_for = H.alive, H.wait_for


def running_view(repo: Path) -> dict | None:
    return rb_json(repo, "status")["result"]["running"]


@pytest.fixture
def repo(tmp_path: Path):
    repo = make(tmp_path)
    yield repo
    # leave nothing running: `runbook cancel` signals only the run lock's proven holder
    if (repo / "state" / "lock").exists():
        (repo / "go").touch()
        H.runbook(repo, "cancel", "--wait", "60", env=FAST, timeout=90)


def normalized(text: str) -> str:
    text = re.sub(r"\d{8}-\d{6}-[0-9a-f]{4}", "RUN", text)
    text = re.sub(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2})?( UTC)?", "WHEN", text)
    text = re.sub(r"\| [0-9a-f]{7,40} \|", "| COMMIT |", text)
    text = re.sub(r"sha=[0-9a-f]{8}", "sha=HASH", text)  # a block's hash covers the run ids and times in it
    return re.sub(r"\| \d+(\.\d+)?(ms|s|m|h)[0-9sm]* \|", "| TOOK |", text)


VOLATILE = {"run_id", "started", "finished", "duration_s", "commit_before", "commit", "env"}


def ledger_shape(record: dict) -> dict:
    out = {k: v for k, v in record.items() if k not in VOLATILE}
    out["steps"] = [{k: (normalized(v) if isinstance(v, str) else v) for k, v in s.items()
                     if k not in ("started", "finished", "duration_s")} for s in record["steps"]]
    return out


def test_detach_returns_at_once_status_shows_the_run_and_a_second_detach_exits_5(repo: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    started = rb_json(repo, "next", "--yes", "--detach")
    took = time.monotonic() - t0
    assert started["exit_code"] == 0, started
    detached = started["result"]["detached"]
    assert detached["run_id"] and detached["pid"] and started["result"]["runs"] == []
    assert not (repo / "go").exists(), "the caller returned while step-1 still waits for go"
    assert alive(detached["pid"]), "the supervisor outlives the caller"
    print(f"runbook next --detach returned in {took:.2f}s")

    view = wait_for(lambda: (v := running_view(repo)) and v.get("step") == "step-1" and v.get("log_tail") and v)
    assert view["run_id"] == detached["run_id"] and view["pid"] == detached["pid"] and view["alive"] is True
    assert view["detached"] is True and view["executor"] == "local"
    assert view["heartbeat"] and view["heartbeat_age_s"] is not None and view["heartbeat_age_s"] < 5
    assert view["silent"] is False and view["steps_total"] == 2 and view["log_tail"] == ["waiting"]
    status = rb_json(repo, "status")["result"]
    assert status["next"]["kind"] == "running" and status["phases"][0]["state"] == "running"
    beat = status["running"]["heartbeat"]
    wait_for(lambda: running_view(repo)["heartbeat"] != beat)  # it keeps beating
    text = rb(repo, "status").stdout
    assert "supervisor pid" in text and "step-1" in text and "last heartbeat" in text and "waiting" in text
    brief = rb_json(repo, "brief")["result"]
    assert brief["running"]["step"] == "step-1" and brief["next"]["kind"] == "running"
    history = rb_json(repo, "history")["result"]
    assert history["running"]["run_id"] == detached["run_id"]
    assert rb_json(repo, "show")["result"]["phase"]["state"]["state"] == "running"

    second = rb_json(repo, "next", "--yes", "--detach")
    assert second["exit_code"] == 5 and second["error"]["code"] == "locked", second
    assert second["error"]["lock"]["pid"] == detached["pid"]
    assert rb(repo, "next", "--yes").returncode == 5

    follow = H.popen_runbook(repo, "logs", "-f", env=FAST)  # follows step-1, then step-2, ends with the run
    assert follow.stdout.readline() == "waiting\n"  # step-1's log so far, printed at once
    (repo / "go").touch()
    out, err = follow.communicate(timeout=120)
    assert follow.returncode == 0, err
    assert "── step-2 ──\nafter-1\nafter-2\n" in out, out
    assert "ended: pass" in err
    wait_for(lambda: not (repo / "state" / "lock").exists())
    wait_for(lambda: not alive(detached["pid"]))  # the supervisor exits once it has committed
    assert run_processes(detached["run_id"]) == []

    # the same plan, run in the foreground in a twin repository: same plan bytes, ledger and one commit
    twin = make(tmp_path, "twin")
    (twin / "go").touch()
    fg = rb(twin, "next", "--yes")
    assert fg.returncode == 0, fg.stdout + fg.stderr
    plan_d, plan_f = ((r / "plans" / "plan.md").read_text() for r in (repo, twin))
    assert normalized(plan_d) == normalized(plan_f)
    assert plan_d != PLAN and "Prose that must survive." in plan_d
    rec_d, rec_f = (H.committed_runs(r) for r in (repo, twin))
    assert len(rec_d) == len(rec_f) == 1
    (d,), (f,) = rec_d.values(), rec_f.values()
    assert d["detached"] is True and f["detached"] is False
    assert {**ledger_shape(d), "detached": None} == {**ledger_shape(f), "detached": None}
    for r in (repo, twin):
        subjects = H.git(r, "log", "--format=%s").splitlines()
        assert subjects == ["runbook: phase-0 pass (m=1)", "ignore go", "init"], subjects
        assert H.git(r, "status", "--porcelain") == ""
    changed = {r: H.git(r, "show", "--name-only", "--format=", "HEAD").split() for r in (repo, twin)}
    assert [p.replace(d["run_id"], "RUN") for p in changed[repo]] == [p.replace(f["run_id"], "RUN") for p in changed[twin]]


def test_kill_9_of_the_supervisor_is_seen_as_interrupted_and_next_resumes(repo: Path) -> None:
    started = rb_json(repo, "next", "--yes", "--detach")["result"]["detached"]
    pid, run_id = started["pid"], started["run_id"]
    wait_for(lambda: (v := running_view(repo)) and v.get("step") == "step-1" and v.get("log_tail"))
    lock = json.loads((repo / "state" / "lock").read_text())
    assert lock["pid"] == pid and alive(pid), "the pid the caller printed is the lock's holder"
    waiting = rb(repo, "wait", "--timeout", "1", "--json")  # `runbook wait`: still running after 1 s, exit 5
    assert waiting.returncode == 5, waiting.stdout + waiting.stderr
    view = json.loads(waiting.stdout)["result"]
    assert view["state"] == "running" and view["run_id"] == run_id and view["running"]["step"] == "step-1"
    # a hung supervisor (stopped here) stops beating: readers flag it silent, still alive
    os.kill(pid, signal.SIGSTOP)  # the supervisor this test started, by the pid it was given
    silent = wait_for(lambda: (v := running_view(repo)) and v.get("silent") and v, timeout=30)
    assert silent["alive"] is True and silent["heartbeat_age_s"] > 5
    assert "NO heartbeat for" in rb(repo, "status").stdout
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid))

    status = rb_json(repo, "status")["result"]
    assert status["running"] is None
    assert status["phases"][0]["state"] == "resumable"
    last = status["last_run"]
    assert last["run_id"] == run_id and last["pending"] is True and last["verdict"] == "interrupted"
    assert f"the supervisor (pid {pid}) died during step-1" in last["reason"]
    assert status["next"]["kind"] == "resume" and "runbook next` records it" in status["next"]["why"]
    history = rb_json(repo, "history")["result"]["runs"]
    assert [r["pending"] for r in history] == [True]
    assert "interrupted (not yet recorded)" in rb(repo, "history").stdout
    died = rb(repo, "wait", "--json")  # answered at once: the run's runbook died
    assert died.returncode == 4, died.stdout + died.stderr
    view = json.loads(died.stdout)["result"]
    assert view["state"] == "died" and view["run_id"] == run_id and view["waited_s"] < 5
    assert view["run"]["pending"] is True and view["run"]["verdict"] == "interrupted"
    log = repo / "state" / "runs" / run_id / "step-1.log"
    assert log.read_text().startswith("waiting")

    (repo / "go").touch()
    resumed = rb(repo, "next", "--yes")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"run {run_id} (phase-0) was not recorded" in resumed.stderr
    runs = H.committed_runs(repo)
    first, second = sorted(runs.values(), key=lambda r: r["started"])
    assert first["run_id"] == run_id and first["verdict"] == "interrupted" and first["detached"] is True
    assert first["steps"][0]["exit_code"] is None and first["steps"][0]["log_tail"] == ["waiting"]
    assert second["verdict"] == "pass"
    subjects = H.git(repo, "log", "--format=%s").splitlines()
    assert subjects[0] == "runbook: phase-0 pass (m=1)" and subjects[1].startswith("runbook: phase-0 interrupted (")
    assert len(subjects) == 4, subjects  # init, ignore go, interrupted, pass
    assert log.exists(), "the partial log is kept"
    assert run_processes(run_id) == [], "the dead run's step was stopped when its lock was taken over"


def test_cancel_stops_the_detached_step_and_records_interrupted(repo: Path) -> None:
    started = rb_json(repo, "next", "--yes", "--detach")["result"]["detached"]
    run_id = started["run_id"]
    wait_for(lambda: (v := running_view(repo)) and v.get("step") == "step-1" and run_processes(run_id))
    cancelled = rb_json(repo, "cancel")
    assert cancelled["exit_code"] == 0, cancelled
    result = cancelled["result"]
    assert result["cancelled"] is True and f"pid {started['pid']}" in result["how"]
    run = result["run"]
    assert run["run_id"] == run_id and run["verdict"] == "interrupted"
    assert run["reason"].startswith("cancelled (runbook cancel): SIGTERM during step-1")
    assert not alive(started["pid"]) and run_processes(run_id) == []
    assert not (repo / "state" / "lock").exists()
    status = rb_json(repo, "status")["result"]
    assert status["phases"][0]["state"] == "resumable" and status["running"] is None
    assert H.git(repo, "log", "-1", "--format=%s").startswith("runbook: phase-0 interrupted (cancelled")
    assert rb_json(repo, "cancel")["result"]["cancelled"] is False  # nothing left to cancel
