"""How this runbook is started again: the console script beside the running interpreter.

Ground floor (imports nothing of runbook): the next action's `argv` (runbook/run/planstate.py), the
MCP entry `runbook init` prints and AGENTS.md shows (runbook/report/agents.py) name the runbook that
is running, by its absolute path, so that a host or agent without its venv on PATH starts the same one.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["runbook_argv", "runbook_executable"]


def runbook_executable() -> str:
    """The absolute path of the `runbook` installed beside this interpreter, else plain "runbook"."""
    script = Path(sys.executable).with_name("runbook")
    return str(script.absolute()) if script.is_file() else "runbook"


def runbook_argv() -> list[str]:
    """The `runbook` installed beside this interpreter, as an argument list (the interpreter running
    runbook.cli when there is no console script)."""
    script = Path(sys.executable).with_name("runbook")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from runbook.cli import main; main()"]
