"""docs/next.md's table of plan states: in each, `status`, `next --dry-run` and `brief` say the same
thing, and the brief's exact next command is what `runbook next` then does (the hand-over trial).

Every state is built with real `runbook next` runs (tests/support/plan_states.py); every command is the real
console script in a subprocess.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import helpers as H
import plan_states as S
import pytest
from click.testing import CliRunner

from runbook.cli import cli

STATES = [name for name in S.STATES if name != "running"]


@pytest.fixture
def built(plan_states: dict[str, Path]) -> dict[str, Path]:
    return plan_states  # tests/conftest.py builds them once per session


def _invoke(args: list[str]) -> str:
    """The real CLI, in this process (the read-only verbs; `runbook next` runs as a subprocess below)."""
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def views(repo: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """What the three readers say, as JSON and as text."""
    monkeypatch.chdir(repo)
    out = {}
    for key, args in (("status", ["status"]), ("dry", ["next", "--dry-run"]), ("brief", ["brief"])):
        envelope = json.loads(_invoke([*args, "--json"]))
        assert envelope["ok"] and envelope["exit_code"] == 0 and envelope["command"] == args[0]
        out[key] = envelope["result"]
        out[f"{key}_text"] = _invoke(args)
    return out


def continue_block(brief_text: str) -> str:
    return brief_text.split("## Continue", 1)[1].strip()


def assert_agree(v: dict, phase: str | None, kind: str, outcome: str | None) -> dict:
    action = v["status"]["next"]
    # one next action, the same object in all three
    assert v["dry"]["next"] == action and v["brief"]["next"] == action
    assert (action["phase"], action["kind"], action["outcome"]) == (phase, kind, outcome), action
    assert v["brief"]["status"] == v["status"]["summary"]
    # the texts say it too
    if action["command"]:
        assert f"next ({kind}): {action['command']}" in v["status_text"]
        assert continue_block(v["brief_text"]) == f"```sh\n{action['command']}\n```"
        if action["argv"] == [H.RUNBOOK_EXE, "next", "--yes"]:
            assert v["dry"]["selected"]["phase"] == action["phase"]
            assert v["dry"]["selected"]["start_step"] == action["start_step"]
            assert v["dry_text"].splitlines()[0].endswith(v["dry"]["selected"]["why"])
        else:  # a retry names the phase: plain `next` runs nothing on its own and says how
            assert v["dry"]["selected"] is None and f"to retry it: {action['command']}" in v["dry_text"]
    else:
        assert f"next ({kind}): " in v["status_text"]
        assert v["dry"]["selected"] is None
        assert "```sh" not in continue_block(v["brief_text"])
    return action


@pytest.mark.parametrize("name", STATES)
def test_status_dry_run_and_brief_agree(name: str, built: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _what, phase, kind, outcome = S.STATES[name]
    v = views(built[name], monkeypatch)
    action = assert_agree(v, phase, kind, outcome)
    states = {row["id"]: row["state"] for row in v["status"]["phases"]}
    summary = v["status"]["summary"]
    # never "every phase has passed" when one failed
    assert "every phase has passed" not in v["status_text"]
    if name == "fresh":
        assert summary.startswith("not started") and set(states.values()) == {"not_run"}
    elif name == "mid-plan":
        assert states["phase-0"] == "passed" and "Phase 1 (phase-1), run" in summary
    elif name == "failed-and-stopped":
        assert states["phase-1"] == states["phase-2"] == "failed" and summary.startswith("stopped: Phase 2 failed")
        assert "a retry would repeat the fail" in action["why"] and "✗ fb 0 >= 1" in action["why"]
        assert v["dry_text"].startswith("nothing to run: Phase 2 failed (run ")
        assert "Nothing to run: the plan stopped after Phase 2 failed" in v["brief_text"]
    elif name == "failed-with-fallback":
        assert states["phase-1"] == "failed" and "On fail: Phase 2" in action["why"]
    elif name == "rewritten-phase":
        assert states["phase-0"] == "stale" and "its commands changed since run" in action["why"]
        assert summary.endswith("next: Phase 0 (phase-0), run (its verdict is stale)")
        assert "CHANGED since run" in v["dry_text"]
        row = next(r for r in v["brief"]["phases"] if r["id"] == "phase-0")
        assert row["note"].startswith("its commands changed since run")
    elif name == "detour-timed-out":
        assert states["phase-3"] == "resumable" and "ended timeout" in action["why"]
        assert v["status"]["last_run"]["verdict"] == "timeout"
    elif name == "detour-after-error":
        # issue 47: the detour (Phase 2, run with --phase) timed out after Phase 1's error; the plan's position
        # is still Phase 1, which never produced a verdict, in every reader
        assert states["phase-1"] == states["phase-2"] == "resumable"
        assert v["status"]["last_run"]["phase"] == "phase-2" and v["status"]["last_run"]["verdict"] == "timeout"
        assert summary.endswith("next: Phase 1 (phase-1), resume") and "resume Phase 2" not in summary
        assert v["dry"]["selected"]["phase"] == "phase-1" and v["dry"]["selected"]["mode"] == "resume"
        assert action["run_id"] == v["status"]["phases"][1]["run_id"] and action["start_step"] == "step-1"
        detour = v["status"]["phases"][2]["run_id"]
        assert f"the plan's latest run ({detour}, Phase 2) ended timeout off the plan's flow, so it waits" in action["why"]
        assert v["dry_text"].splitlines()[0].endswith("off the plan's flow, so it waits")
        assert f"runbook forget {detour}" in action["why"] and "runbook next --phase phase-2 --yes" in action["why"]
        assert "## Next: Phase 1 (`phase-1`): Train (~2 min) — resume" in v["brief_text"]
        assert [r["id"] for r in v["status"]["phases"] if r["next"]] == ["phase-1"]
    elif name == "repeated-error":
        assert states["phase-1"] == "resumable" and action["attempts"] == 2
        assert summary == "held back: Phase 1 ended the same failure 2 times in a row and nothing changed since"
        assert "Another identical run would end the same, so it is not offered" in action["why"]
        assert "runbook next --phase phase-1 --yes" in action["why"]  # forcing it stays possible
        assert action["look_at"][0].startswith("log state/runs/") and "RuntimeError: boom" in action["look_at"]
        assert v["dry_text"].startswith("nothing to run: Phase 1 ended error the same way in its last 2 runs")
        assert "Nothing to run as it is: Phase 1 ended the same failure 2 times" in v["brief_text"]
        assert "- RuntimeError: boom" in v["brief_text"]
    elif name == "finished":
        assert states == {"phase-0": "passed", "phase-1": "passed", "phase-2": "not_run", "phase-3": "not_run"}
        assert summary == "finished: nothing left to run"
        assert "Nothing left to run in this plan." in v["brief_text"]
    elif name == "finished-with-failures":
        assert states["phase-1"] == "failed" and states["phase-2"] == "passed"
        assert summary == "finished: nothing left to run; failed along the way: Phase 1"
        assert "Along the way Phase 1 failed (run " in action["why"] and v["status"]["failed"] == ["phase-1"]


@pytest.mark.parametrize("name", STATES)
def test_the_briefs_next_command_is_what_runbook_next_does(name: str, built: dict[str, Path], tmp_path: Path) -> None:
    repo = S.copy(built[name], tmp_path / "repo")
    brief, _ = S.rb_json(repo, "brief")
    action = brief["result"]["next"]
    text = continue_block(S.run(repo, "brief").stdout)
    runs_before = len(list((repo / "state" / "runs").glob("*.json")))
    if action["argv"]:
        # the command as printed, pasted into a shell, is the argv
        pasted = re.fullmatch(r"```sh\n(.*)\n```", text, re.S).group(1)
        assert shlex.split(pasted) == ["runbook", *action["argv"][1:]] and action["argv"][0] == H.RUNBOOK_EXE
        result, done = S.rb_json(repo, *action["argv"][1:], timeout=120)
        assert result["ok"] and done.returncode == result["exit_code"], done.stderr
        [ran] = result["result"]["runs"]
        if action["kind"] == "blocked":  # the way out: a run of the first phase it needs
            assert ran["phase"] == action["unmet_needs"][0]
        else:
            assert ran["phase"] == action["phase"]
            first = next(s for s in ran["steps"] if not s["skipped"])
            assert first["id"] == action["start_step"]
    else:
        # nothing to run: `runbook next` runs nothing and says the same
        result, done = S.rb_json(repo, "next", "--yes")
        assert done.returncode == 0 and result["ok"] and result["result"]["runs"] == []
        assert result["result"]["next"]["kind"] == action["kind"] == "nothing"
        assert result["result"]["next"]["outcome"] == action["outcome"]
        assert len(list((repo / "state" / "runs").glob("*.json"))) == runs_before


def test_running_state_everyone_sees_the_run_and_next_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = S.fresh_repo(tmp_path / "repo")
    proc = S.start_running(repo)
    try:
        v = views(repo, monkeypatch)
        action = assert_agree(v, "phase-0", "running", None)
        holder = v["status"]["running"]
        lock = json.loads((repo / "state" / "lock").read_text())
        assert holder["pid"] == proc.pid and holder["run_id"] == lock["run_id"] and holder["alive"] is True
        assert holder["step"] == "step-1" and holder["log_path"] == f"state/runs/{lock['run_id']}/step-1.log"
        assert v["status"]["phases"][0]["state"] == "running" and v["status"]["summary"].startswith("running: Phase 0")
        assert f"pid {proc.pid}" in action["why"] and "exit 5" in action["why"]
        # these move between the calls: the time since the start and since the last heartbeat, the log's tail
        moving = {"elapsed_s", "heartbeat", "heartbeat_age_s", "silent", "log_tail"}
        same = {key: val for key, val in holder.items() if key not in moving}
        assert {key: val for key, val in v["brief"]["running"].items() if key not in moving} == same
        assert holder["heartbeat"] and holder["heartbeat_age_s"] is not None  # the run's live state is read
        assert holder["elapsed_s"] >= 0 and "## Running now" in v["brief_text"] and " ago)" in v["brief_text"]
        assert "Nothing to run until the run in progress ends" in continue_block(v["brief_text"])
        assert v["dry_text"].startswith("not now: Phase 0 is running")
        history, _ = S.rb_json(repo, "history")
        assert history["result"]["running"]["run_id"] == lock["run_id"]
        assert "now: Phase 0 is running" in S.run(repo, "history").stdout
        # what `runbook next` does now: it waits for nobody, it refuses with the lock's holder
        result, done = S.rb_json(repo, "next", "--yes")
        assert done.returncode == 5 and result["ok"] is False and result["error"]["code"] == "locked"
        assert result["error"]["lock"]["pid"] == proc.pid and result["error"]["lock"]["step"] == "step-1"
    finally:
        S.finish_running(repo, proc)
    after, _ = S.rb_json(repo, "status")
    assert after["result"]["running"] is None and after["result"]["phases"][0]["state"] == "passed"
