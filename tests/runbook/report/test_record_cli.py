"""`runbook record` end to end: real git repositories in temp dirs, real subprocesses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import helpers as H
import pytest
from click.testing import CliRunner
from helpers import git

from runbook.cli import cli
from runbook.model import RunRecord
from runbook.report import notes
from runbook.store.ledger import save_run

RUNBOOK = str(Path(sys.executable).with_name("runbook"))

PLAN = """\
---
runbook: 1
title: Toy drafter
notes: notes.md
vars:
  out: work/out
---

# Game plan: toy drafter

Train a drafter; beat acceptance 1.5.

## Phase 0: Probe (~5 min)

Steps:
- [ ] Probe: `echo '{"accept_len": 2.4}' > "$RUNBOOK_METRICS"`

Pass: `accept_len >= 1.5`

## Phase 1: Fine-tune (~2 h)

Steps:
- [ ] Train: `echo train {out}`
- [ ] Evaluate: `echo eval`

Pass: `accept_len >= 1.5 and train_loss < 4.0`
On fail: Phase 2

## Phase 2: More data (~2 days)

Steps:
- [ ] Extract: `eagle extract --out {out}`

Pass: `accept_len >= 2`
"""


def make_repo(tmp_path: Path, notes: str | bytes | None = None) -> Path:
    return H.make_repo(tmp_path / "repo", PLAN, notes)


def run_record(repo: Path, monkeypatch: pytest.MonkeyPatch, *args: str, input: str | None = None):
    monkeypatch.chdir(repo)
    return CliRunner().invoke(cli, ["record", *args], input=input, catch_exceptions=False)


def a_run(run_id: str, phase: str, label: str, verdict: str, metrics: dict[str, float], **extra) -> RunRecord:
    return H.run_record(
        run_id=run_id,
        plan="plans/plan.md",
        plan_blob="0" * 40,
        phase=phase,
        phase_label=label,
        phase_text_hash="0" * 64,
        started=f"2026-11-29T{run_id[9:11]}:{run_id[11:13]}:{run_id[13:15]}.000000Z",
        finished=f"2026-11-29T{run_id[9:11]}:{run_id[11:13]}:{run_id[13:15]}.500000Z",
        duration_s=0.5,
        metrics=metrics,
        verdict=verdict,
        **extra,
    )


def test_record_without_run_creates_notes_and_commits_only_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path)
    (repo / "plans" / "plan.md").write_text(PLAN + "\nuser edit, not ours to commit\n")
    (repo / "scratch.txt").write_text("untracked user file\n")
    result = run_record(
        repo, monkeypatch, "Pipeline validated end to end", "--metric", "extract_tok_s=2912",
        "--lesson", "batch 4, not 2000, or extraction OOMs", "--next", "Phase 1: fine-tune", "--json",
    )
    assert result.exit_code == 0, result.output
    envelope = json.loads(result.stdout)
    assert (envelope["command"], envelope["ok"], envelope["exit_code"]) == ("record", True, 0)
    out = envelope["result"]
    assert out["created_notes"] is True and out["notes"] == "plans/notes.md"
    assert out["milestone"]["metrics"] == {"extract_tok_s": 2912.0} and out["milestone"]["run_id"] is None
    assert out["lessons_added"] == ["batch 4, not 2000, or extraction OOMs"]
    text = (repo / "plans" / "notes.md").read_text()
    assert text.startswith("# Notes: Toy drafter\n")
    assert "· Pipeline validated end to end\n" in text and "Metrics: extract_tok_s 2912" in text
    assert "- batch 4, not 2000, or extraction OOMs\n" in text and "## Next steps\n\n- Phase 1: fine-tune\n" in text
    assert "<!-- runbook:notes-status -->" in text and "Current phase: Phase 0 (`phase-0`)" in text
    # the commit holds the notes alone; the user's edit and untracked file stay as they were
    assert git(repo, "show", "--name-only", "--format=%s", "HEAD").split() == [
        "runbook:", "record", "Pipeline", "validated", "end", "to", "end", "(extract_tok_s=2912)", "plans/notes.md"
    ]
    assert out["commit"] == git(repo, "rev-parse", "HEAD").strip()
    status = git(repo, "status", "--porcelain")
    assert " M plans/plan.md" in status and "?? scratch.txt" in status and "notes.md" not in status


def test_record_removes_the_temp_file_a_killed_record_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 between the temp file and the rename leaves `.notes.md.XXXX.tmp`: the next record,
    under the write lock, removes it (tests/e2e/test_crash_safety.py meets it at random)."""
    repo = make_repo(tmp_path, notes="# Notes\n")
    left = repo / "plans" / ".notes.md.k1ll3d.tmp"
    left.write_text("half a notes document")
    other = repo / "plans" / ".plan.md.keep.txt"  # not a temp file of the notes: stays
    other.write_text("mine\n")
    result = run_record(repo, monkeypatch, "After the crash", "--lesson", "temp files go")
    assert result.exit_code == 0, result.output
    assert not left.exists() and other.exists()
    assert git(repo, "status", "--porcelain") == "?? plans/.plan.md.keep.txt\n"


