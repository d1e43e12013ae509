"""What a verb hands back to runbook/cli.py (and the MCP server): `Output`.

Its own module, not the entry module's: `python -m runbook.cli` runs cli.py as `__main__`, and a
class defined there would be a different class from the `runbook.cli.Output` the verbs return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Output"]


@dataclass
class Output:
    """What a verb hands back: its result (printed under --json), exit code and text."""

    result: Any = None  # a pydantic model from runbook/contract.py
    exit_code: int = 0
    text: str | None = None  # printed on stdout without --json (None: the verb printed already)
