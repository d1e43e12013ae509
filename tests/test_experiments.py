"""Experiments as records: `runbook next --set`, the vars a run used, `Columns:`, criteria that read
another phase's metrics. Real git repositories, the real console script, real steps."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("reliability_helpers", Path(__file__).with_name("reliability_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

PLAN = """\
---
runbook: 1
title: Baseline, then an MLP that must beat it
vars:
  epochs: "1"
  lr: "0.1"
  out: work/out
---

## Phase 0: Baseline (~1 min)

Steps:
- [ ] Fit: `mkdir -p {out} && python3 -c "import sys; print('{\\"baseline_acc\\": 0.8, \\"val_loss\\": %g}' % (10 / int(sys.argv[1])))" {epochs} > "$RUNBOOK_METRICS"`

Pass: baseline_acc > 0.5
Columns: val_loss, lr

## Phase 1: MLP (~1 min)

Steps:
- [ ] Fit: `python3 -c "import sys; print('{\\"mlp_acc\\": %s}' % (0.8 + float(sys.argv[1])))" {lr} > "$RUNBOOK_METRICS"`

Pass: `mlp_acc - phase-0.baseline_acc >= 0.1`
"""


def runs(repo: Path) -> list[dict]:
    files = (repo / "state" / "runs").glob("*.json")
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["started"])


def table(repo: Path, phase_heading: str) -> list[list[str]]:
    """The rows of a phase's results table (header first), cells stripped."""
    text = (repo / "plans" / "plan.md").read_text()
    section = text.split(phase_heading, 1)[1].split("\n## ", 1)[0]
    block = section.split("<!-- runbook:results", 1)[1].split("<!-- /runbook:results -->", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_set_overrides_a_var_for_one_run_records_every_var_and_adds_a_column(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    first = H.runbook(repo, "next", "--phase", "0", "--yes")
    assert first.returncode == 0, first.stderr
    # the override shows in the preview and runs
    second = H.runbook(repo, "next", "--phase", "0", "--restart", "--set", "epochs=5", "--yes")
    assert second.returncode == 0, second.stderr
    a, b = runs(repo)
    # every var the phase used, overridden or not; which ones were overridden
    assert a["vars"] == {"out": "work/out", "epochs": "1"} and a["overrides"] == []
    assert b["vars"] == {"out": "work/out", "epochs": "5"} and b["overrides"] == ["epochs"]
    assert a["metrics"]["val_loss"] == 10 and b["metrics"]["val_loss"] == 2
    assert "epochs=5" not in (repo / "plans" / "plan.md").read_text()  # the plan's vars are unchanged
    rows = table(repo, "## Phase 0: Baseline")
    # a column for the var that differs (epochs, not out), then Pass: metrics, then Columns:
    assert rows[0] == ["run", "finished", "commit", "epochs", "baseline_acc", "val_loss", "lr", "took", "verdict"]
    assert [r[3] for r in rows[1:]] == ["1", "5"]
    assert [r[5] for r in rows[1:]] == ["10", "2"]
    assert [r[6] for r in rows[1:]] == ["-", "-"]  # Phase 0 does not use {lr}
    # the verdict reached with --set is the phase's: not stale, the plan goes on to Phase 1
    status = json.loads(H.runbook(repo, "status", "--json").stdout)["result"]
    assert status["phases"][0]["state"] == "passed" and status["next"]["phase"] == "phase-1"
    # --json carries the vars too
    hist = json.loads(H.runbook(repo, "history", "--json").stdout)["result"]["runs"]
    assert hist[-1]["vars"] == {"out": "work/out", "epochs": "5"} and hist[-1]["overrides"] == ["epochs"]


def test_set_refuses_unknown_names_and_unsafe_values_before_running(tmp_path: Path) -> None:
    plan = PLAN.replace("Pass: baseline_acc > 0.5", "Pass: baseline_acc > 0.5\n").replace(
        "- [ ] Fit: `mkdir", "- [ ] Note: `echo hello  # epochs {epochs}`\n- [ ] Fit: `mkdir")
    repo = H.make_repo(tmp_path / "repo", plan)
    typo = H.runbook(repo, "next", "--set", "epoch=3", "--yes")
    assert typo.returncode == 2 and "did you mean epochs?" in typo.stderr, typo.stderr
    bad = H.runbook(repo, "next", "--set", "noequals", "--yes")
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr
    unsafe = H.runbook(repo, "next", "--set", "epochs=1\nrm -rf /", "--yes")  # a line break in a comment
    assert unsafe.returncode == 2 and "step-1" in unsafe.stderr and "line break" in unsafe.stderr, unsafe.stderr
    assert runs(repo) == []  # nothing ran
    H.assert_no_traceback(unsafe)
    as_json = json.loads(H.runbook(repo, "next", "--set", "epoch=3", "--yes", "--json").stdout)
    assert as_json["ok"] is False and as_json["error"]["code"] == "usage"


def test_a_resumed_run_keeps_its_overrides_and_other_values_rerun_from_the_top(tmp_path: Path) -> None:
    plan = """\
---
runbook: 1
vars:
  lr: "0.1"
---

## Phase 0: Two steps

Steps:
- [ ] One: `echo {lr} >> one.txt`
- [ ] Two: `test -f go && echo "{\\"lr\\": $(cat one.txt | tail -1)}" > "$RUNBOOK_METRICS"`

Pass: lr > 0
"""
    repo = H.make_repo(tmp_path / "repo", plan)
    assert H.runbook(repo, "next", "--set", "lr=0.5", "--yes").returncode == 4  # step 2 fails: no `go`
    (repo / "go").write_text("")
    resumed = H.runbook(repo, "next", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming with the values run" in resumed.stdout and "--set lr=0.5" in resumed.stdout
    last = runs(repo)[-1]
    assert last["overrides"] == ["lr"] and last["vars"] == {"lr": "0.5"} and last["metrics"]["lr"] == 0.5
    assert (repo / "one.txt").read_text() == "0.5\n"  # step 1 did not run again
    # an error again, then a resume with another value: from step 1
    (repo / "go").unlink()
    assert H.runbook(repo, "next", "--phase", "0", "--restart", "--set", "lr=0.5", "--yes").returncode == 4
    (repo / "go").write_text("")
    other = H.runbook(repo, "next", "--set", "lr=0.7", "--yes")
    assert other.returncode == 0 and "runs from its first step" in other.stdout, other.stdout
    assert (repo / "one.txt").read_text().splitlines()[-1] == "0.7" and runs(repo)[-1]["metrics"]["lr"] == 0.7


def test_cross_phase_criteria_pass_fail_and_inconclusive(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    # Phase 1 before Phase 0 ever ran: the reference has no value
    early = H.runbook(repo, "next", "--phase", "1", "--yes")
    assert early.returncode == 3, early.stdout + early.stderr
    record = runs(repo)[-1]
    assert record["verdict"] == "inconclusive" and "Phase 0 has no judged run yet" in record["reason"]
    assert H.runbook(repo, "next", "--phase", "0", "--yes").returncode == 0
    # 0.9 - 0.8 >= 0.1: passes (no float noise)
    ok = H.runbook(repo, "next", "--phase", "1", "--restart", "--yes")
    assert ok.returncode == 0, ok.stdout
    passed = runs(repo)[-1]
    assert passed["verdict"] == "pass"
    assert passed["reason"] == "(mlp_acc 0.9 - phase-0.baseline_acc 0.8 = 0.1) >= 0.1"
    assert passed["ref_metrics"] == {"phase-0.baseline_acc": 0.8}
    assert passed["ref_runs"] == {"phase-0": runs(repo)[-2]["run_id"]}
    # a smaller lr: the MLP does not beat the baseline by 0.1
    bad = H.runbook(repo, "next", "--phase", "1", "--restart", "--set", "lr=0.05", "--yes", "--json")
    assert bad.returncode == 1
    view = json.loads(bad.stdout)["result"]["runs"][0]
    assert view["verdict"] == "fail"
    assert view["failures"] == ["✗ (mlp_acc 0.85 - phase-0.baseline_acc 0.8 = 0.05) >= 0.1"]
    (c,) = view["comparisons"]
    assert c["metric"] == "mlp_acc - phase-0.baseline_acc"
    assert c["operands"] == {"mlp_acc": pytest.approx(0.85), "phase-0.baseline_acc": 0.8}
    # the table shows the var that differs and the phase's own metric, not the other phase's
    rows = table(repo, "## Phase 1: MLP")
    assert rows[0] == ["run", "finished", "commit", "lr", "mlp_acc", "took", "verdict"]
    assert [r[3] for r in rows[1:]] == ["0.1", "0.1", "0.05"]


def test_references_to_missing_phases_and_to_itself_are_validation_errors_with_columns(tmp_path: Path) -> None:
    line = "Pass: `mlp_acc - phase-9.baseline_acc >= 0.1 or phase-1.mlp_acc > 2 or Phase-0.baseline_acc > 0`"
    plan = PLAN.replace("Pass: `mlp_acc - phase-0.baseline_acc >= 0.1`", line)
    repo = H.make_repo(tmp_path / "repo", plan)
    out = H.runbook(repo, "validate", "--json")
    assert out.returncode == 2
    problems = json.loads(out.stdout)["result"]["plans"][0]["problems"]
    lineno = plan.splitlines().index(line) + 1
    got = [(p["line"], p["col"], p["message"]) for p in problems]
    assert got == [
        (lineno, line.index("phase-9") + 1,
         "Pass: `phase-9.baseline_acc`: this plan has no phase `phase-9` (phases: phase-0, phase-1); a metric of "
         "another phase is written `phase-0.baseline_acc`"),
        (lineno, line.index("phase-1.") + 1, "Pass: `phase-1.mlp_acc` names a metric of this phase itself; write `mlp_acc`"),
    ]  # `Phase-0.baseline_acc`: ids match case-insensitively, as everywhere
    assert H.runbook(repo, "next", "--yes").returncode == 2 and runs(repo) == []


def test_columns_line_is_validated_with_columns(tmp_path: Path) -> None:
    plan = PLAN.replace("Columns: val_loss, lr", "Columns: val_loss,, bad name")
    repo = H.make_repo(tmp_path / "repo", plan)
    out = H.runbook(repo, "validate")
    lineno = plan.splitlines().index("Columns: val_loss,, bad name") + 1
    assert out.returncode == 2
    assert f"plans/plan.md:{lineno}:19: `Columns:` has an empty name between commas" in out.stderr
    assert f"plans/plan.md:{lineno}:21: `Columns:` 'bad name' is not a metric or var name" in out.stderr
