"""`run_branch = "runbook/{branch}"` in runbook.toml: runs, sweeps, choices and plan edits are committed on
a side branch, the checked-out branch does not move, and the user merges the side branch when they choose
(squashed or not). Real git, the real CLI in process."""

from __future__ import annotations

from pathlib import Path

import helpers as H

PLAN = """\
---
runbook: 1
title: Runs off the shared branch
vars:
  lr: "0.1"
---

## Phase 1: Fit

Steps:
- [ ] Fit: `python3 -c "import sys; print('{\\"acc\\": %s}' % sys.argv[1])" {lr} > "$RUNBOOK_METRICS"`

Pass: acc >= 0.2

## Phase 2: Use it

Steps:
- [ ] Use: `true`
"""


def test_runs_go_on_the_side_branch_until_the_user_merges_it(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    H.commit_files(repo, {"runbook.toml": 'run_branch = "runbook/{branch}"\n'}, "side branch")
    branch = H.git(repo, "symbolic-ref", "--short", "HEAD").strip()
    head = H.git(repo, "rev-parse", "HEAD").strip()
    env = {"RUNBOOK_ENV_PROBE": "0"}
    assert H.runbook_inproc(repo, "next", "--yes", env=env).returncode == 1  # acc 0.1: fail
    done = H.runbook_inproc(repo, "sweep", "1", "--set", "lr=0.3,0.5", "--pick", "best:acc", "--yes", env=env)
    assert done.returncode == 0, done.stderr
    (repo / "plans" / "plan.md").write_text((repo / "plans" / "plan.md").read_text() + "\nA note by hand.\n")
    assert H.runbook_inproc(repo, "next", "--yes", env=env).returncode == 0  # Phase 2
    side = f"runbook/{branch}"
    assert H.git(repo, "rev-parse", "HEAD").strip() == head  # the shared branch did not move
    subjects = H.git(repo, "log", "--format=%s", f"{head}..{side}").splitlines()
    assert len(subjects) == 7 and subjects[-1] == "runbook: phase-1 fail (acc=0.1)"
    assert sum("[trial " in s for s in subjects) == 2 and any("decided by run" in s for s in subjects)
    assert any(s.startswith("runbook: plan edits before run") for s in subjects)
    # what runbook wrote is staged (nothing unstaged or untracked of it), so the merge goes through
    status = [line for line in H.git(repo, "status", "--porcelain", "--", "plans", "state").splitlines()
              if not line.startswith("?? state/runs/") or line.endswith(".json")]
    assert status and all(line[0] in "MA" and line[1] == " " for line in status), status
    H.git(repo, "merge", "-q", "--squash", side)
    H.git(repo, "commit", "-qm", "the runs of the lr sweep")
    assert H.git(repo, "rev-list", "--count", f"{head}..HEAD").strip() == "1"
    assert "A note by hand." in H.git(repo, "show", "HEAD:plans/plan.md")
    # runbook knows these runs are committed: nothing is committed again, the next run goes on the side branch
    again = H.runbook_inproc(repo, "next", "--phase", "2", "--restart", "--yes", env=env)
    assert again.returncode == 0 and "left uncommitted" not in again.stderr and "plan edits" not in again.stderr
    assert H.git(repo, "log", "-1", "--format=%s", side).startswith("runbook: phase-2 pass")
    assert H.git(repo, "rev-list", "--count", f"{head}..HEAD").strip() == "1"
    # the user commits code of their own meanwhile (only that file): the side branch takes HEAD in
    (repo / "fit.py").write_text("print('v2')\n")
    H.git(repo, "add", "fit.py")
    H.git(repo, "commit", "-qm", "fit v2", "--", "fit.py")
    again = H.runbook_inproc(repo, "next", "--phase", "2", "--restart", "--yes", env=env)
    assert again.returncode == 0 and "left uncommitted" not in again.stderr and "plan edits" not in again.stderr
    H.git(repo, "merge", "-q", "--ff-only", side)  # the side branch descends from HEAD: a fast-forward
    assert H.git(repo, "show", "HEAD:fit.py") == "print('v2')\n"
    assert not H.git(repo, "status", "--porcelain", "--", "plans", "state/runs/*.json")
