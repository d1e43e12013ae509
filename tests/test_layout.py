"""The repository is laid out as it says: docs/architecture.md names every module, the benchmark
scripts import the packages like any program, and the repository root is a runbook workspace whose
own plans validate there."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from runbook.cli import COMMANDS
from runbook.commands.init import PLANS_DIR, STATE_DIR, gitignore_addition
from runbook.templates import render

REPO = Path(__file__).resolve().parents[1]
RUNBOOK = [sys.executable, "-c", "from runbook.cli import main; main()"]


def _table_modules(title: str) -> set[str]:
    """The `name.py` modules named in the first column of the table under `## title`."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = doc.index(f"## {title}")
    end = doc.find("\n## ", start + 1)
    section = doc[start : end if end > 0 else None]
    named: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            named |= set(re.findall(r"`([a-z_0-9]+\.py)`", line.split("|")[1]))
    return named


def _modules(package: str) -> set[str]:
    return {p.name for p in (REPO / package).glob("*.py") if p.name != "__init__.py"}


def test_the_architecture_doc_names_every_module_and_no_other() -> None:
    for package, title in (("runbook", "runbook modules"), ("eagle", "eagle modules")):
        named, present = _table_modules(title), _modules(package)
        assert present - named == set(), f"{package}/ modules missing from docs/architecture.md"
        assert named - present == set(), f"docs/architecture.md names {package}/ modules that do not exist"


def test_every_verb_module_is_where_the_doc_says() -> None:
    """`runbook VERB` -> runbook/commands/VERB.py, and every module there is a verb's."""
    from eagle.cli import COMMANDS as EAGLE_COMMANDS

    verbs = {module.rsplit(".", 1)[1] for module, _help in COMMANDS.values()}
    files = {p.stem for p in (REPO / "runbook" / "commands").glob("*.py") if not p.stem.startswith("_")}
    assert files == verbs
    assert all((REPO / (module.replace(".", "/") + ".py")).is_file() for module, _help in EAGLE_COMMANDS.values())


def test_bench_scripts_import_the_packages_like_any_program() -> None:
    scripts = sorted(p.stem for p in (REPO / "bench").glob("*.py") if p.stem != "__init__")
    for name in scripts:
        assert "sys.path" not in (REPO / "bench" / f"{name}.py").read_text(encoding="utf-8"), name
    readme = (REPO / "bench" / "README.md").read_text(encoding="utf-8")
    assert [n for n in scripts if f"`{n}`" not in readme] == [], "bench/README.md says what each script measures"
    code = f"import importlib\nfor n in {scripts!r}:\n    importlib.import_module('bench.' + n)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_repository_root_is_a_runbook_workspace() -> None:
    """runbook.toml, state/ and the .gitignore entries are what `runbook init` writes, and every
    plan under plans/ validates and has a status there."""
    assert (REPO / "runbook.toml").read_text(encoding="utf-8") == render(
        "runbook.toml.j2", plans_dir=PLANS_DIR, state_dir=STATE_DIR)
    assert (REPO / STATE_DIR / "runs").is_dir()
    assert gitignore_addition((REPO / ".gitignore").read_text(encoding="utf-8")) == ""
    plans = sorted(p for p in (REPO / PLANS_DIR).glob("*.md") if p.read_text(encoding="utf-8").startswith("---\nrunbook: 1"))
    assert {p.name for p in plans} >= {"eagle3-game-plan.md", "example.md"}
    done = subprocess.run([*RUNBOOK, "validate", "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = json.loads(done.stdout)["result"]
    assert checked["valid"] and sorted(p["plan"] for p in checked["plans"]) == [p.relative_to(REPO).as_posix() for p in plans]
    for plan in plans:
        rel = plan.relative_to(REPO).as_posix()
        status = subprocess.run([*RUNBOOK, "status", "--plan", rel, "--json"], cwd=REPO, capture_output=True,
                                text=True, timeout=120)
        assert status.returncode == 0, status.stdout + status.stderr
        assert json.loads(status.stdout)["result"]["plan"] == rel


def test_the_example_plan_has_one_source_and_the_package_ships_its_bytes(tmp_path: Path) -> None:
    """plans/ holds the EAGLE-3 example; templates/examples/eagle3/ (what `runbook init --example
    eagle3` copies, installed as runbook_templates) links to it, and a built wheel carries the bytes."""
    import shutil
    import zipfile

    from runbook.commands.init import EXAMPLES

    shipped = REPO / "templates" / "examples" / "eagle3"
    for source, dest in EXAMPLES["eagle3"]:
        assert (shipped / source).is_symlink(), f"templates/examples/eagle3/{source} must link to {dest}"
        assert (shipped / source).resolve() == (REPO / dest).resolve()
    tree = tmp_path / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    for name in ("runbook", "eagle", "templates", "plans"):
        shutil.copytree(REPO / name, tree / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                           str(tmp_path / "dist"), str(tree)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for source, dest in EXAMPLES["eagle3"]:
            assert archive.read(f"runbook_templates/examples/eagle3/{source}") == (REPO / dest).read_bytes(), source
