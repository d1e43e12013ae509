"""`python -m runbook`, `python -m runbook.cli` and the `runbook` console script are one command line:
the same output and exit code on a real repository (cli.py run as `__main__` once printed nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cli_env, make_repo

RUNBOOK = Path(sys.executable).parent / "runbook"
ENTRIES = {
    "console script": [str(RUNBOOK)],
    "python -m runbook": [sys.executable, "-m", "runbook"],
    "python -m runbook.cli": [sys.executable, "-m", "runbook.cli"],
}

PLAN = """---
runbook: 1
title: Entry points
---

# Entry points

## Phase 0: Probe (~1 min)

Steps:
- [ ] Score: `echo '{"score": 3}' > "$RUNBOOK_METRICS"`

Pass: `score >= 2`
"""


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["show", "9"]], ids=" ".join)
def test_every_entry_point_prints_what_the_console_script_prints(tmp_path: Path, args: list[str]) -> None:
    repo = make_repo(tmp_path / "repo", PLAN)
    seen = {name: subprocess.run([*argv, *args], cwd=repo, capture_output=True, text=True, env=cli_env(),
                                 stdin=subprocess.DEVNULL, timeout=60)
            for name, argv in ENTRIES.items()}
    script = seen["console script"]
    assert script.stdout or script.stderr  # it says something: status prints the phase table, show refuses
    if args[0] == "status":
        assert script.returncode == 0 and "phase-0" in script.stdout
    else:
        assert script.returncode == 2 and "no phase '9'" in script.stderr
    for name, result in seen.items():
        assert (result.returncode, result.stdout, result.stderr) == (script.returncode, script.stdout, script.stderr), name
