"""`runbook --help` and `runbook status` start without torch, transformers, git, matplotlib or the MCP SDK."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "git", "eagle", "speculators", "vllm", "mcp", "mcp_types", "anyio", "matplotlib", "PIL")

PROBE = """
import sys
from runbook.cli import cli
for args in {args!r}:
    try:
        code = cli(args, standalone_mode=False)
    except SystemExit as exc:
        code = exc.code
    print("exit", args, code)
print(sorted(m for m in {heavy!r} if m in sys.modules))
"""


def _probe(args: list[list[str]], cwd: Path) -> list[str]:
    code = PROBE.format(args=args, heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()


PLAN = """---
runbook: 1
vars:
  out: work/out
---

## Phase 0: Probe (~1 min)

Steps:
- [ ] Score: `mkdir -p {out} && echo '{"score": 3}' > "$RUNBOOK_METRICS"`

Pass: score >= 2
"""


def test_help_and_status_import_nothing_heavy(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "probe.md").write_text(PLAN)
    out = _probe([["--help"], ["status"], ["status", "--json"], ["show"], ["validate"], ["mcp", "--help"],
                  ["plot", "--help"], ["diff", "--help"], ["history", "--metric", "score"]], tmp_path)
    assert out[-1] == "[]", out
    # each verb ran to the end: the group returns the exit code it maps every outcome to
    exits = [line for line in out if line.startswith("exit ")]
    assert exits == [
        "exit ['--help'] 0",
        "exit ['status'] 0",
        "exit ['status', '--json'] 0",
        "exit ['show'] 0",
        "exit ['validate'] 0",
        "exit ['mcp', '--help'] 0",
        "exit ['plot', '--help'] 0",
        "exit ['diff', '--help'] 0",
        "exit ['history', '--metric', 'score'] 0",
    ], out
    assert any('"command": "status"' in line for line in out)  # the JSON envelope was printed
    assert any("Phase 0: Probe" in line for line in out)  # show printed the phase


def test_repo_plans_import_nothing_heavy() -> None:
    out = _probe([["validate"]], REPO)
    assert out[-1] == "[]", out
