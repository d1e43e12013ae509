"""`runbook init`: scaffold a plan, its notes, state/, .gitignore entries and runbook.toml."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import click

from runbook.commands._options import json_option
from runbook.commands._output import Output
from runbook.contract import InitResult
from runbook.entry import runbook_argv
from runbook.errors import RunbookError, warning
from runbook.plan.mdtext import detect_newline, ends_with_newline
from runbook.report.agents import AGENTS_FILE, agents_addition, client_config

PLANS_DIR = "plans"
STATE_DIR = "state"
# work/ is where the starter plan's steps write (its `out` var): outputs, not records
GITIGNORE_ENTRIES = ("state/lock", "state/index/", "state/write.lock", "state/runs/*/", "work/")
_PLAIN_YAML = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.,()/+-]*$")


def yaml_string(text: str) -> str:
    """`text` as a YAML scalar that reads back as exactly that string ("A: B" is quoted)."""
    if _PLAIN_YAML.match(text) and not text.endswith(" ") and text.lower() not in (
        "yes", "no", "true", "false", "on", "off", "null", "y", "n",
    ) and not re.match(r"^[-+.0-9][0-9._eE+-]*$", text):
        return text
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar
EXAMPLES = {
    # example -> [(file under templates/examples/<example>/, destination under DIR)]; the eagle3 files
    # there are links to this repository's plans/ (one source), and the package ships their bytes
    "eagle3": [
        ("eagle3-game-plan.md", "plans/eagle3-game-plan.md"),
        ("eagle3-next-steps.md", "plans/eagle3-next-steps.md"),
        ("data/prompts.jsonl", "plans/data/prompts.jsonl"),
        ("data/prompts-heldout.jsonl", "plans/data/prompts-heldout.jsonl"),
    ],
}


# example -> runbook.toml's keep_outputs (under work/, which init gitignores): a plan whose sweep's pick
# must put the chosen trial's `Outputs:` back in place
EXAMPLE_KEEP_OUTPUTS = {"eagle3": "work/kept"}


def planned_files(example: str | None, title: str) -> dict[str, bytes]:
    """Destination (relative to DIR) -> content, for everything init writes except .gitignore."""
    from runbook.report.notes import new_notes
    from runbook.report.templates import read_resource, render

    files: dict[str, bytes] = {}
    if example:
        for source, dest in EXAMPLES[example]:
            files[dest] = read_resource(f"examples/{example}/{source}")
    else:
        files[f"{PLANS_DIR}/game-plan.md"] = render(
            "plan.md.j2", title=yaml_string(title), heading=" ".join(title.split()), notes_name="next-steps.md"
        ).encode()
        files[f"{PLANS_DIR}/next-steps.md"] = new_notes(title, "game-plan.md").encode()
    files["runbook.toml"] = render("runbook.toml.j2", plans_dir=PLANS_DIR, state_dir=STATE_DIR,
                                   keep_outputs=EXAMPLE_KEEP_OUTPUTS.get(example or "")).encode()
    return files


def gitignore_addition(existing: str) -> str:
    """The text to append to a .gitignore so that it holds GITIGNORE_ENTRIES ("" if it does)."""
    have = {line.strip() for line in existing.splitlines()}
    missing = [entry for entry in GITIGNORE_ENTRIES if entry not in have and f"/{entry}" not in have]
    if not missing:
        return ""
    newline = detect_newline(existing)
    lead = newline if existing and not ends_with_newline(existing) else ""
    lead += newline if existing.strip() else ""
    return (lead + "# runbook: locks, the ledger's index, per-run logs (the run records state/runs/*.json are "
            "committed) and the steps' outputs" + newline + newline.join(missing) + newline)


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)


@click.command(
    "init",
    epilog="""\b
Examples:
  runbook init                      # a two-phase starter plan in ./plans
  runbook init work/drafter --example eagle3
