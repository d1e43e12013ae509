"""Every commit runbook makes holds only runbook's own change (issue 51), in real repositories through
the real CLI, undone with a real `git revert`.

- `forget` and `reset` commit the plan's uncommitted edits alone first (`runbook: plan edits before
  forget run <id>` / `... before reset <phase>`): `git revert` of their own commit brings back exactly
  what they dropped and keeps the edits, byte for byte.
- A run a refused commit left uncommitted is committed by the next `runbook next` apart from the plan
  edits made since (its write-back taken out of them): reverting the run's commit keeps the edits.
- A git hook that hangs in those commits is stopped 3 s after SIGTERM, in `next` and in `forget`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import helpers as H
import pytest

PLAN = """\
---
runbook: 1
title: One change a commit
---

## Phase 0: Probe

Steps:
- [ ] Measure: `echo '{"m": 1}' > "$RUNBOOK_METRICS"`

Pass: m >= 1

## Phase 1: Train

Steps:
- [ ] Train: `echo '{"loss": 2}' > "$RUNBOOK_METRICS"`

Pass: loss < 3
"""

PLAN_FILE = "plans/plan.md"


def _edit_title(text: str) -> str:
    """A person's edit that leaves every phase as it was (it reruns nothing)."""
    return text.replace("title: One change a commit", "title: One change a commit (edited)")


def _edit(text: str) -> str:
    """A person's edits: the title, a line of Phase 0's prose, Phase 0's step command."""
    edited = _edit_title(text)
    edited = edited.replace("## Phase 0: Probe\n", "## Phase 0: Probe\n\nProbe it twice.\n", 1)
    edited = edited.replace("""echo '{"m": 1}'""", """echo '{"m": 2}'""")
    assert edited.count("(edited)") == 1 and "Probe it twice." in edited and '"m": 2' in edited
    return edited


def _run_ids(repo: Path) -> set[str]:
    return {p.stem for p in (repo / "state" / "runs").glob("*.json")}


def _subjects(repo: Path, n: int) -> list[str]:
    return H.git(repo, "log", f"-{n}", "--format=%s").splitlines()


def _files(repo: Path, commit: str) -> list[str]:
    return sorted(H.git(repo, "show", "--name-only", "--format=", commit).split())


