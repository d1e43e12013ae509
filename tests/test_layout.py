"""The repository is laid out as it says: imports run down the wings and form no circle
(tests/support/import_rules.py), docs/architecture.md names every module, the benchmark scripts import
the packages like any program and of bench/ only its harness and shapes, and the repository root is a
runbook workspace whose own plans validate there."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import import_rules
import pytest

from runbook.cli import COMMANDS
from runbook.commands.init import PLANS_DIR, STATE_DIR, gitignore_addition
from runbook.report.templates import render

REPO = Path(__file__).resolve().parents[1]
RUNBOOK = [sys.executable, "-c", "from runbook.cli import main; main()"]


def _table_modules(title: str) -> set[str]:
    """The `path/name.py` modules named in the first column of the table under `## title`."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = doc.index(f"## {title}")
    end = doc.find("\n## ", start + 1)
    section = doc[start : end if end > 0 else None]
    named: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            named |= set(re.findall(r"`([a-z_0-9/]+\.py)`", line.split("|")[1]))
    return named


def _modules(package: str) -> set[str]:
    """Every module of `package` as its path inside it (`plan/parse.py`), package __init__ files too
    (`plan/__init__.py`) but not the top one."""
    return {p.relative_to(REPO / package).as_posix() for p in (REPO / package).rglob("*.py")} - {"__init__.py"}


@pytest.mark.parametrize("package", ["runbook", "eagle"])
def test_imports_run_down_the_wings_and_form_no_circle(package: str) -> None:
    """Every import, top-level or inside a function: never up a wing (tests/support/import_rules.py's
    WINGS, the order docs/architecture.md draws), never in a circle."""
    assert import_rules.check(REPO, package) == []


def test_the_import_check_finds_an_upward_import_a_circle_and_an_unplaced_module(tmp_path: Path) -> None:
    """The checker itself: an import inside a function that runs up a wing, a circle of two modules
    of one wing, a relative import, and a module no wing names are each reported; an import under
    `if TYPE_CHECKING:` is not."""
    files = {
        "runbook/__init__.py": "",
        "runbook/plan/__init__.py": "",
        "runbook/plan/a.py": "def f():\n    from runbook.store import b\n",
        "runbook/store/__init__.py": "",
        "runbook/store/b.py": "from . import c\n",
        "runbook/store/c.py": "import runbook.store.b\nfrom typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from runbook.report import d\n",
        "runbook/report/__init__.py": "",
        "runbook/report/d.py": "from runbook.plan.a import f\n",
        "runbook/stray.py": "from runbook.plan import a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert import_rules.check(tmp_path, "runbook") == [
        "runbook.plan.a (line 2, wing plan) imports runbook.store.b (wing store, above it)",
        "runbook.stray: in no wing of tests/support/import_rules.py",
        "import circle: runbook.store.b <-> runbook.store.c",
    ]


def test_the_architecture_doc_names_every_module_and_no_other() -> None:
    for package, title in (("runbook", "runbook modules"), ("eagle", "eagle modules")):
        named, present = _table_modules(title), _modules(package)
        # the verbs' modules (commands/VERB.py) are checked against the CLI's table below
        present = {name for name in present if not name.endswith("__init__.py") and not name.startswith("commands/")}
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


def test_bench_scripts_import_only_the_harness_and_the_shapes() -> None:
    """Every bench script imports of bench/ only bench.harness and bench.shapes (runbook and eagle
    like any program); harness imports no bench module, shapes only harness; no circle."""
    assert import_rules.bench_problems(REPO) == []
    assert {"bench.harness", "bench.shapes"} <= set(import_rules.modules(REPO, "bench"))


def test_the_bench_check_finds_a_script_importing_a_script(tmp_path: Path) -> None:
    """The bench rule itself: a script importing another script (inside a function too), the
    harness importing shapes (a circle with shapes' import of harness) are reported; a script's
    imports of harness and shapes, and `from bench import shapes`, are not."""
    files = {
        "bench/__init__.py": '"""doc"""\n',
        "bench/harness.py": "def f():\n    from bench.shapes import X\n",
        "bench/shapes.py": "from bench.harness import f\nX = 1\n",
        "bench/a.py": "from bench.harness import f\nfrom bench import shapes\n",
        "bench/b.py": "import bench.shapes\ndef g():\n    from bench.a import f\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert import_rules.bench_problems(tmp_path) == [
        "bench.b (line 3, a bench script) imports bench.a",
        "bench.harness (line 2, a bench shared module) imports bench.shapes",
        "import circle: bench.harness <-> bench.shapes",
    ]


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
        shipped_modules = {n for n in archive.namelist() if n.endswith(".py")}
        for package in ("runbook", "eagle"):
            missing = {f"{package}/{m}" for m in _modules(package) | {"__init__.py"}} - shipped_modules
            assert missing == set(), f"the wheel lacks {sorted(missing)}: pyproject's package list"
        for source, dest in EXAMPLES["eagle3"]:
            assert archive.read(f"runbook_templates/examples/eagle3/{source}") == (REPO / dest).read_bytes(), source
