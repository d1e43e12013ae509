"""The house's import rules as data, and the checker tests/test_layout.py runs over the real tree.

Every import counts, at the top of a module or inside a function; only imports under
`if TYPE_CHECKING:` do not (they never run). A package's wings are listed top to bottom: a module
may import its own wing and the wings below it, never one above; and no set of modules may import
each other in a circle, whatever their wings. The benchmark scripts under bench/ have no wings:
each imports only the two modules they share, bench.harness and bench.shapes (BENCH_SHARED), and
those import no script (bench_problems).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# Top to bottom. A prefix ending in "." names a folder (package) and everything in it; otherwise an
# exact module; a folder prefix also names the package itself. The longest prefix that names a module wins.
WINGS: dict[str, list[tuple[str, list[str]]]] = {
    "runbook": [
        ("faces", ["runbook.cli", "runbook.__main__", "runbook.mcp_server", "runbook.mcp_stdio", "runbook.commands."]),
        ("report", ["runbook.report."]),
        ("run", ["runbook.run."]),
        ("store", ["runbook.store."]),
        ("contract", ["runbook.contract"]),
        ("plan", ["runbook.plan."]),
        ("ground", ["runbook.errors", "runbook.model", "runbook.formatting", "runbook.files", "runbook.redact", "runbook.entry",
                    "runbook"]),
    ],
    "eagle": [
        ("faces", ["eagle.cli", "eagle.__main__", "eagle.commands."]),
        ("train", ["eagle.train."]),
        ("decode", ["eagle.decode."]),
        ("data", ["eagle.data."]),
        ("serving", ["eagle.serving."]),
        ("drafter", ["eagle.drafter."]),
        ("ground", ["eagle.target", "eagle.prompts", "eagle.toy", "eagle.distributed", "eagle.metrics",
                    "eagle.fsutil", "eagle.common", "eagle"]),
    ],
}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, package: str) -> dict[str, Path]:
    return {module_name(root, p): p for p in sorted((root / package).rglob("*.py"))}


def imports(root: Path, path: Path, known: set[str]) -> list[Edge]:
    """The imports of `path` that name modules in `known` (a package's own submodule imported by
    its __init__ does not count)."""
    name = module_name(root, path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(child) for child in ast.walk(node)}
    edges: list[Edge] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        found: set[str] = set()
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import a.b.c`: the longest of a.b.c, a.b, a that is a module here
                parts = alias.name.split(".")
                found |= {next((m for m in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if m in known),
                               alias.name)}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known
            found |= submodules or {base}  # `from pkg import mod` imports mod (pkg's __init__ is its doc)
        for target in sorted(found & known - {name}):
            if path.name == "__init__.py" and target.startswith(name + "."):
                continue
            edges.append(Edge(name, target, node.lineno))
    return edges


def wing_of(package: str, module: str) -> int:
    best, best_len = -1, -1
    for index, (_wing, prefixes) in enumerate(WINGS[package]):
        for prefix in prefixes:
            hit = (module.startswith(prefix) or module == prefix[:-1]) if prefix.endswith(".") else module == prefix
            if hit and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def upward(package: str, edges: list[Edge]) -> list[str]:
    """The imports that run against the wing order, and the modules no wing names."""
    problems: list[str] = []
    for edge in edges:
        source, target = wing_of(package, edge.source), wing_of(package, edge.target)
        if source < 0 or target < 0:
            missing = edge.source if source < 0 else edge.target
            problem = f"{missing}: in no wing of tests/support/import_rules.py"
            if problem not in problems:
                problems.append(problem)
        elif target < source:
            names = [wing for wing, _ in WINGS[package]]
            problems.append(f"{edge.source} (line {edge.line}, wing {names[source]}) imports {edge.target} "
                            f"(wing {names[target]}, above it)")
    return problems


def circles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def check(root: Path, package: str) -> list[str]:
    """Every problem of `package` under `root`: imports against the wing order, then circles."""
    mods = modules(root, package)
    edges = [edge for path in mods.values() for edge in imports(root, path, set(mods))]
    return upward(package, edges) + [f"import circle: {' <-> '.join(group)}" for group in circles(edges)]


# What a bench script may import of bench/, and what each shared module may: shapes builds on harness.
BENCH_SHARED: dict[str, set[str]] = {"bench.harness": set(), "bench.shapes": {"bench.harness"}}


def bench_problems(root: Path) -> list[str]:
    """Every import between bench/ modules other than a script's of bench.harness or bench.shapes
    (and shapes' of harness), then circles. Running a script as a child (`python -m bench.NAME`) is
    not an import and is not seen here."""
    mods = modules(root, "bench")
    problems: list[str] = []
    edges: list[Edge] = []
    for path in mods.values():
        for edge in imports(root, path, set(mods)):
            edges.append(edge)
            allowed = BENCH_SHARED.get(edge.source, set(BENCH_SHARED))
            if edge.target not in allowed:
                kind = "shared module" if edge.source in BENCH_SHARED else "script"
                problems.append(f"{edge.source} (line {edge.line}, a bench {kind}) imports {edge.target}")
    return problems + [f"import circle: {' <-> '.join(group)}" for group in circles(edges)]
