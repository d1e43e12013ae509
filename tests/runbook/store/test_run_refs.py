"""One run reference for every verb (runbook/store/index.py `pick_rows`, `Workspace.find_run`):
an id, a unique prefix, `last`, `last~N` name the same run in logs, diff, forget, record and plot;
and `runbook logs` where the logs are not (a fresh clone) shows what the run record keeps."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import helpers as H
import pytest
from click.testing import CliRunner
from helpers import make_repo

from runbook.cli import cli

PLAN = """---
runbook: 1
title: Refs
---

# Refs

## Phase 0: Say who runs (~1 min)

Steps:
- [ ] Say: `echo "this is run $RUNBOOK_RUN_ID"`
"""


def _js(*args: str) -> dict:
    out = CliRunner().invoke(cli, [*args, "--json"])
    return json.loads(out.stdout)


def test_logs_run_last_1_shows_the_run_before_the_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo", PLAN)
    monkeypatch.chdir(repo)
    monkeypatch.setenv("RUNBOOK_ENV_PROBE", "0")
    first = _js("next", "--yes")["result"]["runs"][0]["run_id"]
    second = _js("next", "--phase", "0", "--restart", "--yes")["result"]["runs"][0]["run_id"]
    assert first != second

    before = _js("logs", "--run", "last~1")
    assert before["ok"] and before["result"]["run_id"] == first
    assert f"this is run {first}" in before["result"]["lines"]
    assert _js("logs", "--run", "last")["result"]["run_id"] == second
    assert _js("logs", "--run", "last~0")["result"]["run_id"] == second
    prefix = next(first[:n] for n in range(1, len(first) + 1) if not second.startswith(first[:n]))
    assert _js("logs", "--run", prefix)["result"]["run_id"] == first  # a unique prefix
    text = CliRunner().invoke(cli, ["logs", "--run", "last~1"])
    assert text.exit_code == 0 and f"this is run {first}" in text.stdout

    # the same words, refused the same way, as diff's
    for verb in (["logs", "--run", "last~2"], ["diff", "last~2", "last"]):
        refused = _js(*verb)
        assert refused["exit_code"] == 2 and refused["error"]["code"] == "unknown_run", verb
        assert "has only 2 run(s)" in refused["error"]["message"], verb
    assert _js("diff", "last~1", "last")["ok"]


def test_logs_in_a_fresh_clone_print_the_tail_the_run_record_keeps_and_say_so(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", PLAN)
    first = json.loads(H.runbook_inproc(repo, "next", "--yes", "--json").stdout)["result"]["runs"][0]["run_id"]
    second = json.loads(H.runbook_inproc(repo, "next", "--phase", "0", "--restart", "--yes", "--json").stdout)[
        "result"]["runs"][0]["run_id"]
    here = json.loads(H.runbook_inproc(repo, "logs", "--json").stdout)["result"]
    assert here["from_record"] is False and here["lines"] == [f"this is run {second}"]

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    assert not (clone / "state" / "runs" / second).exists()  # logs are not committed
    shown = H.runbook_inproc(clone, "logs")
    assert shown.returncode == 0
    assert shown.stdout == f"this is run {second}\n"
    assert (f"state/runs/{second}/step-1.log is not on this machine" in shown.stderr
            and "the last 1 line its run record keeps" in shown.stderr), shown.stderr
    before = H.runbook_inproc(clone, "logs", "--run", "last~1")  # the one run reference of every verb
    assert before.returncode == 0 and before.stdout == f"this is run {first}\n"
    as_json = json.loads(H.runbook_inproc(clone, "logs", "--run", "last~1", "--json").stdout)["result"]
    assert as_json["run_id"] == first and as_json["from_record"] is True
    assert as_json["lines"] == [f"this is run {first}"] and as_json["running"] is False
    assert H.runbook_inproc(clone, "logs", "-n", "0").stdout == ""
    # the log file back (the run's own machine): read from it again
    assert json.loads(H.runbook_inproc(repo, "logs", "--run", "last~1", "--json").stdout)["result"]["from_record"] is False