def _revert(repo: Path, commit: str) -> None:
    done = subprocess.run(["git", "revert", "--no-edit", commit], cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("verb", ["forget", "reset"])
def test_git_revert_of_forget_or_reset_keeps_the_plan_edits_made_before_it(tmp_path: Path, verb: str) -> None:
    """The plan is edited (title, prose, a step of the phase) after Phase 0 ran; `forget last` /
    `reset 0` commits the edits alone first, then the forget; `git revert` of the forget gives back
    the plan as edited, byte for byte, and the run (forget and reset folded the edits into their own
    commit, so the revert dropped them too)."""
    repo = H.make_repo(tmp_path / "repo", PLAN)
    ran = H.runbook(repo, "next", "--yes")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (run_id,) = _run_ids(repo)
    plan = repo / PLAN_FILE
    assert f"| {run_id} |" in plan.read_text()
    edited = _edit(plan.read_text()).encode()
    plan.write_bytes(edited)

    args = ["forget", "last"] if verb == "forget" else ["reset", "0"]
    done = H.runbook(repo, *args)
    H.assert_no_traceback(done)
    assert done.returncode == 0, done.stdout + done.stderr
    own, edits = _subjects(repo, 2)
    what = f"forget run {run_id}" if verb == "forget" else "reset phase-0"
    assert edits == f"runbook: plan edits before {what}", edits
    assert own.startswith(f"runbook: {what}"), own
    assert H.git(repo, "show", f"HEAD~1:{PLAN_FILE}").encode() == edited  # the edits, alone
    assert _files(repo, "HEAD~1") == [PLAN_FILE]
    assert run_id not in plan.read_text() and "Probe it twice." in plan.read_text()
    assert H.git(repo, "status", "--porcelain") == ""

    _revert(repo, "HEAD")
    assert plan.read_bytes() == edited  # the forgotten run's blocks back, the edits kept
    assert _run_ids(repo) == {run_id} and run_id in H.committed_runs(repo)
    assert H.git(repo, "status", "--porcelain") == ""


def test_forget_with_a_clean_plan_makes_one_commit(tmp_path: Path) -> None:
    """Nothing to commit first: forget is one commit, as before."""
    repo = H.make_repo(tmp_path / "repo", PLAN)
    assert H.runbook(repo, "next", "--yes").returncode == 0
    before = H.git(repo, "rev-parse", "HEAD").strip()
    assert H.runbook(repo, "forget", "last").returncode == 0
    assert H.git(repo, "rev-parse", "HEAD~1").strip() == before


def _refusing_hook(repo: Path) -> Path:
    hook = repo / ".git" / "hooks" / "reference-transaction"
    hook.write_text('#!/bin/sh\n[ "$1" = prepared ] && { echo "aborted by hook" >&2; exit 1; }\nexit 0\n')
    hook.chmod(0o755)
    return hook


@pytest.mark.parametrize("then", ["nothing to run", "a run"])
def test_a_run_left_uncommitted_is_committed_apart_from_the_plan_edits_made_since(tmp_path: Path,
                                                                                 then: str) -> None:
    """A hook refuses the commit of Phase 0's run (it stays on disk, written into the plan); the
    plan is then edited (its title; or its title, prose and a step, so Phase 0 runs again); the next `runbook next` commits the edits alone (the run's write-back taken
    out of them), then the run (`record run <id> (left uncommitted)`). `git revert` of the run's
    commit keeps the edits (the run's commit held them, and the revert dropped them)."""
    single = PLAN.split("\n## Phase 1", 1)[0]
    repo = H.make_repo(tmp_path / "repo", single)
    plan = repo / PLAN_FILE
    hook = _refusing_hook(repo)
    refused = H.runbook(repo, "next", "--yes")
    assert refused.returncode == 2 and "aborted by hook" in refused.stderr, refused.stdout + refused.stderr
    hook.unlink()
    (run_id,) = _run_ids(repo)
    assert f"| {run_id} |" in plan.read_text() and run_id not in H.committed_runs(repo)
    written = plan.read_text()
    edit = _edit_title if then == "nothing to run" else _edit  # a step edited: Phase 0 runs again
    plan.write_text(edit(written))
    mine = edit(single).encode()  # the edits alone, without the run's write-back

    args = ["next", "--yes"] if then == "nothing to run" else ["next", "--yes", "--phase", "0"]
    again = H.runbook(repo, *args)
    H.assert_no_traceback(again)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"committed run {run_id}, which an interrupted runbook recorded but left uncommitted" in again.stderr
    n = 2 if then == "nothing to run" else 3
    subjects = _subjects(repo, n)
    assert subjects[-2] == f"runbook: record run {run_id} (left uncommitted)", subjects
    assert subjects[-1].startswith("runbook: plan edits before "), subjects
    edits_commit, record_commit = f"HEAD~{n - 1}", f"HEAD~{n - 2}"
    assert H.git(repo, "show", f"{edits_commit}:{PLAN_FILE}").encode() == mine
    assert _files(repo, edits_commit) == [PLAN_FILE]
    assert H.git(repo, "show", f"{record_commit}:{PLAN_FILE}").encode() == edit(written).encode()
    assert f"state/runs/{run_id}.json" in _files(repo, record_commit)
    assert H.git(repo, "status", "--porcelain") == ""
    if then == "nothing to run":
        _revert(repo, "HEAD")
        assert plan.read_bytes() == mine  # the run's results gone, the edits kept
        assert _run_ids(repo) == set()


def _hanging_hook(repo: Path, pidfile: Path) -> None:
    """A reference-transaction hook that hangs (once): its pid (a `sleep`) goes to `pidfile`."""
    hook = repo / ".git" / "hooks" / "reference-transaction"
    hook.write_text(f"#!/bin/sh\n[ -e '{pidfile}' ] && exit 0\necho $$ > '{pidfile}'\nexec sleep 600\n")
    hook.chmod(0o755)


@pytest.mark.parametrize("verb", ["next", "forget"])
def test_a_hook_that_hangs_while_the_plan_edits_are_committed_is_stopped_by_sigterm(tmp_path: Path,
                                                                                    verb: str) -> None:
    """The plan is edited; a hook hangs in the commit of those edits (`next`: before the run;
    `forget`: before the forget). SIGTERM stops it within a few seconds: exit 2 naming the
    interruption, the hook's process gone, no HEAD.lock, HEAD unmoved (`next` waited the whole git
    timeout, deaf to SIGTERM; `forget` died at once and left the hook running)."""
    repo = H.make_repo(tmp_path / "repo", PLAN)
    if verb == "forget":
        assert H.runbook(repo, "next", "--yes").returncode == 0
    plan = repo / PLAN_FILE
    plan.write_text(_edit(plan.read_text()))
    head = H.git(repo, "rev-parse", "HEAD")
    pidfile = tmp_path / "hook.pid"
    _hanging_hook(repo, pidfile)
    args = ["next", "--yes"] if verb == "next" else ["forget", "last"]
    proc = H.popen_runbook(repo, *args, env={"RUNBOOK_GIT_TIMEOUT_S": "300"})
    hook_pid = None
    try:
        H.wait_for_file(pidfile, timeout=60, nonempty=True)
        hook_pid = int(pidfile.read_text())
        time.sleep(0.5)  # runbook is polling git now
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
        H.assert_no_traceback((out, err))
        assert proc.returncode == 2, out + err
        assert "was stopped: runbook was interrupted" in err, err
        assert took < 20
        assert H.gone(hook_pid, timeout=10), "the hook outlived runbook"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if hook_pid is not None and H.alive(hook_pid):
            os.kill(hook_pid, signal.SIGKILL)  # the hook's `sleep` (its shell exec'd it), started by this test
    assert not (repo / ".git" / "HEAD.lock").exists()
    assert H.git(repo, "rev-parse", "HEAD") == head
    if verb == "forget":
        assert len(_run_ids(repo)) == 1  # refused before anything was dropped
        assert json.loads(next((repo / "state" / "runs").glob("*.json")).read_text())["verdict"] == "pass"