\b
Exit codes: 0 created, 2 a file already exists (nothing is written) or bad usage.""",
)
@click.argument("directory", required=False, default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--example", type=click.Choice(sorted(EXAMPLES)), help="Start from a worked example instead of the starter plan.")
@click.option("--title", default="My project", show_default=True, help="Title of the starter plan (ignored with --example).")
@json_option
def command(directory: Path, example: str | None, title: str, as_json: bool) -> Output:
    """Scaffold a runbook workspace in DIRECTORY (default: the current directory).

    Writes a plan and its notes document under plans/ (with --example eagle3: the EAGLE-3 game
    plan, its notes and the prompt files it uses), runbook.toml, state/runs/, the .gitignore
    entries for the locks and logs, and AGENTS.md (how an agent starts: `runbook brief`; an
    existing AGENTS.md gets the runbook section appended); runs `git init` when DIRECTORY is not
    in a git repository; prints the MCP client configuration for `runbook mcp`. Refuses, writing
    nothing, when the plan, its notes or runbook.toml already exists.
    """
    root = directory.resolve()
    if not title.strip() or "\n" in title or "\r" in title:
        raise RunbookError(f"--title {title!r}: give a one-line, non-empty title", "usage")
    files = planned_files(example, title)
    existing = sorted(rel for rel in files if (root / rel).exists())
    if existing:
        raise RunbookError(
            "refusing to overwrite existing files: "
            + ", ".join(str(root / rel) for rel in existing)
            + ". Move them away, or init another directory.",
            "usage",
            file=str(root / existing[0]),
        )
    root.mkdir(parents=True, exist_ok=True)
    created: list[str] = []
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as handle:  # "x": never replace a file that appeared meanwhile
            handle.write(data)
        created.append(rel)
    keep = root / STATE_DIR / "runs" / ".gitkeep"
    if not keep.parent.exists():
        keep.parent.mkdir(parents=True)
        keep.touch()
        created.append(f"{STATE_DIR}/runs/.gitkeep")
    gitignore = root / ".gitignore"
    old = gitignore.read_text(encoding="utf-8") if gitignore.exists() else ""
    addition = gitignore_addition(old)
    if addition:
        with open(gitignore, "a", encoding="utf-8", newline="") as handle:
            handle.write(addition)
        created.append(".gitignore" + (" (entries added)" if old else ""))

    inside = _git(["rev-parse", "--show-toplevel"], root)
    git_init = False
    if inside.returncode != 0:
        result = _git(["init", "-q"], root)
        if result.returncode != 0:
            warning(f"git init failed: {result.stderr.strip()}")
        else:
            created.append(".git (git init)")
            git_init = True
    elif Path(inside.stdout.strip()).resolve() != root:
        warning(f"{root} is inside the git repository {inside.stdout.strip()}; runbook looks for "
                "runbook.toml and state/ at the repository root and runs steps there")
    plan = next(rel for rel in files if rel.endswith(".md") and "next-steps" not in rel)
    notes = next((rel for rel in files if "next-steps" in rel), None)
    config = client_config(root, runbook_argv())  # what AGENTS.md shows and what is printed: one entry
    created += _write_agents_md(root, plan, notes, config)
    where = "" if root == Path.cwd().resolve() else f"cd {directory} && "
    text = "\n".join(f"created {rel}" for rel in created) + (
        f"\n\nNext: read {plan}, then\n  {where}git add -A && git commit -m 'runbook init'\n"
        "  runbook validate && runbook next --dry-run"
        "\n\nAgents: AGENTS.md says where to start. To let an agent host drive the plan through MCP tools,\n"
        "add this to its MCP servers (Claude Code: .mcp.json; Claude Desktop, Cursor: their mcpServers file):\n"
        + json.dumps(config, indent=2)
    )
    outcome = InitResult(root=str(root), created=[rel.split(" (")[0] for rel in created], plan=plan, notes=notes,
                        git_init=git_init, mcp_config=config)
    return Output(outcome, 0, text)


def _write_agents_md(root: Path, plan: str, notes: str | None, config: dict[str, Any]) -> list[str]:
    """AGENTS.md: written when there is none, the runbook section appended when it does not tell
    agents about runbook yet, left alone when it does. Returns what to list as created."""
    path = root / AGENTS_FILE
    old = path.read_text(encoding="utf-8") if path.is_file() else None
    addition = agents_addition(old, plan, notes, config)
    if not addition:
        return []
    with open(path, "a" if old is not None else "x", encoding="utf-8", newline="") as handle:
        handle.write(addition)
    return [AGENTS_FILE + (" (runbook section added)" if old is not None else "")]
