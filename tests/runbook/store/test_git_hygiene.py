"""What runbook commits, and how, in real repositories through the real CLI.

- A git hook that refuses the commit (reference-transaction) makes `next` exit non-zero (2) and
  `record` exit 1, each naming git's refusal; nothing is silently left uncommitted with exit 0.
- `commit.gpgsign = true` is honoured: runbook's commits are signed (ssh signing, a real key);
  a signing key that cannot sign is a refusal, never an unsigned commit.
- Files runbook creates get the mode `open()` gives them under the user's umask, not 0600.
- A plan in a git-ignored directory is refused before anything runs (the ignore rule named);
  `--no-commit` still runs it.
- A password inside a URL var (`https://user:secret@host`) never reaches the run record (commands,
  log tails); the phase is not judged stale for it.
- A run made with uncommitted changes to tracked files says so and records which files.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import helpers as H

PLAN = """\
---
runbook: 1
title: Git hygiene
notes: notes.md
vars:
  url: https://alice:s3cr3t-pw@example.com/data.git
---

## Phase 0: Probe

Steps:
- [ ] Use the url: `echo "fetching {url}"; echo '{"m": 1}' > "$RUNBOOK_METRICS"`

Pass: m >= 1
"""


def repo_with(tmp_path: Path, plan: str = PLAN, plan_name: str = "plan.md") -> Path:
    return H.make_repo(tmp_path / "repo", plan, notes="# Notes\n", plan_name=plan_name)


def last_record(repo: Path) -> dict:
    """The run that started last (by its start time: two run ids of one second sort by their random
    suffix, so the file names do not give the order)."""
    records = [json.loads(p.read_text()) for p in (repo / "state" / "runs").glob("*.json")]
    return max(records, key=lambda r: r["started"])


def test_a_hook_that_refuses_the_commit_is_not_exit_0(tmp_path: Path, counts) -> None:
    repo = repo_with(tmp_path)
    hook = repo / ".git" / "hooks" / "reference-transaction"
    hook.write_text("#!/bin/sh\necho 'policy: no commits today' >&2\nexit 1\n")
    hook.chmod(0o755)
    head = H.git(repo, "rev-parse", "HEAD")
    result = H.runbook(repo, "next", "--yes")
    H.assert_no_traceback(result)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not committed" in result.stderr and "aborted by hook" in result.stderr
    assert last_record(repo)["verdict"] == "pass"  # the run itself is kept, on disk
    record = H.runbook(repo, "record", "Milestone", "--lesson", "hooks exist")
    H.assert_no_traceback(record)
    assert record.returncode == 1 and "aborted by hook" in record.stderr, record.stderr
    assert H.git(repo, "rev-parse", "HEAD") == head
    counts.add("git_refusals_reported", 2)


def _hanging_hook(repo: Path, pidfile: Path) -> None:
    """A reference-transaction hook that hangs (once): its pid (a `sleep`) goes to `pidfile`."""
    hook = repo / ".git" / "hooks" / "reference-transaction"
    hook.write_text(f"#!/bin/sh\n[ -e '{pidfile}' ] && exit 0\necho $$ > '{pidfile}'\nexec sleep 600\n")
    hook.chmod(0o755)


def _no_hook(repo: Path) -> None:
    (repo / ".git" / "hooks" / "reference-transaction").unlink()


def test_a_hook_that_hangs_is_stopped_and_the_run_committed_by_the_next_command(tmp_path: Path) -> None:
    """A git hook that hangs while a run is committed: `runbook next` kills it (its process group,
    which runbook made) after RUNBOOK_GIT_TIMEOUT_S, or a few seconds after SIGTERM, and exits 2 with
    the run recorded on disk; after kill -9 the hook is left but the run is on disk too. The next
    `runbook next` with nothing to run commits the run and says so (it waited forever, deaf to
    SIGTERM and SIGINT, and after kill -9 the run was never committed)."""
    # 1. the timeout
    repo = repo_with(tmp_path)
    pidfile = tmp_path / "hook.pid"
    _hanging_hook(repo, pidfile)
    started = time.monotonic()
    result = H.runbook(repo, "next", "--yes", env={"RUNBOOK_GIT_TIMEOUT_S": "3"}, timeout=120)
    assert time.monotonic() - started < 60
    H.assert_no_traceback(result)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "`git update-ref` did not finish in 3 s and was killed" in result.stderr, result.stderr
    assert H.gone(int(pidfile.read_text()), timeout=10), "the hook outlived runbook"
    run_id = last_record(repo)["run_id"]
    assert last_record(repo)["verdict"] == "pass" and run_id not in H.committed_runs(repo)
    _no_hook(repo)
    again = H.runbook(repo, "next", "--yes", timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"committed run {run_id}, which an interrupted runbook recorded but left uncommitted" in again.stderr
    assert run_id in H.committed_runs(repo) and H.git(repo, "status", "--porcelain", "--", "state", "plans") == ""
    assert f"| {run_id} |" in H.git(repo, "show", "HEAD:plans/plan.md")

    # 2. SIGTERM (what runbook cancel, the MCP server and the supervisor send) while the hook hangs
    for signum in (signal.SIGTERM, signal.SIGKILL):
        pidfile.unlink()
        _hanging_hook(repo, pidfile)
        proc = subprocess.Popen([*H.RUNBOOK, "next", "--phase", "0", "--restart", "--yes"], cwd=repo,
                                env=H.cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            H.wait_for_file(pidfile, timeout=60, nonempty=True)
            hook_pid = int(pidfile.read_text())
            proc.send_signal(signum)  # our own child
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        if signum == signal.SIGTERM:
            H.assert_no_traceback(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
            assert proc.returncode == 2 and "was stopped: runbook was interrupted" in err, (proc.returncode, err)
            assert H.gone(hook_pid, timeout=10), "the hook outlived runbook"
        else:
            assert not H.gone(hook_pid, timeout=1)  # its own group: kill -9 of runbook leaves it
            os.kill(hook_pid, signal.SIGKILL)  # started by our child's git: ours to stop
            assert H.gone(hook_pid, timeout=10)
        run_id = last_record(repo)["run_id"]
        assert run_id not in H.committed_runs(repo)
        _no_hook(repo)
        again = H.runbook(repo, "next", "--yes", timeout=120)
        assert again.returncode == 0, (signum, again.stdout + again.stderr)
        assert f"committed run {run_id}" in again.stderr and run_id in H.committed_runs(repo), again.stderr


def _ssh_signing(repo: Path, key: Path) -> None:
    H.git(repo, "config", "gpg.format", "ssh")
    H.git(repo, "config", "user.signingkey", str(key) + ".pub")
    H.git(repo, "config", "commit.gpgsign", "true")


def test_commit_gpgsign_is_honoured(tmp_path: Path) -> None:
    key = tmp_path / "signing"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    repo = repo_with(tmp_path)
    _ssh_signing(repo, key)
    (repo / "plans" / "plan.md").write_text(PLAN.replace("Probe", "Probe it"))  # edits: committed first
    result = H.runbook_inproc(repo, "next", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    record = H.runbook_inproc(repo, "record", "Signed", "--lesson", "sign everything")
    assert record.returncode == 0, record.stderr
    made = H.git(repo, "rev-list", "HEAD", "^HEAD~3").split()
    assert len(made) == 3  # plan edits, the run, the record
    for commit in made:
        assert "\ngpgsig " in H.git(repo, "cat-file", "commit", commit), f"{commit} is not signed"


def test_signing_that_fails_is_a_refusal_not_an_unsigned_commit(tmp_path: Path) -> None:
    repo = repo_with(tmp_path)
    _ssh_signing(repo, tmp_path / "no-such-key")
    head = H.git(repo, "rev-parse", "HEAD")
    result = H.runbook(repo, "next", "--yes")
    H.assert_no_traceback(result)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not committed" in result.stderr
    assert H.git(repo, "rev-parse", "HEAD") == head


def _runbook_with_umask(repo: Path, mask: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f'umask {mask}; exec "$@"', "runbook", *H.RUNBOOK, *args],
        cwd=repo, capture_output=True, text=True, env=H.cli_env(), timeout=120, stdin=subprocess.DEVNULL,
    )


def test_new_files_follow_the_umask(tmp_path: Path) -> None:
    for mask, mode in (("022", 0o644), ("002", 0o664)):
        repo = H.make_repo(tmp_path / mask, PLAN.replace("notes: notes.md\n", "notes: notes.md\n"))
        result = _runbook_with_umask(repo, mask, "next", "--yes")
        assert result.returncode == 0, result.stderr
        record = _runbook_with_umask(repo, mask, "record", "First", "--lesson", "x")
        assert record.returncode == 0, record.stderr
        created = [*(repo / "state" / "runs").glob("*.json"), repo / "plans" / "notes.md"]
        for path in created:
            assert stat.S_IMODE(path.stat().st_mode) == mode, (mask, path, oct(path.stat().st_mode))


def test_plan_in_an_ignored_directory_is_refused_before_running(tmp_path: Path) -> None:
    repo = H.init_repo(tmp_path / "repo")
    (repo / ".gitignore").write_text("scratch/\nstate/lock\nstate/write.lock\nstate/runs/*/\n")
    (repo / "scratch").mkdir()
    (repo / "scratch" / "plan.md").write_text(PLAN.replace("Use the url", "Touch").replace(
        'echo "fetching {url}"', "touch RAN"))
    H.git(repo, "add", ".gitignore")
    H.git(repo, "commit", "-qm", "init")
    result = H.runbook(repo, "next", "--yes", "--plan", "scratch/plan.md")
    H.assert_no_traceback(result)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "scratch/plan.md (ignored by .gitignore" in result.stderr and "--no-commit" in result.stderr
    assert not (repo / "RAN").exists()
    ok = H.runbook_inproc(repo, "next", "--yes", "--plan", "scratch/plan.md", "--no-commit")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (repo / "RAN").exists()


def test_url_passwords_never_reach_the_record(tmp_path: Path, counts) -> None:
    repo = repo_with(tmp_path)
    env = {"HF_ENDPOINT": "https://bob:hf-pass@mirror.example.com"}
    result = H.runbook_inproc(repo, "next", "--yes", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    path = sorted((repo / "state" / "runs").glob("*.json"))[-1]
    text = path.read_text()
    assert "s3cr3t-pw" not in text and "hf-pass" not in text
    record = json.loads(text)
    assert record["steps"][0]["command"] == 'echo "fetching https://alice:***@example.com/data.git"; echo \'{"m": 1}\' > "$RUNBOOK_METRICS"'
    assert "fetching https://alice:***@example.com/data.git" in record["steps"][0]["log_tail"]
    assert "s3cr3t-pw" not in H.git(repo, "show", "HEAD", "--", "state")  # what runbook committed (the
    # plan holding the var is the author's own file, committed by the author)
    # the redacted record still speaks for the phase: nothing is rerun as "changed"
    again = H.runbook_inproc(repo, "next", "--yes", "--dry-run")
    assert again.returncode == 0 and "CHANGED" not in again.stdout and "changed" not in again.stdout.lower(), again.stdout
    counts.add("secrets_redacted", 2)


def test_uncommitted_code_is_warned_and_recorded(tmp_path: Path) -> None:
    repo = repo_with(tmp_path)
    (repo / "src").mkdir()
    (repo / "src" / "model.py").write_text("LR = 1\n")
    H.git(repo, "add", "src")
    H.git(repo, "commit", "-qm", "code")
    clean = H.runbook_inproc(repo, "next", "--yes")
    assert clean.returncode == 0 and "uncommitted changes" not in clean.stderr
    assert last_record(repo)["dirty"] is False and last_record(repo)["dirty_files"] == []
    (repo / "src" / "model.py").write_text("LR = 2\n")
    (repo / "untracked.py").write_text("x\n")
    dirty = H.runbook_inproc(repo, "next", "--yes", "--phase", "0", "--restart")
    assert dirty.returncode == 0, dirty.stdout + dirty.stderr
    assert "uncommitted changes to 1 tracked file(s) (src/model.py)" in dirty.stderr
    record = last_record(repo)
    assert record["dirty"] is True and record["dirty_files"] == ["src/model.py"]
    assert os.environ.get("RUNBOOK_ENV_PROBE") != "1"


def test_url_passwords_in_set_overrides_are_not_recorded_and_resume_asks_again(tmp_path: Path) -> None:
    plan = PLAN.replace(
        '- [ ] Use the url: `echo "fetching {url}"; echo \'{"m": 1}\' > "$RUNBOOK_METRICS"`',
        '- [ ] Use the url: `echo "fetching {url}"`\n- [ ] Second: `test -e ok && echo \'{"m": 1}\' > "$RUNBOOK_METRICS"`',
    )
    repo = repo_with(tmp_path, plan)
    (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "ok\n")
    H.git(repo, "commit", "-qam", "ignore")
    secret = "https://carol:set-pw@example.com/x.git"
    first = H.runbook_inproc(repo, "next", "--yes", "--set", f"url={secret}")
    assert first.returncode == 4, first.stdout + first.stderr  # step 2 fails: the run is resumable
    record = last_record(repo)
    assert record["vars"]["url"] == "https://carol:***@example.com/x.git" and "url" in record["overrides"]
    assert "set-pw" not in (sorted((repo / "state" / "runs").glob("*.json"))[-1]).read_text()
    (repo / "ok").write_text("")
    again = H.runbook(repo, "next", "--yes")
    H.assert_no_traceback(again)
    assert again.returncode == 2 and "--set url=..." in again.stderr, again.stdout + again.stderr
    resumed = H.runbook_inproc(repo, "next", "--yes", "--set", f"url={secret}")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "set-pw" not in H.git(repo, "log", "-p", "--", "state")
