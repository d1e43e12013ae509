"""`runbook init`: scaffolding from templates, never overwriting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import helpers as H
from helpers import git

from runbook.commands.init import GITIGNORE_ENTRIES, gitignore_addition

RUNBOOK = str(Path(sys.executable).with_name("runbook"))
REPO = Path(__file__).resolve().parents[2]


def runbook(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "T", "GIT_COMMITTER_EMAIL": "t@e"}
    return subprocess.run([RUNBOOK, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_init_scaffolds_a_valid_workspace(tmp_path: Path) -> None:
    done = runbook(tmp_path, "init", "ws", "--title", "Drafter")
    assert done.returncode == 0, done.stderr
    ws = tmp_path / "ws"
    for rel in ("plans/game-plan.md", "plans/next-steps.md", "runbook.toml", "state/runs/.gitkeep", ".gitignore", ".git"):
        assert (ws / rel).exists(), rel
    assert (ws / ".gitignore").read_text().splitlines()[-len(GITIGNORE_ENTRIES):] == list(GITIGNORE_ENTRIES)
    assert "work/" in GITIGNORE_ENTRIES  # the starter plan's steps write there
    assert "title: Drafter" in (ws / "plans/game-plan.md").read_text()
    from runbook.store.project import discover_plans, load_config, state_dir

    assert load_config(ws).plans == ["plans/*.md"] and state_dir(ws) == ws / "state"
    assert load_config(ws).keep_outputs is None  # the starter plan has no sweep: nothing kept
    assert discover_plans(ws) == [ws / "plans/game-plan.md"]  # the notes are not a plan
    validate = runbook(ws, "validate")
    assert validate.returncode == 0, validate.stdout + validate.stderr
    brief = runbook(ws, "brief")
    assert brief.returncode == 0 and "## Next: Phase 0 (`phase-0`): Smoke test" in brief.stdout
    assert "- [ ] step-1: `mkdir -p work/out`" in brief.stdout
    # the workspace takes a record at once, and its commit holds only the notes
    assert runbook(ws, "record", "Scaffolded", "--lesson", "start small").returncode == 0
    shown = subprocess.run(["git", "show", "--name-only", "--format=", "HEAD"], cwd=ws, capture_output=True, text=True)
    assert shown.stdout.split() == ["plans/next-steps.md"]


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    mine = tmp_path / "plans" / "game-plan.md"
    mine.write_text("my own plan\n")
    (tmp_path / "runbook.toml").write_text("state = 'elsewhere'\n")
    done = runbook(tmp_path, "init")
    assert done.returncode == 2
    assert "refusing to overwrite" in done.stderr
    assert str(mine) in done.stderr and str(tmp_path / "runbook.toml") in done.stderr
    assert "next-steps.md" not in done.stderr  # only the files that exist are named
    assert mine.read_text() == "my own plan\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["game-plan.md", "plans", "runbook.toml"]
    assert "Traceback" not in done.stderr


def test_init_example_eagle3_copies_plan_notes_and_prompts(tmp_path: Path) -> None:
    done = runbook(tmp_path, "init", "--example", "eagle3")
    assert done.returncode == 0, done.stderr
    plan = (tmp_path / "plans/eagle3-game-plan.md").read_text()
    for verb in ("toy-target", "prepare", "extract", "vocab", "train", "evaluate"):
        assert f"eagle {verb} " in plan
    assert "notes: eagle3-next-steps.md" in plan
    prompts = tmp_path / "plans/data/prompts.jsonl"
    assert prompts.read_bytes() == (REPO / "plans/data/prompts.jsonl").read_bytes()
    assert (tmp_path / "plans/data/prompts-heldout.jsonl").stat().st_size > 0
    assert runbook(tmp_path, "validate").returncode == 0
    # its Phase 2 is a sweep: the pick puts the chosen trial's drafter back from the kept copies
    from runbook.store.project import load_config

    assert load_config(tmp_path).keep_outputs == "work/kept"
    brief = runbook(tmp_path, "brief").stdout
    assert "--prompts plans/data/prompts-heldout.jsonl -k 3" in brief
    assert "Use at least 8 decoder layers" in brief
    again = runbook(tmp_path, "init", "--example", "eagle3")
    assert again.returncode == 2 and "eagle3-game-plan.md" in again.stderr


def test_init_inside_an_existing_repo_and_gitignore_kept(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("*.pyc\nstate/lock")
    done = runbook(tmp_path, "init")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / ".gitignore").read_text()
    assert text.startswith("*.pyc\nstate/lock\n")
    assert text.count("state/lock") == 1 and "state/write.lock\nstate/runs/*/\n" in text
    assert "git init" not in done.stdout
    sub = runbook(tmp_path, "init", "nested")
    assert sub.returncode == 0 and "is inside the git repository" in sub.stderr
    assert not (tmp_path / "nested" / ".git").exists()


def test_gitignore_addition_is_idempotent() -> None:
    first = gitignore_addition("")
    assert first.splitlines()[1:] == list(GITIGNORE_ENTRIES)
    assert gitignore_addition(first) == ""
    assert gitignore_addition("a\r\nb\r\n").endswith("state/runs/*/\r\nwork/\r\n")


def test_agents_md_shows_the_mcp_entry_init_prints(tmp_path: Path) -> None:
    """The MCP snippet in AGENTS.md is the entry `runbook init` prints: this venv's runbook by its
    absolute path and the workspace's root, so a host without the venv on PATH can start it."""
    import json

    done = H.runbook(tmp_path, "init", "ws", "--json")
    printed = json.loads(done.stdout)["result"]["mcp_config"]
    agents = (tmp_path / "ws" / "AGENTS.md").read_text()
    snippet = agents[agents.index("```json\n") + len("```json\n"):]
    shown = json.loads(snippet[: snippet.index("```")])
    assert shown == printed
    assert Path(shown["mcpServers"]["runbook"]["command"]).is_absolute()
    assert shown["mcpServers"]["runbook"]["args"][-2:] == ["--root", str((tmp_path / "ws").resolve())]
