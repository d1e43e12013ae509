"""`runbook validate`, `runbook status`, `runbook show`: the malformed corpus and the read-only verbs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import helpers as H
import pytest
from click.testing import CliRunner
from helpers import run_record

from runbook.cli import cli

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "malformed"
CASES = sorted(p.stem for p in CORPUS.glob("*.md"))
RUNBOOK = Path(sys.executable).parent / "runbook"

GOOD_PLAN = """---
runbook: 1
title: Tiny
vars:
  out: work/out dir
---

# Tiny plan

## Phase 0: Probe (~1 min)
<!-- runbook:status -->
**Status:** pass · 2026-11-29 14:30 UTC · run 20261129-143012-7f3a · score 3 >= 2
<!-- /runbook:status -->

Steps:
- [x] Score: `echo '{"score": 3}' > "$RUNBOOK_METRICS"`

Pass: `score >= 2`

## Phase 1: Write (~2 min) {#write}

Steps:
- [ ] Make: `mkdir -p {out}`
- [ ] Script:
  ```sh
  touch {out}/a
  echo done
  ```

Pass: files >= 1
Needs: Phase 0
"""


def expected(case: str) -> list[tuple[str, str]]:
    """(`line:col`, message fragment) pairs from the case's .expected file."""
    pairs = []
    for raw in (CORPUS / f"{case}.expected").read_text().splitlines():
        if raw.strip():
            line, col, fragment = raw.split(":", 2)
            pairs.append((f"{line}:{col}", fragment.strip()))
    return pairs


def test_corpus_is_big_enough() -> None:
    assert len(CASES) >= 15
    for case in CASES:
        assert (CORPUS / f"{case}.expected").is_file(), f"{case}.md has no .expected file"


@pytest.mark.parametrize("case", CASES)
def test_malformed_plan_reports_each_problem_at_its_line(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    path = f"tests/malformed/{case}.md"
    result = CliRunner().invoke(cli, ["validate", path])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    error_lines = [
        line for line in result.stderr.splitlines() if line.startswith(f"{path}:") and ": warning: " not in line
    ]
    pairs = expected(case)
    for where, fragment in pairs:
        prefix = f"{path}:{where}: "
        assert any(line.startswith(prefix) and fragment in line for line in error_lines), (
            f"missing {prefix}...{fragment}\ngot:\n" + "\n".join(error_lines)
        )
    assert len(error_lines) == len(pairs), "\n".join(error_lines)


def test_whole_corpus_in_one_subprocess_all_problems_at_once() -> None:
    paths = [f"tests/malformed/{case}.md" for case in CASES]
    proc = subprocess.run([str(RUNBOOK), "validate", *paths], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    for case in CASES:
        for where, fragment in expected(case):
            assert f"tests/malformed/{case}.md:{where}: " in proc.stderr, (case, where, fragment)
    total = sum(len(expected(case)) for case in CASES)
    assert f"{total} errors found" in proc.stderr


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / ".git").mkdir()
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_validate_discovers_plans_and_skips_notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo(tmp_path, {"plans/tiny.md": GOOD_PLAN, "plans/notes.md": "# Notes\n\nNot a plan.\n"})
    monkeypatch.chdir(tmp_path / "plans")  # any directory inside the repo works
    result = CliRunner().invoke(cli, ["validate"])
    assert result.exit_code == 0, result.output
    assert "tiny.md: ok (2 phases)" in result.stdout
    assert "notes.md" not in result.output


def test_validate_named_non_plan_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo(tmp_path, {"plans/notes.md": "# Notes\n"})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["validate", "plans/notes.md"])
    assert result.exit_code == 2
    assert "plans/notes.md:1:1: not a plan" in result.stderr


def test_validate_nothing_found_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo(tmp_path, {})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["validate"])
    assert result.exit_code == 2
    assert "no plans found" in result.stderr


