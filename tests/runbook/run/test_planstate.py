"""Issue 19's bullets, one test each, on real repositories with real runs: forget and reset, plan
edits during a run, failed comparisons marked everywhere, the notes' stale next steps, the brief's
cuts, validate's unreachable phases, init's title, and one error type."""

from __future__ import annotations

import json
import re
from pathlib import Path

import plan_states as S
import pytest
from click.testing import CliRunner

from runbook.cli import cli

H = S.H
REPO = Path(__file__).resolve().parents[3]


def rb(repo: Path, *args: str):
    return H.runbook_inproc(repo, *args, timeout=120)


def js(repo: Path, *args: str) -> dict:
    done = rb(repo, *args, "--json")
    envelope = json.loads(done.stdout)
    assert envelope["exit_code"] == done.returncode
    return envelope


# ---- forget and reset -------------------------------------------------------------------------


def test_forget_the_only_run_gives_back_the_plan_as_written(tmp_path: Path) -> None:
    repo = S.fresh_repo(tmp_path / "repo")
    plan = repo / "plans" / "plan.md"
    original = plan.read_bytes()
    assert rb(repo, "next", "--yes").returncode == 0
    [record] = list((repo / "state" / "runs").glob("*.json"))
    run_id = record.stem
    assert plan.read_bytes() != original and (repo / "state" / "runs" / run_id).is_dir()

    env = js(repo, "forget", run_id[:12])
    assert env["ok"] and env["result"]["forgotten"][0]["run_id"] == run_id and env["result"]["plan_updated"]
    assert plan.read_bytes() == original  # blocks gone, boxes unticked, the blank line before the table too
    assert not record.exists() and not (repo / "state" / "runs" / run_id).exists()
    # one commit: the plan and the ledger file's removal, nothing else
    assert H.git(repo, "log", "-1", "--format=%s").strip() == f"runbook: forget run {run_id} (phase-0 pass)"
    assert sorted(H.git(repo, "show", "--name-only", "--format=", "HEAD").split()) == [
        "plans/plan.md", f"state/runs/{run_id}.json"]
    assert env["result"]["commit"] == H.git(repo, "rev-parse", "HEAD").strip()
    assert H.git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    status = js(repo, "status")["result"]
    assert status["phases"][0]["state"] == "not_run" and status["next"]["phase"] == "phase-0"