def test_record_with_run_merges_its_metrics_and_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path)
    save_run(repo / "state", a_run("20261129-100000-aaaa", "phase-0", "0", "pass", {"accept_len": 2.41, "step-1.accept_len": 2.41}, commit_before="c0ffee1234567890"))
    save_run(repo / "state", a_run("20261129-110000-bbbb", "phase-1", "1", "fail",
                                   {"accept_len": 1.31, "train_loss": 1.9, "step-2.accept_len": 1.31}, commit_before="deadbeef00112233"))
    result = run_record(repo, monkeypatch, "Fine-tune fell short", "--run", "last", "--metric", "train_loss=1.85", "--json")
    assert result.exit_code == 0, result.output
    milestone = json.loads(result.stdout)["result"]["milestone"]
    assert milestone["run_id"] == "20261129-110000-bbbb" and milestone["phase"] == "phase-1"
    assert milestone["commit"] == "deadbeef00112233" and milestone["verdict"] == "fail"
    assert milestone["label"] == "Phase 1" and re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:00Z$", milestone["when"])
    assert milestone["metrics"] == {"accept_len": 1.31, "train_loss": 1.85}  # flag wins, step copies dropped
    text = (repo / "plans" / "notes.md").read_text()
    assert "Run `20261129-110000-bbbb` · Phase 1 (`phase-1`) · fail · commit `deadbeef00`" in text
    # the status block: On fail of Phase 1 leads to Phase 2; the headline compares with its goal
    assert "Current phase: Phase 2 (`phase-2`)" in text
    assert "Last verdicts: Phase 0 pass · Phase 1 fail · Phase 2 not run" in text
    assert "✗ accept_len 1.31 >= 2" in text
    # a run chosen by id prefix
    result = run_record(repo, monkeypatch, "Probe", "--run", "20261129-10", "--no-commit", "--json")
    assert json.loads(result.stdout)["result"]["milestone"]["run_id"] == "20261129-100000-aaaa"
    assert json.loads(result.stdout)["result"]["commit"] is None


def test_repeated_lesson_is_recorded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path)
    first = run_record(repo, monkeypatch, "One", "--lesson", "Use --prepared-data, not --data-path.")
    assert first.exit_code == 0, first.output
    again = run_record(repo, monkeypatch, "Two", "--lesson", "use `--prepared-data`, not  --data-path", "--lesson", "a new one", "--json")
    out = json.loads(again.stdout)["result"]
    assert out["lessons_added"] == ["a new one"]
    assert out["lessons_skipped"] == ["use `--prepared-data`, not --data-path"]
    text = (repo / "plans" / "notes.md").read_text()
    assert text.count("prepared-data") == 1 and text.count("### ") == 2
    human = run_record(repo, monkeypatch, "Three", "--lesson", "A NEW ONE")
    assert "lesson already there, not added again: A NEW ONE" in human.output


HAND_BEFORE = "# Notes: toy drafter\r\n\r\nThe anchor does 340 tok/s; we do 82.5.\r\n\r\n## Hardware\r\n\r\n8x PCIe.\r\n\r\n"
HAND_OWNED = "## Milestones\r\n\r\n### 2026-11-01 · First\r\n\r\nold\r\n\r\n## Lessons learned\r\n\r\n- keep this\r\n\r\n"
HAND_AFTER = "## Open questions\r\n\r\n- Why is TP=8 slower?\r\n\r\n```sh\r\n## Next steps\r\n```\r\ntrailing words"


def test_hand_written_sections_around_owned_ones_stay_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path, (HAND_BEFORE + HAND_OWNED + HAND_AFTER).encode())
    result = run_record(repo, monkeypatch, "Second", "--lesson", "new", "--next", "do it")
    assert result.exit_code == 0, result.output
    data = (repo / "plans" / "notes.md").read_bytes()
    assert data.startswith(HAND_BEFORE.encode())
    assert data.endswith(HAND_AFTER.encode())
    assert b"\n" not in data.replace(b"\r\n", b"")  # CRLF kept throughout
    text = data.decode()
    assert "- keep this\r\n- new\r\n" in text and "## Next steps\r\n\r\n- do it\r\n" in text
    assert text.index("### 2026-11-01 · First") < text.index("· Second\r\n")


