"""The example plan's Phase P (is a drafter for the successor already published?), as a real project runs it:
Phase S deleted (its history already exists), so the plan starts at Phase P. A candidate that reaches the bar
ends the plan there; one that does not leads to Phase 0, the old drafter's probe.

Nothing is published for the toy successor, so the session's toy drafter stands in for the candidate: measured on
the target it was trained for, it passes; on that target's successor (a quarter of the words changed their likely
successors) it is not the drafter of the target served, and it fails. Both on the first 8 held-out prompts.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import helpers as H
import pytest

from runbook.model import RunRecord

REPO = Path(__file__).resolve().parents[2]
PLAN = "plans/eagle3-game-plan.md"
HELDOUT = REPO / "plans" / "data" / "prompts-heldout.jsonl"
pytestmark = pytest.mark.slow


def real_model_workspace(root: Path, target: Path, candidate: Path) -> Path:
    """`runbook init --example eagle3`, edited as README.md says for a real model: Phase S deleted, the vars
    pointing at the target served and the published candidate (a user's edit, committed)."""
    done = H.runbook(root.parent, "init", root.name, "--example", "eagle3")
    assert done.returncode == 0, done.stderr
    plan = root / PLAN
    text = plan.read_text()
    text = text[:text.index("## Phase S:")] + text[text.index("## Phase P:"):]
    heldout = root / "heldout-8.jsonl"
    heldout.write_text("".join(HELDOUT.read_text().splitlines(keepends=True)[:8]))
    for name, value in (("target", target), ("published_draft", candidate), ("heldout", heldout)):
        text, n = re.subn(rf"^  {name}: .*$", f"  {name}: {value}", text, count=1, flags=re.M)
        assert n == 1, name
    plan.write_text(text)
    H.git(root, "add", "-A")
    H.git(root, "commit", "-qm", "a real model: Phase S deleted, the vars set")
    return root


def status(ws: Path) -> dict:
    done = H.runbook(ws, "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["result"]


def test_phase_p_stops_on_a_published_drafter_that_passes_and_leads_to_phase_0_otherwise(
        toy_target: Path, toy_successor: Path, toy_drafter: Path, tmp_path: Path) -> None:
    good = real_model_workspace(tmp_path / "good", toy_target, toy_drafter)
    validated = H.runbook(good, "validate", PLAN)
    assert validated.returncode == 0 and "nothing leads to" not in validated.stdout + validated.stderr  # P is first
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    plan = bad / PLAN
    plan.write_text(plan.read_text().replace(f"  target: {toy_target}", f"  target: {toy_successor}", 1))
    H.git(bad, "commit", "-qam", "the successor served")

    outcomes = {}
    for ws in (good, bad):
        done = H.runbook(ws, "next", "--yes", timeout=900)
        assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
        runs = [RunRecord.model_validate_json(f.read_text()) for f in (ws / "state" / "runs").glob("*.json")]
        assert [r.phase for r in runs] == ["published"]  # the plan started at Phase P
        outcomes[ws.name] = (done.returncode, runs[0], status(ws))
    print("\n[phase P] " + "; ".join(f"{name}: {run.verdict}, accept_len {run.metrics['accept_len']:.3f}"
                                     for name, (_, run, _) in outcomes.items()))

    code, run, state = outcomes["good"]
    assert code == 0 and run.verdict == "pass"
    assert run.metrics["accept_len"] >= 1.75 and run.metrics["greedy_match"] == 1
    assert state["next"]["kind"] == "nothing"  # On pass: stop: the published drafter is the drafter

    code, run, state = outcomes["bad"]
    assert code == 1 and run.verdict == "fail" and run.metrics["accept_len"] < 1.75
    assert run.metrics["greedy_match"] == 1  # decoding stays exact whatever the drafter proposes
    assert state["next"]["phase"] == "phase-0" and state["next"]["kind"] == "run"  # On fail: Phase 0
