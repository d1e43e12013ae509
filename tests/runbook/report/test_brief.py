"""`runbook brief` on plans in the middle of their lives."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import helpers as H
import pytest
from click.testing import CliRunner
from helpers import git, load_test_module

from runbook.cli import cli
from runbook.contract import Brief, MilestoneText, NextAction, NoteStep, PhaseView, RunView, StepLine
from runbook.model import StepResult
from runbook.report.notes import Milestone, apply_record
from runbook.store.ledger import save_run

_record_cli = load_test_module("runbook/report/test_record_cli.py")
PLAN, a_run, make_repo = _record_cli.PLAN, _record_cli.a_run, _record_cli.make_repo
LESSONS = ["Use --prepared-data, not --data-path.", "batch 4, not 2000, or extraction OOMs"]


def mid_life_repo(tmp_path: Path, plan: str = PLAN, milestones: int = 1) -> Path:
    """Phase 0 passed, Phase 1 failed on accept_len, Phase 2 pending (Phase 1's On fail)."""
    notes = "# Notes: toy drafter\n\nThe anchor does 340 tok/s, we do 82.5.\n"
    for i in range(milestones):
        entry = Milestone(title=f"Milestone number {i}", when=f"2026-11-{(i % 28) + 1:02d} 10:00 UTC", body="Words. " * 40)
        notes, _ = apply_record(notes, entry, LESSONS if i == 0 else [], ["Look at the data mix"] if i == 0 else None)
    repo = make_repo(tmp_path, notes)
    if plan != PLAN:
        (repo / "plans" / "plan.md").write_text(plan)
    state = repo / "state"
    head = git(repo, "rev-parse", "HEAD").strip()
    save_run(state, a_run("20261129-100000-aaaa", "phase-0", "0", "pass", {"accept_len": 2.41},
                          criterion="`accept_len >= 1.5`", reason="accept_len 2.41 >= 1.5", commit_before=head))
    save_run(state, a_run("20261129-110000-bbbb", "phase-1", "1", "fail", {"accept_len": 1.31, "train_loss": 1.93},
                          criterion="`accept_len >= 1.5 and train_loss < 4.0`",
                          reason="✗ accept_len 1.31 >= 1.5 and train_loss 1.93 < 4.0", commit_before=head))
    return repo


def brief(repo: Path, monkeypatch: pytest.MonkeyPatch, *args: str):
    monkeypatch.chdir(repo)
    return CliRunner().invoke(cli, ["brief", *args], catch_exceptions=False)


def test_mid_life_brief_names_failure_lessons_and_next_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = mid_life_repo(tmp_path)
    result = brief(repo, monkeypatch)
    assert result.exit_code == 0, result.output
    out = result.output
    # fixed order of the sections
    order = ["## Goal", "## Framing", "## Phases", "## Last run", "## Milestones", "## Lessons learned",
             "## Next steps", "## Next: Phase 2 (`phase-2`): More data (~2 days) — run", "## Continue"]
    positions = [out.index(s) for s in order]
    assert positions == sorted(positions)
    assert "Train a drafter; beat acceptance 1.5." in out and "we do 82.5" in out
    assert "| Phase 0 | `phase-0` | Probe (~5 min) | passed | accept_len 2.41 |" in out
    assert "| Phase 1 | `phase-1` | Fine-tune (~2 h) | failed | accept_len 1.31, train_loss 1.93 |" in out
    assert "| Phase 2 | `phase-2` | More data (~2 days) | not run |" in out
    assert "- ✗ accept_len 1.31 >= 1.5\n" in out  # the failing comparison, marked, with the measured value
    assert "train_loss 1.93 < 4" not in out.split("## Last run")[1].split("## Milestones")[0].split("Why it failed:")[1]
    for lesson in LESSONS:
        assert f"- {lesson}\n" in out
    assert "- [ ] step-1: `eagle extract --out work/out`" in out  # resolved vars
    assert "Pass: `accept_len >= 2`" in out
    assert out.rstrip().endswith("```sh\nrunbook next --yes\n```")


def test_json_validates_against_the_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = mid_life_repo(tmp_path)
    result = brief(repo, monkeypatch, "--json")
    assert result.exit_code == 0, result.output
    envelope = json.loads(result.stdout)
    assert (envelope["command"], envelope["ok"], envelope["exit_code"]) == ("brief", True, 0)
    model = Brief.model_validate(envelope["result"])
    assert model.next.label == "Phase 2" and model.next.phase == "phase-2" and model.next.kind == "run"
    assert model.next.command == "runbook next --yes" and model.next.argv == [H.RUNBOOK_EXE, "next", "--yes"]
    assert model.last_run is not None and model.last_run.failures == ["✗ accept_len 1.31 >= 1.5"]
    [accept, loss] = model.last_run.comparisons
    assert (accept.metric, accept.op, accept.value, accept.threshold, accept.held) == ("accept_len", ">=", 1.31, 1.5, False)
    assert loss.held is True
    assert model.last_run.finished == "2026-11-29T11:00:00Z"  # ISO 8601 UTC to the second
    assert [row.state for row in model.phases] == ["passed", "failed", "not_run"]
    assert [row.verdict for row in model.phases] == ["pass", "fail", None]
    assert model.lessons == LESSONS
    assert model.max_chars is None and model.milestones_omitted == 0  # --json is whole unless --max-chars is given
    # unknown or missing fields are rejected: the schema is the contract
    data = envelope["result"]
    with pytest.raises(ValueError):
        Brief.model_validate({**data, "surprise": 1})
    del data["next"]
    with pytest.raises(ValueError):
        Brief.model_validate(data)


def test_schema_is_documented() -> None:
    docs = Path(__file__).resolve().parents[3] / "docs"
    brief_doc = (docs / "brief.md").read_text()
    json_doc = (docs / "json.md").read_text()
    for model, doc in ((Brief, brief_doc), (NoteStep, brief_doc), (MilestoneText, brief_doc), (PhaseView, json_doc),
                       (RunView, json_doc), (NextAction, json_doc), (StepLine, json_doc)):
        assert f"`{model.__name__}`" in doc
        for field in model.model_fields:
            assert re.search(rf"`{field}`", doc), f"docs does not describe {model.__name__}.{field}"


def test_max_chars_drops_oldest_milestones_first_never_the_next_action(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = mid_life_repo(tmp_path, milestones=12)
    full = brief(repo, monkeypatch, "--max-chars", "100000").output
    assert "Milestone number 0" in full and "omitted" not in full
    cut = brief(repo, monkeypatch, "--max-chars", "3500").output
    assert len(cut) <= 3500
    kept = [int(n) for n in re.findall(r"Milestone number (\d+)", cut)]
    assert kept and kept == list(range(12 - len(kept), 12))  # the newest survive, oldest go first
    assert f"({12 - len(kept)} older milestones omitted to fit; see `plans/notes.md`)" in cut
    tail = full[full.index("## Next: Phase 2"):]
    assert cut.endswith(tail)  # the next action is whole
    for lesson in LESSONS:
        assert lesson in cut  # lessons outlive milestones
    tiny = brief(repo, monkeypatch, "--max-chars", "200").output
    assert tiny.endswith(tail) and "Milestone number" not in tiny
    as_json = Brief.model_validate(json.loads(brief(repo, monkeypatch, "--json", "--max-chars", "3500").stdout)["result"])
    assert as_json.milestones_omitted == 12 - len(kept) and as_json.milestones[-1].heading.endswith("Milestone number 11")
    assert as_json.max_chars == 3500
    whole = Brief.model_validate(json.loads(brief(repo, monkeypatch, "--json").stdout)["result"])
    assert len(whole.milestones) == 12 and whole.milestones_omitted == 0


def test_fail_with_on_fail_stop_offers_a_retry_only_when_something_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = mid_life_repo(tmp_path, plan=PLAN.replace("On fail: Phase 2\n", ""))
    git(repo, "commit", "-qam", "no fallback")
    # both runs ran on HEAD as it is now: nothing changed since, so nothing to retry
    for run in (repo / "state" / "runs").glob("*.json"):
        data = json.loads(run.read_text())
        data["commit_before"] = git(repo, "rev-parse", "HEAD").strip()
        run.write_text(json.dumps(data))
    out = brief(repo, monkeypatch).output
    assert "## Next: Phase 1 (`phase-1`): Fine-tune" not in out
    assert "## Next — nothing" in out and "Phase 1 failed (run 20261129-110000-bbbb: ✗ accept_len 1.31 >= 1.5" in out
    assert "Nothing changed since" in out and "a retry would repeat the fail" in out
    assert out.rstrip().endswith("Nothing to run: the plan stopped after Phase 1 failed, and nothing changed since.")
    # the code changes: now the retry is offered, naming what changed
    (repo / "train.py").write_text("lr = 1e-4\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-qm", "lower the learning rate")
    out = brief(repo, monkeypatch).output
    assert "## Next: Phase 1 (`phase-1`): Fine-tune (~2 h) — retry" in out and "train.py" in out
    assert out.rstrip().endswith("runbook next --phase phase-1 --restart --yes\n```")
    assert "- [ ] step-1: `echo train work/out`" in out


def test_error_run_shows_the_failing_step_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = mid_life_repo(tmp_path)
    plan_text = (repo / "plans" / "plan.md").read_text()
    from runbook.plan.parse import parse_plan
    from runbook.plan.writeback import phase_text_hash

    plan, _ = parse_plan(plan_text, "plans/plan.md")
    assert plan is not None
    record = a_run(
        "20261129-120000-cccc", "phase-2", "2", "error", {}, reason="step-1 exited 3",
        steps=[StepResult(step_id="step-1", command="eagle extract --out work/out", exit_code=3,
                          log_tail=["loading", "CUDA out of memory"])],
    )
    save_run(repo / "state", record.model_copy(update={"phase_text_hash": phase_text_hash(plan_text, plan.phases[2])}))
    out = brief(repo, monkeypatch).output
    assert "- step-1 exited 3: `eagle extract --out work/out`\n    loading\n    CUDA out of memory\n" in out
    assert "## Next: Phase 2 (`phase-2`)" in out and "resuming its last run" in out
    assert out.rstrip().endswith("runbook next --yes\n```")


def test_several_plans_put_plan_in_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = mid_life_repo(tmp_path)
    (repo / "plans" / "other.md").write_text(PLAN.replace("notes: notes.md", "notes: other-notes.md"))
    monkeypatch.chdir(repo)
    refused = CliRunner().invoke(cli, ["brief"])
    assert refused.exit_code == 2 and "--plan" in refused.output
    as_json = json.loads(CliRunner().invoke(cli, ["brief", "--json"]).stdout)
    assert as_json["ok"] is False and as_json["error"]["code"] == "several_plans" and as_json["exit_code"] == 2
    out = brief(repo, monkeypatch, "--plan", "plans/plan.md").output
    assert out.rstrip().endswith("runbook next --plan plans/plan.md --yes\n```")


def test_brief_subprocess_does_not_import_git_or_torch(tmp_path: Path) -> None:
    repo = mid_life_repo(tmp_path)
    code = (
        "import sys\nfrom runbook.cli import main\nsys.argv = ['runbook', 'brief']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('git', 'torch', 'transformers', 'eagle') if m in sys.modules]\n"
        "print('IMPORTED', bad, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60)
    assert "IMPORTED []" in done.stderr and "## Continue" in done.stdout


def test_short_is_a_primer_with_the_goal_the_state_and_the_exact_next_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = mid_life_repo(tmp_path, milestones=3)
    full = brief(repo, monkeypatch)
    short = brief(repo, monkeypatch, "--short")
    assert short.exit_code == 0, short.output
    lines = short.output.splitlines()
    assert 4 <= len(lines) <= 8 and all(len(line) <= 110 for line in lines), lines
    assert lines[0].startswith("runbook: ") and "(plans/plan.md)" in lines[0]
    assert any(line.startswith("Goal: Train a drafter; beat acceptance 1.5.") for line in lines)
    assert "Last run: 20261129-110000-bbbb Phase 1 fail" in lines
    assert "Next: runbook next --yes" in lines  # the same command the whole brief ends with
    assert full.output.rstrip().endswith("```sh\nrunbook next --yes\n```")
    assert len(short.output) < len(full.output) / 4