def test_bad_metric_is_a_usage_error_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path)
    for bad in ("accept_len", "accept_len=fast", "=3", "a=nan"):
        result = run_record(repo, monkeypatch, "T", "--metric", bad)
        assert result.exit_code == 2
        assert "--metric" in result.output and "NAME=NUMBER" in result.output
    unknown = run_record(repo, monkeypatch, "T", "--run", "20990101")
    assert unknown.exit_code == 2 and "runbook history" in unknown.output
    no_title = run_record(repo, monkeypatch, "--lesson", "x")
    assert no_title.exit_code == 2 and "TITLE" in no_title.output
    assert not (repo / "plans" / "notes.md").exists()
    assert git(repo, "rev-list", "--count", "HEAD").strip() == "1"


def test_body_from_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path)
    result = run_record(repo, monkeypatch, "With body", "--body", "-", input="First line.\n\nSecond *para*.\n")
    assert result.exit_code == 0, result.output
    assert "· With body\n\nFirst line.\n\nSecond *para*.\n" in (repo / "plans" / "notes.md").read_text()


def test_record_while_another_process_holds_the_run_lock(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom runbook.store.lock import run_lock\n"
         "with run_lock(sys.argv[1], run_id='20261129-120000-cccc'):\n"
         "    print('held', flush=True)\n    time.sleep(60)\n", str(repo / "state")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert (repo / "state" / "lock").exists()
        # a second `runbook next` would be refused here; record only needs the short write lock
        started = time.monotonic()
        done = subprocess.run(
            [RUNBOOK, "record", "Milestone during a long phase", "--metric", "x=1", "--json"],
            cwd=repo, capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started < 30
        assert json.loads(done.stdout)["result"]["commit"] == git(repo, "rev-parse", "HEAD").strip()
        assert holder.poll() is None  # the long run still holds its lock
        assert json.loads((repo / "state" / "lock").read_text())["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    assert "Milestone during a long phase" in (repo / "plans" / "notes.md").read_text()
    assert git(repo, "status", "--porcelain") == ""


def test_record_refuses_mid_merge_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path)
    (repo / ".git" / "MERGE_HEAD").write_text(git(repo, "rev-parse", "HEAD"))
    result = run_record(repo, monkeypatch, "T")
    assert result.exit_code == 2 and "merge" in result.output
    assert not (repo / "plans" / "notes.md").exists()
    ok = run_record(repo, monkeypatch, "T", "--no-commit")
    assert ok.exit_code == 0 and (repo / "plans" / "notes.md").exists()


def test_editor_text_parses_title_body_metrics_lessons_next() -> None:
    from runbook.commands.record import parse_editor_text
    from runbook.report.templates import render

    template = render("record-editor.md.j2", title="", plan="plans/plan.md", notes="plans/notes.md", run=None)
    assert parse_editor_text(template)[0] == ""  # an untouched template records nothing
    edited = template.replace("\n", "Probe done\nBody text.\n", 1)
    edited = edited.replace("## Metrics\n", "## Metrics\naccept_len = 2.41\n")
    edited = edited.replace("## Lessons\n", "## Lessons\n- batch 4\n").replace("## Next steps\n", "## Next steps\n- Phase 1\n")
    title, body, metrics, lessons, nxt = parse_editor_text(edited)
    assert (title, body, metrics, lessons, nxt) == ("Probe done", "Body text.", {"accept_len": 2.41}, ["batch 4"], ["Phase 1"])
    with pytest.raises(ValueError, match="NAME=NUMBER"):
        parse_editor_text(edited.replace("accept_len = 2.41", "accept_len = high"))


def test_editor_opens_in_a_terminal(tmp_path: Path) -> None:
    """No TITLE, no flags, a terminal: $EDITOR edits the template (a script stands in for a person)."""
    repo = make_repo(tmp_path)
    editor = tmp_path / "editor.py"
    editor.write_text(
        "import sys\np = sys.argv[1]\nt = open(p).read()\n"
        "t = t.replace('\\n', 'From the editor\\nIt worked.\\n', 1).replace('## Lessons\\n', '## Lessons\\n- edit lesson\\n')\n"
        "open(p, 'w').write(t)\n"
    )
    script = (
        "import os, pty, sys\n"
        f"os.chdir({str(repo)!r})\n"
        f"os.environ['EDITOR'] = {sys.executable!r} + ' ' + {str(editor)!r}\n"
        f"pid, fd = pty.fork()\n"
        f"if pid == 0:\n    os.execv({RUNBOOK!r}, [{RUNBOOK!r}, 'record'])\n"
        "out = b''\n"
        "while True:\n    try:\n        chunk = os.read(fd, 4096)\n    except OSError:\n        break\n"
        "    if not chunk:\n        break\n    out += chunk\n"
        "_, status = os.waitpid(pid, 0)\nsys.stdout.write(out.decode())\nsys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (repo / "plans" / "notes.md").read_text()
    assert "· From the editor\n\nIt worked.\n" in text and "- edit lesson\n" in text


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Test")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "t@example.com")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Test")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "t@example.com")
    monkeypatch.delenv("EDITOR", raising=False)
    os.environ.pop("VISUAL", None)


def test_commit_subject_leads_with_the_metrics_the_criterion_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path)
    save_run(repo / "state", a_run("20261129-110000-bbbb", "phase-1", "1", "fail",
                                   {"accept_len": 1.31, "train_loss": 1.9, "aaa_bytes": 7.0}, commit_before="deadbeef00112233"))
    result = run_record(repo, monkeypatch, "Fine-tune", "--run", "last", "--metric", "abc=2")
    assert result.exit_code == 0, result.output
    subject = subprocess.run(["git", "log", "-1", "--format=%s"], cwd=repo, capture_output=True, text=True).stdout.strip()
    # Phase 1's `Pass:` names accept_len and train_loss: those come first, whatever their names sort as
    assert subject == "runbook: record Fine-tune (accept_len=1.31, train_loss=1.9, aaa_bytes=7)", subject


