"""Special files at every path runbook reads, and git hooks that fail or hang.

- Special files: a workspace with one recorded run (its ledger record, kept series, step log and
  metrics, the ledger index and its key, notes, a stale lock) has one of its files replaced by a FIFO
  nobody writes, a link to /dev/zero or a directory; also where runbook looks for a file that is not
  there (runbook.toml, pyproject.toml, a run's live state). The reading verbs (status, history,
  brief, show, logs, next --dry-run, validate) and the writing ones (record, next) run in process on
  it: each answers within its time limit (a hang would block in open() or read() and is stopped by
  SIGALRM), with runbook's own words (no traceback, no internal error) and an exit code of its own.
- Hooks: every hook git runs for runbook's commits (found by installing a logging hook under every
  name git knows and making real commits through `runbook record` and `runbook next`), made to fail
  or to hang. `record` and `next` end within RUNBOOK_GIT_TIMEOUT_S and a few seconds, with a message
  naming the git command, and nothing is half written: the notes and the plan parse, and what was
  recorded is committed by the next command once the hook is gone.

Budget: RUNBOOK_FUZZ_EXAMPLES scales the hook cases as in tests/runbook/plan/test_fuzz_parse.py;
every special-file case runs.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

import helpers as H
import pytest

PLAN = """\
---
runbook: 1
title: Special
notes: notes.md
---
# Special

## Phase 0: Train
Steps:
- [ ] Train: `echo training; echo '{"step": 1, "loss": 2.0}' >> "$RUNBOOK_SERIES"; echo '{"loss": 1.5}' > "$RUNBOOK_METRICS"`
Pass: `loss <= 2`

## Phase 1: Eval
Steps:
- [ ] Eval: `echo '{"acc": 1}' > "$RUNBOOK_METRICS"`
Pass: `acc >= 1`
"""

# What a verb may answer with: 0 ok, 1 a command error, 2 bad input, 5 locked; never internal (70?)
# or a signal. The internal error is recognised by its words below.
EXITS = {0, 1, 2, 3, 4, 5}
READERS = [
    ("status", "--json"), ("history", "--json"), ("brief",), ("show", "phase-0", "--json"), ("logs",),
    ("next", "--dry-run", "--json"), ("validate", "--json"),
]
WRITERS = [("record", "Looked at it", "--lesson", "special files are refused"), ("next", "--yes")]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(repo, cache home): one run of Phase 0 recorded, a lesson in the notes."""
    base = tmp_path_factory.mktemp("special")
    cache = base / "cache"
    repo = H.make_repo(base / "repo", PLAN)
    env = {"XDG_CACHE_HOME": str(cache)}
    assert H.runbook(repo, "next", "--yes", env=env).returncode == 0
    assert H.runbook(repo, "record", "Trained", "--lesson", "first", env=env).returncode == 0
    return repo, cache


def _targets(repo: Path) -> list[str]:
    """Repo-relative paths runbook reads in this workspace ('~cache/...' under the cache home)."""
    (run_json,) = (repo / "state" / "runs").glob("*.json")
    run = run_json.stem
    return [
        "plans/plan.md", "plans/notes.md", "runbook.toml", "pyproject.toml",
        f"state/runs/{run}.json", f"state/runs/{run}.series.jsonl", f"state/runs/{run}/step-1.series.jsonl",
        f"state/runs/{run}/step-1.log", f"state/runs/{run}/step-1.metrics.json", f"state/runs/{run}/live.json",
        "state/index/runs.idx", "state/lock", "state/write.lock", "~cache/runbook/index.key",
    ]


def _check(result: subprocess.CompletedProcess, what: str) -> None:
    text = result.stdout + result.stderr
    assert "Traceback" not in text and "internal error" not in text and "did not expect" not in text, (what, text[-2000:])
    assert result.returncode in EXITS, (what, result.returncode, text[-2000:])


def _cases() -> list[tuple[int, str]]:
    return [(i, kind) for i in range(14) for kind in H.SPECIAL_KINDS]


