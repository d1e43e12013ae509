"""`runbook mcp`: serve the plan to an agent host over the Model Context Protocol (stdio).

Thin: the server is runbook/mcp_server.py, imported only when this command runs, so neither
`runbook --help` nor any other verb loads the MCP SDK.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from runbook.errors import RunbookError


@click.command(
    "mcp",
    epilog="""\b
Add it to an agent host (Claude Code: .mcp.json; Claude Desktop, Cursor: their mcpServers file):
  {"mcpServers": {"runbook": {"command": "runbook", "args": ["mcp", "--root", "/path/to/repo"]}}}
or: claude mcp add runbook -- runbook mcp --root /path/to/repo
\b
Tools (each answers with `runbook VERB --json`'s envelope; refusals are tool errors with the same
code and message): brief, status, show, validate, history, next (a dry run unless `run: true`;
step output streams as progress), record, forget, reset, logs, cancel. Resources: runbook://plan/PATH,
runbook://notes/PATH, runbook://run/latest, runbook://run/{run_id}. One JSON-RPC message a line,
at most 4 MiB (RUNBOOK_MCP_MAX_MESSAGE_MB=N sets another limit). See docs/mcp.md.""",
)
@click.option("--root", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="DIR",
              help="Serve the workspace at DIR (default: the directory the host starts the server in).")
def command(root: Path | None) -> int:
    """Serve the plan's verbs as MCP tools over stdin/stdout until the client disconnects.

    A `next` running when the client disconnects or cancels the call is interrupted and recorded
    as `interrupted`, exactly as `runbook next` is when its terminal goes away.
    """
    if importlib.util.find_spec("mcp") is None:
        raise RunbookError("runbook mcp needs the MCP SDK, which is not installed", "usage",
                           hint="pip install 'runbook-eagle[mcp]' (or: pip install mcp==2.3.0)")
    from runbook.mcp_server import serve

    serve(str(root) if root else None)
    return 0
