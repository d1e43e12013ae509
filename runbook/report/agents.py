"""What an agent needs to find its way in: the AGENTS.md section `runbook init` writes, and the
configuration an agent host needs to start `runbook mcp` (runbook/mcp_server.py).

Light: no MCP SDK here, so `runbook init` does not load it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook.plan.mdtext import detect_newline, ends_with_newline

AGENTS_FILE = "AGENTS.md"
MARK = "runbook brief"  # an AGENTS.md that mentions it already tells agents about runbook


def client_config(root: str | Path | None = None, command: list[str] | None = None) -> dict[str, Any]:
    """The `mcpServers` entry (Claude Code's .mcp.json, Claude Desktop, Cursor, ...) that starts
    `runbook mcp` for the workspace at `root` (None: the directory the host starts it in)."""
    argv = command or ["runbook"]
    args = [*argv[1:], "mcp"] + (["--root", str(root)] if root is not None else [])
    return {"mcpServers": {"runbook": {"command": argv[0], "args": args}}}


def agents_section(plan: str, notes: str | None, config: dict[str, Any], *, heading: bool) -> str:
    """The AGENTS.md text about runbook (with a title when it starts a new file); `config` is the
    `mcpServers` entry it shows, the one `runbook init` prints (`client_config`)."""
    import json

    from runbook.report.templates import render

    return render("agents.md.j2", plan=plan, notes=notes, config=json.dumps(config, indent=2), heading=heading)


def agents_addition(existing: str | None, plan: str, notes: str | None, config: dict[str, Any]) -> str:
    """What to write into AGENTS.md: the whole file when there is none, the runbook section appended
    when it does not mention runbook yet, nothing ("") when it does."""
    if existing is None:
        return agents_section(plan, notes, config, heading=True)
    if MARK in existing:
        return ""
    newline = detect_newline(existing)
    lead = "" if not existing.strip() else (newline if ends_with_newline(existing) else newline * 2)
    return lead + agents_section(plan, notes, config, heading=False).replace("\n", newline)
