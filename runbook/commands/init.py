"""`runbook init`: scaffold a plan, its notes, state/, .gitignore entries and runbook.toml."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click

PLANS_DIR = "plans"
STATE_DIR = "state"
GITIGNORE_ENTRIES = ("state/lock", "state/write.lock", "state/runs/*/")
EXAMPLES = {
    # example -> [(file under templates/examples/<example>/, destination under DIR)]
    "eagle3": [
        ("eagle3-game-plan.md", "plans/eagle3-game-plan.md"),
        ("eagle3-next-steps.md", "plans/eagle3-next-steps.md"),
        ("data/prompts.jsonl", "plans/data/prompts.jsonl"),
        ("data/prompts-heldout.jsonl", "plans/data/prompts-heldout.jsonl"),
    ],
}


def planned_files(example: str | None, title: str) -> dict[str, bytes]:
    """Destination (relative to DIR) -> content, for everything init writes except .gitignore."""
    from runbook.notes import new_notes
    from runbook.templates import read_resource, render

    files: dict[str, bytes] = {}
    if example:
        for source, dest in EXAMPLES[example]:
            files[dest] = read_resource(f"examples/{example}/{source}")
    else:
        files[f"{PLANS_DIR}/game-plan.md"] = render("plan.md.j2", title=title, notes_name="next-steps.md").encode()
        files[f"{PLANS_DIR}/next-steps.md"] = new_notes(title, "game-plan.md").encode()
    files["runbook.toml"] = render("runbook.toml.j2", plans_dir=PLANS_DIR, state_dir=STATE_DIR).encode()
    return files


def gitignore_addition(existing: str) -> str:
    """The text to append to a .gitignore so that it holds GITIGNORE_ENTRIES ("" if it does)."""
    have = {line.strip() for line in existing.splitlines()}
    missing = [entry for entry in GITIGNORE_ENTRIES if entry not in have and f"/{entry}" not in have]
    if not missing:
        return ""
    newline = "\r\n" if "\r\n" in existing else "\n"
    lead = newline if existing and not existing.endswith(("\n", "\r")) else ""
    lead += newline if existing.strip() else ""
    return lead + "# runbook: locks and per-run logs (the run records state/runs/*.json are committed)" + newline + newline.join(missing) + newline


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
def command(directory: Path, example: str | None, title: str) -> None:
    """Scaffold a runbook workspace in DIRECTORY (default: the current directory).

    Writes a plan and its notes document under plans/ (with --example eagle3: the EAGLE-3 game
    plan, its notes and the prompt files it uses), runbook.toml, state/runs/, and the .gitignore
    entries for the locks and logs; runs `git init` when DIRECTORY is not in a git repository.
    Refuses, writing nothing, when any of these files already exists.
    """
    root = directory.resolve()
    files = planned_files(example, title)
    existing = sorted(rel for rel in files if (root / rel).exists())
    if existing:
        raise click.UsageError(
            "refusing to overwrite existing files: "
            + ", ".join(str(root / rel) for rel in existing)
            + ". Move them away, or init another directory."
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
    if inside.returncode != 0:
        result = _git(["init", "-q"], root)
        if result.returncode != 0:
            click.echo(f"warning: git init failed: {result.stderr.strip()}", err=True)
        else:
            created.append(".git (git init)")
    elif Path(inside.stdout.strip()).resolve() != root:
        click.echo(
            f"warning: {root} is inside the git repository {inside.stdout.strip()}; runbook looks for "
            "runbook.toml and state/ at the repository root and runs steps there",
            err=True,
        )
    for rel in created:
        click.echo(f"created {rel}")
    plan = next(rel for rel in files if rel.endswith(".md") and "next-steps" not in rel)
    where = "" if root == Path.cwd().resolve() else f"cd {directory} && "
    click.echo(
        f"\nNext: read {plan}, then\n  {where}git add -A && git commit -m 'runbook init'\n"
        "  runbook validate && runbook next --dry-run"
    )