def test_forget_one_of_two_runs_rewrites_the_phase_from_the_other(tmp_path: Path) -> None:
    repo = S.fresh_repo(tmp_path / "repo")
    assert rb(repo, "next", "--yes").returncode == 0
    assert rb(repo, "next", "--yes", "--phase", "0", "--restart").returncode == 0
    # in start order: two runs in the same second have ids that sort by their random suffix
    records = [json.loads(p.read_text()) for p in (repo / "state" / "runs").glob("*.json")]
    first, second = [r["run_id"] for r in sorted(records, key=lambda r: (r["started"], r["run_id"]))]
    assert js(repo, "forget", "last")["result"]["forgotten"][0]["run_id"] == second
    text = (repo / "plans" / "plan.md").read_text()
    assert f"run {first}" in text and second not in text and "- [x] Probe" in text
    table = text.split("<!-- runbook:results", 1)[1].split("<!-- /runbook:results -->")[0]
    assert [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| 20")] == [f"| {first}"]
    assert js(repo, "history")["result"]["runs"][0]["run_id"] == first


def test_reset_a_rewritten_phase_drops_its_old_runs_everywhere(tmp_path: Path, plan_states: dict[str, Path]) -> None:
    repo = S.copy(plan_states["rewritten-phase"], tmp_path / "repo")
    before = js(repo, "status")["result"]
    assert before["phases"][0]["state"] == "stale"
    old = before["phases"][0]["run_id"]
    env = js(repo, "reset", "Phase 0")
    assert env["ok"] and [r["run_id"] for r in env["result"]["forgotten"]] == [old]
    text = (repo / "plans" / "plan.md").read_text()
    assert old not in text and "runbook:results" not in text.split("## Phase 1")[0]
    after = js(repo, "status")["result"]
    assert after["phases"][0]["state"] == "not_run" and after["next"]["kind"] == "run"
    assert H.git(repo, "log", "-1", "--format=%s").strip() == "runbook: reset phase-0 (forgot 1 run)"


def test_forget_refuses_a_hand_edited_table_and_changes_nothing(tmp_path: Path) -> None:
    repo = S.fresh_repo(tmp_path / "repo")
    assert rb(repo, "next", "--yes").returncode == 0
    plan = repo / "plans" / "plan.md"
    plan.write_text(plan.read_text().replace("| pass |", "| pass (checked by hand) |"))
    snapshot = H.tree_snapshot(repo)
    env = js(repo, "forget", "last")
    assert env["error"]["code"] == "hand_edited" and env["exit_code"] == 2
    assert H.tree_snapshot(repo) == snapshot


# ---- plan edits during a run -----------------------------------------------------------------


def test_plan_edits_during_a_run_are_committed_alone_with_a_warning(tmp_path: Path) -> None:
    plan_text = S.PLAN.replace(
        "- [ ] Probe: `if [ -f work/hold ]",
        "- [ ] Edit: `printf '\\nA note a person added while it ran.\\n' >> plans/plan.md`\n- [ ] Probe: `if [ -f work/hold ]",
    )
    repo = H.make_repo(tmp_path / "repo", plan_text)
    done = rb(repo, "next", "--yes")
    assert done.returncode == 0, done.stderr
    run_id = next((repo / "state" / "runs").glob("*.json")).stem
    assert f"plans/plan.md was edited while run {run_id} ran" in done.stderr and "committed alone" in done.stderr
    subjects = H.git(repo, "log", "--format=%s", "-2").splitlines()
    assert subjects == ["runbook: phase-0 pass (score=3)", f"runbook: plan edits during run {run_id}"]
    edit = H.git(repo, "show", "--format=", "HEAD~1")
    assert "+A note a person added while it ran." in edit and "runbook:status" not in edit
    own = H.git(repo, "show", "--format=", "HEAD", "--", "plans/plan.md")
    assert "+A note a person added" not in own and "runbook:status" in own


# ---- failed comparisons, everywhere the verdict is shown --------------------------------------


def test_a_failed_comparison_is_marked_everywhere_the_verdict_line_is_shown(tmp_path: Path,
                                                                           plan_states: dict[str, Path]) -> None:
    repo = plan_states["failed-with-fallback"]  # read only here; the rerun below is on a copy
    mark = "✗ acc 0.3 >= 0.5"
    text = (repo / "plans" / "plan.md").read_text()
    assert "**Status:** fail · " in text and mark in text.split("## Phase 1", 1)[1].split("## Phase 2")[0]
    assert mark in rb(repo, "status").stdout
    assert mark in rb(repo, "history").stdout
    assert f"- {mark}" in rb(repo, "brief").stdout
    last = js(repo, "history")["result"]["runs"][-1]
    assert last["reason"] == mark and last["failures"] == [mark]
    assert last["comparisons"] == [{"text": "acc 0.3 >= 0.5", "metric": "acc", "op": ">=", "value": 0.3,
                                    "threshold": 0.5, "threshold_metric": None, "held": False, "operands": {}}]
    again = S.copy(repo, tmp_path / "again")
    (again / "work").mkdir(exist_ok=True)
    done = rb(again, "next", "--yes", "--phase", "1", "--restart")
    assert done.returncode == 1 and f"Phase 1 (Train): fail · {mark}" in done.stdout


# ---- the brief: stale next steps, cuts without dangling references ----------------------------


def test_next_steps_written_before_a_later_run_of_their_phase_are_marked(tmp_path: Path) -> None:
    repo = S.fresh_repo(tmp_path / "repo")
    assert rb(repo, "next", "--yes").returncode == 0
    assert rb(repo, "record", "Probed", "--next", "Run Phase 1 with more data", "--next", "Think about serving").returncode == 0
    brief = js(repo, "brief")["result"]
    assert [s["stale"] for s in brief["next_steps"]] == [None, None]  # nothing ran since
    assert rb(repo, "next", "--yes").returncode == 1  # Phase 1 runs (and fails) after the notes were written
    brief = js(repo, "brief")["result"]
    stale, fresh = brief["next_steps"]
    assert stale["text"] == "Run Phase 1 with more data" and fresh["stale"] is None
    assert stale["stale"].startswith("Phase 1 ran since these notes were written: fail in run ")
    # the moment the status block was written, to the microsecond (its comment), after the run before it
    assert brief["notes_updated"] and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", brief["notes_updated"])
    assert f"<!-- written {brief['notes_updated']} -->" in (repo / "plans" / "notes.md").read_text()
    text = rb(repo, "brief").stdout
    assert "- Run Phase 1 with more data _(may be out of date: Phase 1 ran since" in text


def test_a_run_that_ended_just_before_the_notes_were_written_is_not_since(tmp_path: Path) -> None:
    """The notes' time was the minute, so a run that ended in the same minute before `runbook record`
    (an agent records right after `runbook next`) was reported as run since; and one that ended in the
    same second after was missed (the index keeps whole seconds). Both are judged to the microsecond."""
    from runbook.formatting import parse_iso

    repo = S.fresh_repo(tmp_path / "repo")
    assert rb(repo, "next", "--yes").returncode == 0  # Phase 0 passes
    assert rb(repo, "record", "Probed", "--next", "Run Phase 0 again on more data").returncode == 0
    brief = js(repo, "brief")["result"]
    (ran,) = [json.loads(f.read_text()) for f in (repo / "state" / "runs").glob("*.json")]
    ended, written = parse_iso(ran["finished"]), parse_iso(brief["notes_updated"])
    assert ended < written and (written - ended).total_seconds() < 60  # the same minute, at most one apart
    steps = {step["text"]: step["stale"] for step in brief["next_steps"]}
    assert steps["Run Phase 0 again on more data"] is None  # it ended before the notes were written
    assert rb(repo, "next", "--phase", "0", "--yes").returncode == 0  # and again, after them
    steps = {step["text"]: step["stale"] for step in js(repo, "brief")["result"]["next_steps"]}
    again = steps["Run Phase 0 again on more data"]
    assert again is not None and again.startswith("Phase 0 ran since these notes were written: pass in run ")


@pytest.mark.parametrize("max_chars", [400, 700, 1200, 2000, 3000])
def test_a_cut_brief_keeps_no_line_that_points_at_a_cut_section(max_chars: int, plan_states: dict[str, Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("failed-and-stopped", "finished-with-failures", "failed-with-fallback"):
        monkeypatch.chdir(plan_states[name])
        full = CliRunner().invoke(cli, ["brief", "--max-chars", "100000"]).stdout
        cut = CliRunner().invoke(cli, ["brief", "--max-chars", str(max_chars)]).stdout
        action = full[re.search(r"(?m)^## Next(:| —)", full).start():]
        assert len(cut) <= max(max_chars, len(action) + 80)
        # no line of the brief points at another part of it: every line stands on its own
        for text in (full, cut):
            assert not re.search(r"\b(above|below)\b", text), text
        # what is kept is kept whole: every section heading left is followed by its whole section
        for section in re.findall(r"(?m)^## .*$", cut[: len(cut) - len(action)]):
            whole = full.split(section, 1)[1].split("\n## ", 1)[0]
            kept = cut.split(section, 1)[1].split("\n## ", 1)[0].split("\n… (cut to fit")[0]
            assert kept.rstrip() == whole.rstrip() or section.startswith(("## Milestones", "## Lessons", "## Next steps",
                                                                           "## Goal", "## Framing")), section
        assert cut.endswith(action)  # the next action, whole


# ---- validate, init, one error type ------------------------------------------------------------


def test_validate_warns_about_phases_nothing_leads_to(tmp_path: Path) -> None:
    repo = S.fresh_repo(tmp_path / "repo")
    done = rb(repo, "validate")
    assert done.returncode == 0 and "plans/plan.md: ok (4 phases, 1 warning)" in done.stdout
    line = S.PLAN.splitlines().index("## Phase 3: Detour") + 1
    assert f"plans/plan.md:{line}:1: warning: nothing leads to Phase 3" in done.stderr
    assert "runs it only with --phase phase-3" in done.stderr
    problems = js(repo, "validate")["result"]["plans"][0]["problems"]
    assert [(p["severity"], p["line"]) for p in problems] == [("warning", line)]


@pytest.mark.parametrize("title", ["A: B", "yes", "#1 plan", "Bob's 'quoted' \"plan\"", "3.14", "- dash"])
def test_init_title_is_valid_yaml_whatever_it_holds(title: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(cli, ["init", "ws", "--title", title])
    assert done.exit_code == 0, done.output
    monkeypatch.chdir(tmp_path / "ws")
    assert CliRunner().invoke(cli, ["validate"]).exit_code == 0
    assert json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)["result"]["title"] == title
    assert "work/" in (tmp_path / "ws" / ".gitignore").read_text().splitlines()


def test_one_error_type_no_exit_calls_in_the_verbs() -> None:
    for path in sorted((REPO / "runbook" / "commands").glob("*.py")):
        source = path.read_text()
        for banned in ("sys.exit(", "click.exceptions.Exit", "raise click.UsageError", "ClickException", "def fail("):
            assert banned not in source, f"{path.name} uses {banned}: raise RunbookError instead"


def test_an_unreadable_ledger_file_blocks_the_next_action_as_next_refuses(tmp_path: Path,
                                                                         plan_states: dict[str, Path]) -> None:
    repo = S.copy(plan_states["mid-plan"], tmp_path / "repo")
    record = next((repo / "state" / "runs").glob("*.json"))
    record.write_text('{"run_id": "truncated')
    status = js(repo, "status")["result"]["next"]
    assert status["kind"] == "blocked" and status["argv"] is None and record.name in status["why"]
    assert js(repo, "brief")["result"]["next"] == status
    refused = js(repo, "next", "--yes")
    assert refused["error"]["code"] == "io" and record.name in refused["error"]["message"]