@pytest.mark.parametrize(("index", "kind"), _cases(), ids=lambda v: str(v))
def test_a_special_file_at_any_path_runbook_reads_hangs_no_verb(recorded: tuple[Path, Path], tmp_path: Path,
                                                                counts: H.Counts, index: int, kind: str) -> None:
    source, source_cache = recorded
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    shutil.copytree(source, repo, symlinks=True)
    shutil.copytree(source_cache, cache, symlinks=True)
    target = _targets(repo)[index]
    path = cache / target.removeprefix("~cache/") if target.startswith("~cache/") else repo / target
    H.special_file(path, kind)
    env = {"XDG_CACHE_HOME": str(cache)}
    # the readers; then a writer, picked in turn so that each runs on every path over the kinds
    verbs = [*READERS, WRITERS[(index + len(kind)) % len(WRITERS)]]
    for args in verbs:
        what = f"{target} as a {kind}: runbook {' '.join(args)}"
        try:
            result = H.runbook_inproc(repo, *args, env=env, timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{what} hung for 20 s")
        _check(result, what)
        counts.add("special_file_verbs")
    counts.add("special_file_cases")


# ---- git hooks ----------------------------------------------------------------------------------

# Every client-side hook git knows (githooks(5)); only those git runs for runbook's commits matter.
HOOKS = ["applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
         "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge",
         "pre-push", "pre-auto-gc", "post-rewrite", "reference-transaction", "post-index-change", "fsmonitor-watchman"]


def _hook_repo(path: Path) -> Path:
    repo = H.make_repo(path, PLAN)
    H.git(repo, "config", "gc.auto", "1")  # so `git gc --auto` has work to think about (pre-auto-gc)
    return repo


@pytest.fixture(scope="module")
def fired(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The hooks git runs while runbook commits (record, next), found with logging hooks."""
    repo = _hook_repo(tmp_path_factory.mktemp("hooks") / "repo")
    log = repo.parent / "fired.log"
    for name in HOOKS:
        hook = repo / ".git" / "hooks" / name
        hook.write_text(f"#!/bin/sh\necho {name} >> '{log}'\nexit 0\n")
        hook.chmod(0o755)
    assert H.runbook(repo, "record", "A milestone", "--lesson", "one").returncode == 0
    assert H.runbook(repo, "next", "--yes").returncode == 0
    names = sorted(set(log.read_text().split())) if log.exists() else []
    assert "reference-transaction" in names, names  # update-ref runs it for every commit runbook makes
    return names


def _hook_cases() -> list[tuple[int, str, str]]:
    """(seed, verb, mode) cases; the hook itself is drawn from the fired ones in the test."""
    budget = max(4, H.examples(200) // 25)  # 8 by default
    rng = random.Random(20261203)
    return [(rng.randrange(1 << 30), verb, mode) for verb, mode in
            [(v, m) for v in ("record", "next") for m in ("fail", "hang")] * (budget // 4)]


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "verb", "mode"), _hook_cases())
def test_a_hook_that_fails_or_hangs_leaves_nothing_half_written(fired: list[str], tmp_path: Path, counts: H.Counts,
                                                                seed: int, verb: str, mode: str) -> None:
    name = random.Random(seed).choice(fired)
    repo = _hook_repo(tmp_path / "repo")
    hook = repo / ".git" / "hooks" / name
    body = "sleep 300" if mode == "hang" else "echo 'hook says no' >&2; exit 1"
    hook.write_text(f"#!/bin/sh\n{body}\n")
    hook.chmod(0o755)
    args = ("record", "A milestone", "--lesson", "kept") if verb == "record" else ("next", "--yes")
    started = time.monotonic()
    result = H.runbook(repo, *args, env={"RUNBOOK_GIT_TIMEOUT_S": "2"}, timeout=120)
    took = time.monotonic() - started
    what = f"{name} {mode}s under runbook {verb}"
    H.assert_no_traceback(result, what)
    assert took < 60, (what, took)
    # a hook whose failure git ignores (post-commit, reference-transaction's 'committed' state...) may let it pass
    assert result.returncode in (0, 1, 2), (what, result.returncode, result.stderr)
    if result.returncode != 0:
        assert "git" in result.stderr, (what, result.stderr)
    hook.unlink()
    assert H.runbook(repo, "validate").returncode == 0, what  # plan and notes parse
    # what was written is committed by the next command that can
    again = H.runbook(repo, *args) if verb == "record" else H.runbook(repo, "next", "--yes")
    assert again.returncode == 0, (what, again.stdout + again.stderr)
    assert H.git(repo, "status", "--porcelain", "--", "state", "plans") == "", what
    if verb == "record":
        assert H.git(repo, "show", "HEAD:plans/notes.md").count("kept") >= 1, what
    counts.add("hook_cases")
