"""Shared pieces of the reliability suite (tests/test_fuzz_parse.py ... test_eagle_bad_inputs.py).

- `Counts`: how many inputs were fuzzed, kills survived, concurrent runs made. Every test adds to a
  JSON file (under the pytest session's base temp dir, and also to $RUNBOOK_RELIABILITY_COUNTS
  when set) and prints the running total, so docs/reliability.md quotes figures from a real run.
- `examples(n)`: the hypothesis example budget, scaled by $RUNBOOK_FUZZ_EXAMPLES.
- `make_repo`, `git`, `runbook`: real git repositories in temp dirs and the real console script.

Load it with `load_helpers()` (tests run with --import-mode=importlib, so `tests` is no package).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RUNBOOK = [str(BIN / "runbook")] if (BIN / "runbook").exists() else [sys.executable, "-m", "runbook.cli"]
EAGLE = [str(BIN / "eagle")] if (BIN / "eagle").exists() else [sys.executable, "-m", "eagle.cli"]

DEFAULT_FUZZ_EXAMPLES = 200


def examples(default: int) -> int:
    """Hypothesis max_examples: `default`, scaled so that RUNBOOK_FUZZ_EXAMPLES=N gives the
    biggest fuzzing test N examples (and the others proportionally)."""
    raw = os.environ.get("RUNBOOK_FUZZ_EXAMPLES")
    if not raw:
        return default
    try:
        wanted = int(raw)
    except ValueError:
        return default
    return max(1, default * wanted // DEFAULT_FUZZ_EXAMPLES)


def kill_rounds(default: int) -> int:
    """How many kill -9 rounds per crash test: RUNBOOK_KILL_ROUNDS overrides."""
    raw = os.environ.get("RUNBOOK_KILL_ROUNDS")
    return int(raw) if raw and raw.isdigit() else default


class Counts:
    """Add-only counters in a JSON file, safe across processes (flock)."""

    def __init__(self, path: Path) -> None:
        self.paths = [path]
        extra = os.environ.get("RUNBOOK_RELIABILITY_COUNTS")
        if extra:
            self.paths.append(Path(extra))

    def add(self, key: str, n: int = 1) -> int:
        total = 0
        for path in self.paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a+", encoding="utf-8") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                handle.seek(0)
                raw = handle.read()
                try:
                    data = json.loads(raw) if raw.strip() else {}
                except json.JSONDecodeError:
                    data = {}
                data[key] = data.get(key, 0) + n
                handle.seek(0)
                handle.truncate()
                handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
                total = max(total, data[key])
        return total

    def report(self, key: str, n: int) -> None:
        total = self.add(key, n)
        print(f"reliability count: {key} +{n} (total {total}) -> {self.paths[-1]}")


@pytest.fixture(scope="session")
def counts(tmp_path_factory: pytest.TempPathFactory) -> Counts:
    return Counts(tmp_path_factory.getbasetemp() / "reliability-counts.json")


# ---- git repos and the real CLI ----------------------------------------------------------------


def git(repo: Path, *args: str, check: bool = True) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=check, capture_output=True, text=True).stdout


def make_repo(path: Path, plan: str, notes: str | None = None, plan_name: str = "plan.md") -> Path:
    """A git repo at `path` with plans/<plan_name> (and plans/notes.md), committed."""
    (path / "plans").mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", "Tester")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "commit.gpgsign", "false")
    (path / ".gitignore").write_text("state/lock\nstate/write.lock\nstate/runs/*/\n")
    (path / "plans" / plan_name).write_text(plan)
    if notes is not None:
        (path / "plans" / "notes.md").write_text(notes)
    git(path, "add", ".")
    git(path, "commit", "-qm", "init")
    return path


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "RUNBOOK_ENV_PROBE": "0", "GIT_TERMINAL_PROMPT": "0"}
    env.pop("RUNBOOK_RELIABILITY_COUNTS", None)
    env.update(extra or {})
    return env


def runbook(repo: Path, *args: str, timeout: float = 120, env: dict[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RUNBOOK, *args], cwd=repo, capture_output=True, text=True, env=cli_env(env), timeout=timeout,
        input=input, stdin=None if input is not None else subprocess.DEVNULL,
    )


def popen_runbook(repo: Path, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [*RUNBOOK, *args], cwd=repo, env=cli_env(env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )


def assert_no_traceback(result: subprocess.CompletedProcess | tuple[str, str], what: str = "") -> None:
    out, err = (result.stdout, result.stderr) if not isinstance(result, tuple) else result
    for stream in (out or "", err or ""):
        assert "Traceback (most recent call last)" not in stream, f"{what}: traceback:\n{stream[-3000:]}"


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` (relative path -> bytes); .git is included."""
    snap: dict[str, bytes] = {}
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                snap[path.relative_to(root).as_posix()] = path.read_bytes()
    return snap


def committed_runs(repo: Path) -> dict[str, dict]:
    """run id -> the run JSON as committed at HEAD (state/runs/*.json)."""
    out = git(repo, "ls-tree", "-r", "--name-only", "HEAD", "--", "state/runs", check=False)
    runs: dict[str, dict] = {}
    for name in out.split():
        if name.endswith(".json"):
            data = json.loads(git(repo, "show", f"HEAD:{name}"))
            runs[data["run_id"]] = data
    return runs
