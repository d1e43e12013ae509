"""Experiments as records: `runbook next --set`, the vars a run used, `Columns:`, criteria that read
another phase's metrics. Real git repositories, the real console script, real steps."""

from __future__ import annotations

import json
from pathlib import Path

import helpers as H
import pytest

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
    first = H.runbook_inproc(repo, "next", "--phase", "0", "--yes")
    assert first.returncode == 0, first.stderr
    # the override shows in the preview and runs
    second = H.runbook_inproc(repo, "next", "--phase", "0", "--restart", "--set", "epochs=5", "--yes")
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
    status = json.loads(H.runbook_inproc(repo, "status", "--json").stdout)["result"]
    assert status["phases"][0]["state"] == "passed" and status["next"]["phase"] == "phase-1"
    # --json carries the vars too
    hist = json.loads(H.runbook_inproc(repo, "history", "--json").stdout)["result"]["runs"]
    assert hist[-1]["vars"] == {"out": "work/out", "epochs": "5"} and hist[-1]["overrides"] == ["epochs"]


def test_set_refuses_unknown_names_and_unsafe_values_before_running(tmp_path: Path) -> None:
    plan = PLAN.replace("Pass: baseline_acc > 0.5", "Pass: baseline_acc > 0.5\n").replace(
        "- [ ] Fit: `mkdir", "- [ ] Note: `echo hello  # epochs {epochs}`\n- [ ] Fit: `mkdir")
    repo = H.make_repo(tmp_path / "repo", plan)
    typo = H.runbook_inproc(repo, "next", "--set", "epoch=3", "--yes")
    assert typo.returncode == 2 and "did you mean epochs?" in typo.stderr, typo.stderr
    bad = H.runbook_inproc(repo, "next", "--set", "noequals", "--yes")
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr
    unsafe = H.runbook(repo, "next", "--set", "epochs=1\nrm -rf /", "--yes")  # a line break in a comment
    assert unsafe.returncode == 2 and "step-1" in unsafe.stderr and "line break" in unsafe.stderr, unsafe.stderr
    assert runs(repo) == []  # nothing ran
    H.assert_no_traceback(unsafe)
    as_json = json.loads(H.runbook_inproc(repo, "next", "--set", "epoch=3", "--yes", "--json").stdout)
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
    assert H.runbook_inproc(repo, "next", "--set", "lr=0.5", "--yes").returncode == 4  # step 2 fails: no `go`
    (repo / "go").write_text("")
    resumed = H.runbook_inproc(repo, "next", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming with the values run" in resumed.stdout and "--set lr=0.5" in resumed.stdout
    last = runs(repo)[-1]
    assert last["overrides"] == ["lr"] and last["vars"] == {"lr": "0.5"} and last["metrics"]["lr"] == 0.5
    assert (repo / "one.txt").read_text() == "0.5\n"  # step 1 did not run again
    # an error again, then a resume with another value: from step 1
    (repo / "go").unlink()
    assert H.runbook_inproc(repo, "next", "--phase", "0", "--restart", "--set", "lr=0.5", "--yes").returncode == 4
    (repo / "go").write_text("")
    other = H.runbook_inproc(repo, "next", "--set", "lr=0.7", "--yes")
    assert other.returncode == 0 and "runs from its first step" in other.stdout, other.stdout
    assert (repo / "one.txt").read_text().splitlines()[-1] == "0.7" and runs(repo)[-1]["metrics"]["lr"] == 0.7


def test_cross_phase_criteria_pass_fail_and_inconclusive(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    # Phase 1 before Phase 0 ever ran: the reference has no value
    early = H.runbook_inproc(repo, "next", "--phase", "1", "--yes")
    assert early.returncode == 3, early.stdout + early.stderr
    record = runs(repo)[-1]
    assert record["verdict"] == "inconclusive" and "Phase 0 has no judged run yet" in record["reason"]
    assert H.runbook_inproc(repo, "next", "--phase", "0", "--yes").returncode == 0
    # 0.9 - 0.8 >= 0.1: passes (no float noise)
    ok = H.runbook_inproc(repo, "next", "--phase", "1", "--restart", "--yes")
    assert ok.returncode == 0, ok.stdout
    passed = runs(repo)[-1]
    assert passed["verdict"] == "pass"
    assert passed["reason"] == "(mlp_acc 0.9 - phase-0.baseline_acc 0.8 = 0.1) >= 0.1"
    assert passed["ref_metrics"] == {"phase-0.baseline_acc": 0.8}
    assert passed["ref_runs"] == {"phase-0": runs(repo)[-2]["run_id"]}
    # a smaller lr: the MLP does not beat the baseline by 0.1
    bad = H.runbook_inproc(repo, "next", "--phase", "1", "--restart", "--set", "lr=0.05", "--yes", "--json")
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
    out = H.runbook_inproc(repo, "validate", "--json")
    assert out.returncode == 2
    problems = json.loads(out.stdout)["result"]["plans"][0]["problems"]
    lineno = plan.splitlines().index(line) + 1
    got = [(p["line"], p["col"], p["message"]) for p in problems]
    assert got == [
        (lineno, line.index("phase-9") + 1,
         "Pass: `phase-9.baseline_acc`: this plan has no phase `phase-9` (phases: phase-0, phase-1)"),
        (lineno, line.index("phase-1.") + 1, "Pass: `phase-1.mlp_acc` names a metric of this phase itself; write `mlp_acc`"),
    ]  # `Phase-0.baseline_acc`: ids match case-insensitively, as everywhere
    assert H.runbook_inproc(repo, "next", "--yes").returncode == 2 and runs(repo) == []


def test_columns_line_is_validated_with_columns(tmp_path: Path) -> None:
    plan = PLAN.replace("Columns: val_loss, lr", "Columns: val_loss,, bad name")
    repo = H.make_repo(tmp_path / "repo", plan)
    out = H.runbook_inproc(repo, "validate")
    lineno = plan.splitlines().index("Columns: val_loss,, bad name") + 1
    assert out.returncode == 2
    assert f"plans/plan.md:{lineno}:19: `Columns:` has an empty name between commas" in out.stderr
    assert f"plans/plan.md:{lineno}:21: `Columns:` 'bad name' is not a metric or var name" in out.stderr


# ---- comparing runs: history columns, diff --------------------------------------------------------


def _two_mlp_runs(tmp_path: Path) -> Path:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    assert H.runbook_inproc(repo, "next", "--phase", "0", "--yes").returncode == 0
    assert H.runbook_inproc(repo, "next", "--phase", "1", "--yes").returncode == 0  # lr 0.1: mlp_acc 0.9, pass
    assert H.runbook_inproc(repo, "next", "--phase", "1", "--restart", "--set", "lr=0.05", "--yes").returncode == 1
    return repo


def test_history_shows_each_metric_as_a_column_sorts_and_warns_about_unknown_names(tmp_path: Path) -> None:
    repo = _two_mlp_runs(tmp_path)
    out = H.runbook_inproc(repo, "history", "1", "--metric", "mlp_acc", "--metric", "lr", "--metric", "mlp_ac",
                    "--sort", "mlp_acc")
    assert out.returncode == 0, out.stderr
    assert "warning: no run shown has 'mlp_ac'; did you mean mlp_acc?" in out.stderr
    lines = out.stdout.splitlines()
    header = lines[0].split()
    # lr is a --metric column here, so no var column repeats it
    assert header == ["run", "phase", "verdict", "finished", "took", "mlp_acc", "lr", "mlp_ac", "reason"]
    rows = [line.split() for line in lines[1:3]]
    # sorted by mlp_acc, lowest first: the lr 0.05 run, then lr 0.1; each metric its own column
    assert [r[2] for r in rows] == ["fail", "pass"]
    assert [r[header.index("mlp_acc") + 1] for r in rows] == ["0.85", "0.9"]  # +1: "finished" is two words
    assert [r[header.index("lr") + 1] for r in rows] == ["0.05", "0.1"]
    assert [r[header.index("mlp_ac") + 1] for r in rows] == ["-", "-"]
    spark = [line for line in lines if line.strip().startswith("mlp_acc ")]
    assert spark and "0.9 … 0.85" in spark[0] and "2 runs" in spark[0]  # oldest first, whatever the sort
    desc = json.loads(H.runbook_inproc(repo, "history", "1", "--metric", "mlp_acc", "--sort", "-mlp_acc", "--json").stdout)
    result = desc["result"]
    assert [r["metrics"]["mlp_acc"] for r in result["runs"]] == [0.9, pytest.approx(0.85)]
    assert result["columns"] == ["mlp_acc"] and result["sort"] == "mlp_acc" and result["descending"] is True
    assert result["warnings"] == []
    bad = json.loads(H.runbook_inproc(repo, "history", "--sort", "acc", "--json").stdout)["result"]
    assert bad["warnings"] and "did you mean" in bad["warnings"][0]


def test_diff_of_two_runs_lists_exactly_the_changed_var_and_the_metric_deltas(tmp_path: Path) -> None:
    repo = _two_mlp_runs(tmp_path)
    out = H.runbook_inproc(repo, "diff", "last~1", "last", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)["result"]
    assert d["same_phase"] is True and d["a"]["verdict"] == "pass" and d["b"]["verdict"] == "fail"
    assert [(v["name"], v["a"], v["b"]) for v in d["vars"] if v["changed"]] == [("lr", "0.1", "0.05")]
    (metric,) = d["metrics"]
    assert metric["name"] == "mlp_acc" and metric["changed"] is True
    assert metric["a"] == 0.9 and metric["b"] == pytest.approx(0.85) and metric["delta"] == pytest.approx(-0.05)
    assert metric["rel"] == pytest.approx(-0.05 / 0.9, rel=1e-4)
    assert [c["step"] for c in d["commands"]] == ["step-1"]
    assert d["commands"][0]["diff"][-2:] == [f"-{d['commands'][0]['a']}", f"+{d['commands'][0]['b']}"]
    assert d["verdict"] == {"name": "verdict", "a": "pass", "b": "fail", "delta": None, "rel": None, "changed": True}
    assert [(c["a_held"], c["b_held"]) for c in d["comparisons"]] == [(True, False)]
    assert d["ref_metrics"][0]["name"] == "phase-0.baseline_acc" and not d["ref_metrics"][0]["changed"]
    assert d["env"] == []  # the same machine
    assert d["code"]["files"] == []  # only the plan and the ledger changed between the two commits
    text = H.runbook_inproc(repo, "diff").stdout  # no arguments: the last run against the one before it in its phase
    assert "vars:\n  lr  0.1 -> 0.05\n" in text
    assert "metrics:\n  mlp_acc  0.9 -> 0.85  (-0.05, -5.56%)\n" in text
    assert "verdict: pass -> fail" in text and "environment: the same" in text
    missing = H.runbook(repo, "diff", "nosuchrun", "last")
    assert missing.returncode == 2 and "'nosuchrun' is not a run" in missing.stderr
    H.assert_no_traceback(missing)


def test_diff_is_an_mcp_tool_over_the_same_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runbook.mcp_server import BY_NAME, call_verb

    repo = _two_mlp_runs(tmp_path)
    monkeypatch.chdir(repo)
    tool = BY_NAME["diff"]
    outcome = call_verb("diff", tool.args(run_a="last~1", run_b="last").cli_kwargs())
    assert outcome.envelope["ok"] and outcome.envelope["command"] == "diff"
    cli = json.loads(H.runbook_inproc(repo, "diff", "last~1", "last", "--json").stdout)
    assert outcome.envelope["result"] == cli["result"]


def test_set_through_the_mcp_next_tool_shows_the_override_in_the_dry_run(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from runbook.mcp_server import BY_NAME, call_verb

    repo = H.make_repo(tmp_path / "repo", PLAN)
    monkeypatch.chdir(repo)
    args = BY_NAME["next"].args(set={"epochs": "7"})
    assert args.argv()[-2:] == ["--set", "epochs=7"]  # what run=true passes to `runbook next`
    outcome = call_verb("next", args.cli_kwargs())
    assert outcome.envelope["ok"], outcome.envelope
    (step,) = outcome.envelope["result"]["selected"]["steps"]
    assert step["command"].endswith(" 7 > \"$RUNBOOK_METRICS\"")
    typo = call_verb("next", BY_NAME["next"].args(set={"epoch": "7"}).cli_kwargs())
    assert typo.envelope["error"]["code"] == "usage" and "did you mean epochs?" in typo.envelope["error"]["message"]