def test_validate_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = GOOD_PLAN.replace("Needs: Phase 0", "Needs: Phase 4")
    _repo(tmp_path, {"plans/a.md": GOOD_PLAN, "plans/b.md": broken})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["validate", "--json"])
    assert result.exit_code == 2
    envelope = json.loads(result.stdout)
    # the command did its job (ok, a result); the exit code and `valid` say the plans are not all valid
    assert envelope["ok"] is True and envelope["exit_code"] == 2 and envelope["command"] == "validate"
    data = envelope["result"]
    assert data["valid"] is False
    by_plan = {entry["plan"]: entry for entry in data["plans"]}
    assert by_plan["plans/a.md"]["valid"] is True and by_plan["plans/b.md"]["valid"] is False
    assert by_plan["plans/a.md"]["phases"] == ["phase-0", "write"]
    [problem] = by_plan["plans/b.md"]["problems"]
    assert problem["line"] == GOOD_PLAN.splitlines().index("Needs: Phase 0") + 1
    assert "Phase 4" in problem["message"]


def test_config_file_moves_plans_and_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo(
        tmp_path,
        {
            "runbook.toml": 'plans = ["runbooks/*.md"]\nstate = "ledger"\n',
            "runbooks/tiny.md": GOOD_PLAN,
            "plans/ignored.md": GOOD_PLAN.replace("runbook: 1", "runbook: 9"),
        },
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["validate"])
    assert result.exit_code == 0, result.output
    assert "runbooks/tiny.md: ok" in result.stdout


def _record_pass(root: Path, plan: str, phase: str) -> None:
    from runbook.store.ledger import save_run

    record = run_record(
        run_id="20261129-143012-7f3a", plan=plan, plan_blob="0" * 40, phase=phase, phase_label="0",
        phase_text_hash="0" * 64, started="2026-11-29T14:30:12Z", finished="2026-11-29T14:31:00Z", verdict="pass",
    )
    save_run(root / "state", record)


def test_status_table_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo(tmp_path, {"plans/tiny.md": GOOD_PLAN})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    row0 = next(line for line in lines if "phase-0" in line)
    row1 = next(line for line in lines if "write" in line.split())
    # The ledger, not the status block, is the truth (as `runbook next` decides): with no recorded
    # run, phase-0 is not run and is the one to run; the block's claim is pointed out.
    assert "Probe" in row0 and "~1 min" in row0 and "not run" in row0 and "1/1" in row0
    assert row0.startswith(">") and "not run" in row1 and "0/2" in row1
    assert "Phase 0: the plan's status block says pass (run 20261129-143012-7f3a), but the ledger has no run" in result.stdout
    assert "next (run): runbook next --yes" in result.stdout
    data = json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)["result"]
    assert data["next"]["phase"] == "phase-0" and data["next"]["kind"] == "run"
    assert data["next"]["argv"] == [H.RUNBOOK_EXE, "next", "--yes"]
    _record_pass(tmp_path, "plans/tiny.md", "phase-0")
    data = json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)["result"]
    assert data["next"]["phase"] == "write"
    result = CliRunner().invoke(cli, ["status"])
    row0 = next(line for line in result.stdout.splitlines() if "phase-0" in line)
    row1 = next(line for line in result.stdout.splitlines() if "write" in line.split())
    assert "passed" in row0 and "pass · 2026-11-29 14:31 UTC" in row0 and row1.startswith(">")
    assert [(p["id"], p["state"], p["verdict"]) for p in data["phases"]] == [
        ("phase-0", "passed", "pass"),
        ("write", "not_run", None),
    ]
    assert data["phases"][0]["run_id"] == "20261129-143012-7f3a"
    assert data["phases"][0]["finished"] == "2026-11-29T14:31:00Z"
    assert [p["next"] for p in data["phases"]] == [False, True]