STEP_PLAN = """\
---
runbook: 1
title: Per-step metrics
notes: notes.md
---

# Per-step metrics

## Phase 0: Three evaluations (~1 min)

Steps:
- [ ] First: `echo '{"val_acc": 0.5}' > "$RUNBOOK_METRICS"`
- [ ] Second: `echo '{"val_acc": 0.7}' > "$RUNBOOK_METRICS"`
- [ ] Third: `echo '{"val_acc": 0.9}' > "$RUNBOOK_METRICS"`

Pass: `step-1.val_acc >= 0.4 and step-3.val_acc >= 0.8`
"""


def test_notes_status_block_shows_the_step_metrics_a_phase_passed_on(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", STEP_PLAN)
    assert H.runbook_inproc(repo, "next", "--yes").returncode == 0
    done = H.runbook_inproc(repo, "record", "Judged", "--run", "last")
    assert done.returncode == 0, done.stderr
    status = notes.read_status((repo / "plans" / "notes.md").read_text())
    assert "(missing)" not in status, status
    assert ("Goal of Phase 0 (`step-1.val_acc >= 0.4 and step-3.val_acc >= 0.8`): "
            "step-1.val_acc 0.5 >= 0.4 · step-3.val_acc 0.9 >= 0.8") in status
    brief = H.runbook_inproc(repo, "brief")
    assert brief.returncode == 0 and "(missing)" not in brief.stdout


def test_record_next_twice_keeps_both_and_replace_next_replaces(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    path = repo / "plans" / "notes.md"
    first = H.runbook_inproc(repo, "record", "One", "--next", "Phase 1: fine-tune")
    assert first.returncode == 0 and "next steps added: 1 item(s)" in first.stdout
    second = H.runbook_inproc(repo, "record", "Two", "--next", "Phase 2: more data", "--next", "Phase 1: fine-tune.")
    assert second.returncode == 0, second.stderr
    assert "next step already there, not added again: Phase 1: fine-tune." in second.stdout
    assert notes.read_next_steps(path.read_text()) == ["Phase 1: fine-tune", "Phase 2: more data"]
    assert "Next steps" in H.git(repo, "show", "HEAD:plans/notes.md")  # committed
    out = json.loads(H.runbook_inproc(repo, "record", "Three", "--next", "Write it up", "--replace-next",
                                      "--json").stdout)["result"]
    assert out["next_steps"] == ["Write it up"] and out["next_steps_replaced"] is True
    assert notes.read_next_steps(path.read_text()) == ["Write it up"]
    helptext = H.runbook_inproc(repo, "record", "--help").stdout
    assert "--replace-next" in helptext and "Add an item to 'Next steps'" in helptext
