"""`runbook next` end to end: real git repos in temp dirs, the real console script, real steps."""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
from pathlib import Path

import helpers as H
import pytest

RUNBOOK = H.RUNBOOK  # the console script, or python -m runbook.cli

PLAN = """\
---
runbook: 1
title: Demo
vars:
  msg: "it's a; $(touch pwned) `touch pwned2` \\"q\\" *"
---

# Demo plan

Prose the tool must never touch.

## Phase 0: Probe (~1 min)

Does it work?

Steps:
- [ ] Say: `printf '%s\\n' {msg} > said.txt`
- [ ] Measure: `echo '{"loss": 1.5}' > $RUNBOOK_METRICS`

Pass: `loss < 2`

## Phase 1: Train

Steps:
- [ ] Train: `echo '{"acc": 0.3}' > $RUNBOOK_METRICS`

Pass: `acc > 0.5`
On fail: Phase 2

## Phase 2: Fallback

Steps:
- [ ] Fix: `echo '{"acc": 0.9}' > $RUNBOOK_METRICS`

Pass: acc > 0.5
"""


git = H.git


def make_repo(tmp_path: Path, plan: str = PLAN) -> Path:
    return H.make_repo(tmp_path / "repo", plan)


def runbook(repo: Path, *args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI in this process (helpers.runbook_inproc: same argv, cwd, environment and streams)."""
    return H.runbook_inproc(repo, *args, env=env, timeout=timeout)


def runbook_subprocess(repo: Path, *args: str, env: dict | None = None,
                       timeout: float = 60) -> subprocess.CompletedProcess:
    """The console script in a subprocess: for the tests about signals and a missing terminal."""
    full_env = {**os.environ, "RUNBOOK_ENV_PROBE": "0", **(env or {})}
    return subprocess.run(
        [*RUNBOOK, *args], cwd=repo, capture_output=True, text=True, env=full_env, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def runs(repo: Path) -> list[dict]:
    files = sorted((repo / "state" / "runs").glob("*.json"))
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["started"])


_BLOCK_LINE = re.compile(r"^(<!-- /?runbook:(status|results)( sha=[0-9a-f]{8})? -->|\*\*Status:\*\* .*|\|.*\||)$")


def assert_only_blocks_and_checkboxes(old: str, new: str) -> None:
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
        if line.startswith(("---", "+++", "@@")):
            continue
        body = line[1:]
        if re.match(r"^- \[[ xX]\] ", body):
            continue  # a checkbox line (its text is checked below)
        assert _BLOCK_LINE.match(body), f"unexpected change: {line!r}"
    untick = re.sub(r"^- \[[xX]\] ", "- [ ] ", new, flags=re.M)
    without_blocks = re.sub(r"<!-- runbook:(\w+)[^\n]*-->\n.*?<!-- /runbook:\1 -->\n", "", untick, flags=re.S)
    assert [x for x in without_blocks.splitlines() if x] == [x for x in old.splitlines() if x]


def test_three_phases_until_stop_branch_commits_and_quoting(tmp_path):
    repo = make_repo(tmp_path)
    (repo / "mine.txt").write_text("the user's staged work\n")
    git(repo, "add", "mine.txt")
    (repo / "wip.txt").write_text("unstaged\n")
    base = git(repo, "rev-parse", "HEAD").strip()

    done = runbook(repo, "next", "--until-stop", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing to run: the plan is finished" in done.stdout

    recs = runs(repo)
    assert [(r["phase"], r["verdict"]) for r in recs] == [("phase-0", "pass"), ("phase-1", "fail"), ("phase-2", "pass")]
    assert recs[0]["metrics"]["loss"] == 1.5 and recs[0]["metrics"]["step-2.loss"] == 1.5
    assert recs[0]["commit_before"] == base

    # one commit per run, touching only the plan and that run's ledger file
    log = git(repo, "log", "--format=%H %s", f"{base}..HEAD").splitlines()[::-1]
    assert [line.split(" ", 1)[1] for line in log] == [
        "runbook: phase-0 pass (loss=1.5)", "runbook: phase-1 fail (acc=0.3)", "runbook: phase-2 pass (acc=0.9)"]
    for line, rec in zip(log, recs, strict=True):
        files = git(repo, "show", "--name-only", "--format=", line.split()[0]).split()
        assert sorted(files) == ["plans/plan.md", f"state/runs/{rec['run_id']}.json"]

    # the user's staged file is still staged and in no commit; unstaged work untouched
    status = git(repo, "status", "--porcelain").splitlines()
    assert "A  mine.txt" in status and "?? wip.txt" in status
    assert not [s for s in status if "plan.md" in s or "state/" in s]

    new = (repo / "plans" / "plan.md").read_text()
    assert_only_blocks_and_checkboxes(PLAN, new)
    assert new.count("- [x]") == 4 and new.count("<!-- runbook:results sha=") == 3
    assert "| acc | took | verdict |" in new and "| 0.3 |" in new

    # vars are data: quotes, ;, $(...) and backticks arrive verbatim and nothing ran
    assert (repo / "said.txt").read_text() == "it's a; $(touch pwned) `touch pwned2` \"q\" *\n"
    assert not (repo / "pwned").exists() and not (repo / "pwned2").exists()

    # the plan is finished: another `next` runs nothing and says so
    again = runbook(repo, "next", "--yes")
    assert again.returncode == 0 and "nothing to run" in again.stdout
    assert len(runs(repo)) == 3

    hist = runbook(repo, "history", "--json")
    envelope = json.loads(hist.stdout)
    assert (envelope["command"], envelope["ok"], envelope["exit_code"]) == ("history", True, 0)
    assert [r["verdict"] for r in envelope["result"]["runs"]] == ["pass", "fail", "pass"]
    assert [r["label"] for r in envelope["result"]["runs"]] == ["Phase 0", "Phase 1", "Phase 2"]
    assert [r["commit"] for r in envelope["result"]["runs"]] == [r["commit_before"] for r in recs]
    table = runbook(repo, "history", "1")
    assert "phase-1" in table.stdout and "acc=0.3" in table.stdout and "phase-0" not in table.stdout


def test_single_step_json_and_record_hint(tmp_path):
    repo = make_repo(tmp_path)
    before = git(repo, "rev-parse", "HEAD").strip()
    done = runbook(repo, "next", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    envelope = json.loads(done.stdout)
    assert envelope["exit_code"] == 0 and envelope["ok"] is True and envelope["command"] == "next"
    out = envelope["result"]
    assert len(out["runs"]) == 1 and out["selected"]["phase"] == "phase-0" and out["dry_run"] is False
    rec = out["runs"][0]
    assert rec["verdict"] == "pass" and rec["recorded_in"] == git(repo, "rev-parse", "HEAD").strip()
    assert rec["commit"] == before  # the commit its code ran on
    # where the plan goes next is data too
    assert out["next"]["kind"] == "run" and out["next"]["phase"] == "phase-1"
    assert out["next"]["argv"] == [H.RUNBOOK_EXE, "next", "--yes"]
    assert f"runbook record 'Probe: pass' --run {rec['run_id']}" in done.stderr
    # the step's output went to stderr, stdout is only the JSON
    assert rec["steps"][1]["log_path"] == f"state/runs/{rec['run_id']}/step-2.log"


def test_error_exit_3_then_resume_at_failed_step(tmp_path):
    plan = PLAN.replace(
        "- [ ] Measure: `echo '{\"loss\": 1.5}' > $RUNBOOK_METRICS`",
        "- [ ] Count: `echo run >> count.txt; echo '{\"loss\": 1.5}' > $RUNBOOK_METRICS`\n"
        "- [ ] Flaky: `test -f ok || exit 3`",
    )
    repo = make_repo(tmp_path, plan)
    first = runbook(repo, "next", "--yes")
    assert first.returncode == 4, first.stdout + first.stderr
    rec = runs(repo)[-1]
    assert rec["verdict"] == "error" and "step-3 exited 3" in rec["reason"]
    text = (repo / "plans" / "plan.md").read_text()
    assert "- [x] Say" in text and "- [x] Count" in text and "- [ ] Flaky" in text
    assert "**Status:** error" in text

    (repo / "ok").write_text("")
    second = runbook(repo, "next", "--yes")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming its last run" in second.stdout and "at step 3" in second.stdout
    assert (repo / "count.txt").read_text() == "run\n"  # step-2 did not run again
    rec = runs(repo)[-1]
    assert [s["skipped"] for s in rec["steps"]] == [True, True, False]
    assert rec["verdict"] == "pass" and rec["metrics"]["loss"] == 1.5  # carried from the first run


def test_edited_phase_reruns_from_top_with_diff(tmp_path):
    plan = PLAN.replace("- [ ] Measure: `echo '{\"loss\": 1.5}' > $RUNBOOK_METRICS`",
                        "- [ ] Count: `echo run >> count.txt`\n- [ ] Flaky: `exit 3`")
    repo = make_repo(tmp_path, plan)
    assert runbook(repo, "next", "--yes").returncode == 4
    path = repo / "plans" / "plan.md"
    path.write_text(path.read_text().replace("- [ ] Flaky: `exit 3`",
                                             "- [ ] Flaky: `echo '{\"loss\": 1}' > $RUNBOOK_METRICS`"))
    again = runbook(repo, "next", "--yes")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "changed since" in again.stdout and "+- [ ] Flaky: `echo" in again.stdout
    assert "step-3  (CHANGED since run" in again.stdout
    assert (repo / "count.txt").read_text() == "run\nrun\n"
    # the human edit was committed on its own before the run
    subjects = git(repo, "log", "--format=%s").splitlines()
    assert subjects[0] == "runbook: phase-0 pass (loss=1)"
    assert subjects[1].startswith("runbook: plan edits before run ")
    assert git(repo, "show", "--name-only", "--format=", "HEAD~1").split() == ["plans/plan.md"]


def test_timeout_kills_step(tmp_path):
    plan = PLAN.replace("Pass: `loss < 2`", "Pass: `loss < 2`\nTimeout: 1s").replace(
        "- [ ] Measure: `echo '{\"loss\": 1.5}' > $RUNBOOK_METRICS`", "- [ ] Slow: `sleep 30`")
    repo = make_repo(tmp_path, plan)
    done = runbook_subprocess(repo, "next", "--yes", timeout=30)
    assert done.returncode == 4, done.stdout + done.stderr
    rec = runs(repo)[-1]
    assert rec["verdict"] == "timeout" and rec["duration_s"] < 10
    assert rec["steps"][-1]["exit_code"] == -15
    shown = json.loads(runbook(repo, "history", "--json").stdout)["result"]["runs"][-1]
    assert shown["steps"][-1]["signal"] == "SIGTERM"  # the signal is named, not just "exited -15"
    assert "step-2 was killed by SIGTERM: `sleep 30`" in shown["failures"]
    assert "**Status:** timeout" in (repo / "plans" / "plan.md").read_text()


def test_inconclusive_when_metric_missing_then_rerun(tmp_path):
    repo = make_repo(tmp_path, PLAN.replace("Pass: `loss < 2`", "Pass: `loss < 2 and nobody_wrote > 1`"))
    done = runbook(repo, "next", "--yes")
    assert done.returncode == 3, done.stdout + done.stderr
    rec = runs(repo)[-1]
    assert rec["verdict"] == "inconclusive" and "nobody_wrote" in rec["reason"]
    again = runbook(repo, "next", "--dry-run")
    assert again.returncode == 0 and "was inconclusive: running it again from the top" in again.stdout
    status = json.loads(runbook(repo, "status", "--json").stdout)["result"]
    assert status["next"]["kind"] == "rerun" and status["phases"][0]["state"] == "inconclusive"


def test_no_terminal_without_yes_refuses(tmp_path):
    repo = make_repo(tmp_path)
    done = runbook_subprocess(repo, "next")
    assert done.returncode == 2 and "--yes" in done.stderr
    assert not (repo / "state" / "runs").exists()
    dry = runbook_subprocess(repo, "next", "--dry-run")
    assert dry.returncode == 0 and "printf '%s\\n' 'it'\"'\"'s a;" in dry.stdout
    assert git(repo, "status", "--porcelain") == ""


def test_hand_edited_results_table_is_not_erased(tmp_path):
    repo = make_repo(tmp_path)
    assert runbook(repo, "next", "--yes").returncode == 0
    path = repo / "plans" / "plan.md"
    edited = path.read_text().replace("| 1.5 |", "| 1.5 (rerun on A100) |")
    path.write_text(edited)
    done = runbook(repo, "next", "--yes", "--phase", "0")
    assert done.returncode == 2 and "edited by hand" in done.stderr and "plans/plan.md:" in done.stderr
    assert path.read_text() == edited and len(runs(repo)) == 1


def test_needs_and_unknown_phase(tmp_path):
    repo = make_repo(tmp_path, PLAN.replace("## Phase 2: Fallback\n", "## Phase 2: Fallback\n\nNeeds: Phase 1\n"))
    blocked = runbook(repo, "next", "--yes", "--phase", "2")
    assert blocked.returncode == 2 and "needs Phase 1 to have passed" in blocked.stderr
    unknown = runbook(repo, "next", "--yes", "--phase", "9")
    assert unknown.returncode == 2 and "no phase '9'" in unknown.stderr


def test_not_a_git_repo_and_no_commit(tmp_path):
    plain = tmp_path / "plain"
    (plain / "plans").mkdir(parents=True)
    (plain / "plans" / "plan.md").write_text(PLAN)
    done = runbook(plain, "next", "--yes")
    assert done.returncode == 0 and "not a git repository" in done.stderr
    assert "**Status:** pass" in (plain / "plans" / "plan.md").read_text()

    repo = make_repo(tmp_path)
    head = git(repo, "rev-parse", "HEAD")
    assert runbook(repo, "next", "--yes", "--no-commit").returncode == 0
    assert git(repo, "rev-parse", "HEAD") == head
    assert "**Status:** pass" in (repo / "plans" / "plan.md").read_text()


def test_refuses_mid_merge(tmp_path):
    repo = make_repo(tmp_path)
    git(repo, "checkout", "-qb", "other")
    (repo / "f").write_text("other\n")
    git(repo, "add", "f")
    git(repo, "commit", "-qm", "other")
    git(repo, "checkout", "-q", "main")
    (repo / "f").write_text("main\n")
    git(repo, "add", "f")
    git(repo, "commit", "-qm", "main")
    git(repo, "merge", "other", check=False)
    done = runbook(repo, "next", "--yes")
    assert done.returncode == 2 and "merge is in progress" in done.stderr
    assert not (repo / "state" / "runs").exists()


def test_invalid_plan_refused(tmp_path):
    repo = make_repo(tmp_path, PLAN.replace("Pass: `loss < 2`", "Pass: `loss <`"))
    done = runbook(repo, "next", "--yes")
    assert done.returncode == 2 and "plans/plan.md:" in done.stderr and "nothing ran" in done.stderr


@pytest.mark.parametrize("newline", ["\r\n"])
def test_crlf_plan_keeps_its_newlines(tmp_path, newline):
    repo = make_repo(tmp_path)
    path = repo / "plans" / "plan.md"
    path.write_bytes(PLAN.replace("\n", newline).encode())
    git(repo, "commit", "-qam", "crlf")
    assert runbook(repo, "next", "--yes").returncode == 0
    data = path.read_bytes()
    assert b"\n" not in data.replace(b"\r\n", b"")
    assert b"<!-- runbook:status sha=" in data