def test_status_with_several_plans_needs_plan_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo(tmp_path, {"plans/a.md": GOOD_PLAN, "plans/b.md": GOOD_PLAN.replace("Tiny", "Other")})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 2
    assert "--plan plans/a.md" in result.stderr and "--plan plans/b.md" in result.stderr
    result = CliRunner().invoke(cli, ["status", "--plan", "plans/b.md", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["result"]["title"] == "Other"
    refused = json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)
    assert refused["ok"] is False and refused["exit_code"] == 2 and refused["error"]["code"] == "several_plans"
    assert "--plan plans/a.md" in refused["error"]["message"]


def test_several_plans_hint_quotes_each_path_so_pasting_it_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan's file name holding shell code: the printed `--plan PATH` lines are one word each, so
    pasting one into a shell passes the name and runs nothing."""
    hostile = "plans/$(touch PWNED) x;touch PWNED2.md"
    _repo(tmp_path, {"plans/a.md": GOOD_PLAN, hostile: GOOD_PLAN.replace("Tiny", "Other")})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 2
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip().startswith("--plan ")]
    assert len(lines) == 2, result.stderr
    line = next(line for line in lines if "a.md" not in line)
    pasted = subprocess.run(["bash", "-c", f"printf '%s\\n' {line}"], cwd=tmp_path, capture_output=True, text=True)
    assert pasted.stdout.splitlines() == ["--plan", hostile], pasted.stdout
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2.md").exists()
    chosen = CliRunner().invoke(cli, ["status", "--plan", pasted.stdout.splitlines()[1], "--json"])
    assert chosen.exit_code == 0 and json.loads(chosen.stdout)["result"]["title"] == "Other"


def test_status_refuses_broken_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo(tmp_path, {"plans/a.md": GOOD_PLAN.replace("Needs: Phase 0", "Needs: Phase 0, write")})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 2
    assert "`Needs:` cycle: write -> write" in result.stderr


@pytest.mark.parametrize("ref", ["1", "Phase 1", "phase 1", "write", "WRITE", None])
def test_show_phase_as_written_with_resolved_commands(ref: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo(tmp_path, {"plans/tiny.md": GOOD_PLAN})
    _record_pass(tmp_path, "plans/tiny.md", "phase-0")  # so that plain `show` picks the next phase
    monkeypatch.chdir(tmp_path)
    args = ["show"] + ([ref] if ref else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    source = GOOD_PLAN[GOOD_PLAN.index("## Phase 1") :]
    assert result.stdout.startswith(source)
    assert "step-1: mkdir -p 'work/out dir'" in result.stdout
    assert "touch 'work/out dir'/a" in result.stdout

    data = json.loads(CliRunner().invoke(cli, args + ["--json"]).stdout)["result"]["phase"]
    assert data["id"] == "write" and data["label"] == "Phase 1" and data["text"] == source
    assert [s["resolved"] for s in data["steps"]] == ["mkdir -p 'work/out dir'", "touch 'work/out dir'/a\necho done"]
    assert data["metrics"] == ["files"] and data["needs"] == ["Phase 0"]


def test_show_unknown_phase_lists_known_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo(tmp_path, {"plans/tiny.md": GOOD_PLAN})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["show", "7"])
    assert result.exit_code == 2
    assert "no phase '7'" in result.stderr and "write (Phase 1)" in result.stderr


def test_show_crlf_plan_prints_exact_bytes(tmp_path: Path) -> None:
    plan = tmp_path / "crlf.md"
    plan.write_bytes(GOOD_PLAN.replace("\n", "\r\n").encode())
    proc = subprocess.run(
        [str(RUNBOOK), "show", "phase-0", "--plan", str(plan)], capture_output=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    start = GOOD_PLAN.index("## Phase 0")
    end = GOOD_PLAN.index("## Phase 1")
    assert proc.stdout.startswith(GOOD_PLAN[start:end].replace("\n", "\r\n").encode())


def test_the_repository_plans_validate() -> None:
    proc = subprocess.run(
        [str(RUNBOOK), "validate"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert ": ok (" in proc.stdout
