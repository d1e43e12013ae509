"""Committing only runbook's files through a temporary index, on real repositories."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import commit_files, git, init_repo

from runbook.store import gitops


@pytest.fixture
def repo(tmp_path):
    return init_repo(tmp_path)


def test_first_commit_in_empty_repo_keeps_user_staging(repo):
    (repo / "plan.md").write_text("plan\n")
    (repo / "state" / "runs").mkdir(parents=True)
    (repo / "state" / "runs" / "r.json").write_text("{}\n")
    (repo / "mine.txt").write_text("staged by the user\n")
    git(repo, "add", "mine.txt")
    (repo / "wip.txt").write_text("unstaged\n")
    assert gitops.head_commit(repo) is None
    sha = gitops.commit_paths(repo, ["plan.md", "state/runs/r.json"], "runbook: phase-0 pass (x=1)")
    assert sha == gitops.head_commit(repo)
    assert git(repo, "show", "--name-only", "--format=%s", "HEAD").split() == [
        "runbook:", "phase-0", "pass", "(x=1)", "plan.md", "state/runs/r.json"]
    status = git(repo, "status", "--porcelain")
    assert "A  mine.txt" in status and "?? wip.txt" in status
    assert "plan.md" not in status and "state/" not in status
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"


def test_partial_user_staging_of_other_file_survives(repo):
    commit_files(repo, {"code.py": "v1\n", "plan.md": "p1\n"}, "init")
    (repo / "code.py").write_text("v2\n")
    git(repo, "add", "code.py")
    (repo / "code.py").write_text("v3\n")  # staged v2, work tree v3
    (repo / "plan.md").write_text("p2\n")
    sha = gitops.commit_paths(repo, ["plan.md"], "runbook: x")
    assert git(repo, "show", "--name-only", "--format=", sha).split() == ["plan.md"]
    assert git(repo, "show", ":code.py") == "v2\n"  # the user's staged version is still staged
    assert (repo / "code.py").read_text() == "v3\n"
    assert git(repo, "status", "--porcelain").splitlines() == ["MM code.py"]
    assert gitops.commit_paths(repo, ["plan.md"], "again") is None  # nothing changed


def test_detached_head(repo):
    commit_files(repo, {"plan.md": "p1\n"}, "init")
    git(repo, "checkout", "-q", "--detach")
    (repo / "plan.md").write_text("p2\n")
    sha = gitops.commit_paths(repo, ["plan.md"], "runbook: detached")
    assert git(repo, "rev-parse", "HEAD").strip() == sha
    assert git(repo, "rev-parse", "main").strip() != sha  # the branch did not move


def test_refuses_during_merge(repo):
    commit_files(repo, {"f": "base\n"}, "base")
    git(repo, "checkout", "-qb", "other")
    (repo / "f").write_text("other\n")
    git(repo, "commit", "-qam", "other")
    git(repo, "checkout", "-q", "main")
    (repo / "f").write_text("main\n")
    git(repo, "commit", "-qam", "main")
    subprocess.run(["git", "merge", "other"], cwd=repo, capture_output=True)
    assert (repo / ".git" / "MERGE_HEAD").exists()
    (repo / "plan.md").write_text("p\n")
    with pytest.raises(gitops.GitStateError, match="merge is in progress.*--abort"):
        gitops.commit_paths(repo, ["plan.md"], "runbook: x")
    with pytest.raises(gitops.GitStateError, match="merge"):
        gitops.check_can_commit(repo)


def test_dirty_blob_and_show(repo):
    (repo / "plan.md").write_text("p1\n")
    assert gitops.is_dirty(repo, "plan.md")  # untracked
    gitops.commit_paths(repo, ["plan.md"], "c")
    assert not gitops.is_dirty(repo, "plan.md")
    blob = gitops.blob_hash(b"p1\n")
    assert blob == git(repo, "hash-object", "plan.md").strip()
    assert gitops.show_blob(repo, blob) == "p1\n"
    assert gitops.show_blob(repo, "0" * 40) is None
    (repo / "plan.md").write_text("p2\n")
    assert gitops.is_dirty(repo, "plan.md")


def test_missing_identity_is_named(tmp_path, monkeypatch):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.useConfigOnly", "true")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(gitops.GitStateError, match="git config user.name"):
        gitops.check_can_commit(tmp_path)


def _loose_objects(repo: Path) -> int:
    counts = dict(line.split(": ") for line in git(repo, "count-objects", "-v").splitlines())
    return int(counts["count"])


def test_a_commit_packs_loose_objects_as_git_commit_would(repo):
    # thousands of reachable loose objects, committed without git's own automatic gc
    files = repo / "files"
    files.mkdir()
    for i in range(3000):
        (files / f"f{i}.txt").write_text(f"{i}\n")
    git(repo, "-c", "gc.auto=0", "add", "files")
    git(repo, "-c", "gc.auto=0", "commit", "-q", "-m", "many files")
    assert _loose_objects(repo) > 2000
    git(repo, "config", "gc.auto", "256")
    (repo / "plan.md").write_text("plan\n")
    sha = gitops.commit_paths(repo, ["plan.md"], "runbook: phase-0 pass")
    assert sha == gitops.head_commit(repo)
    assert _loose_objects(repo) < 256  # packed, in the foreground
    assert git(repo, "fsck", "--no-progress") == ""
    git(repo, "config", "gc.auto", "0")  # and with gc turned off by the user, nothing is packed
    for i in range(3000, 4000):
        (files / f"f{i}.txt").write_text(f"{i}\n")
    git(repo, "-c", "gc.auto=0", "add", "files")
    git(repo, "-c", "gc.auto=0", "commit", "-q", "-m", "more files")
    before = _loose_objects(repo)
    (repo / "plan.md").write_text("plan 2\n")
    gitops.commit_paths(repo, ["plan.md"], "runbook: phase-0 pass again")
    assert _loose_objects(repo) >= before
