"""Load and render the jinja2 templates shipped in the top-level `templates/` directory.

The directory is installed as the package `runbook_templates` (see pyproject.toml). When that
package cannot be found (a plain checkout on sys.path), the repository's `templates/` is used.
Templates render with `\\n` newlines; callers convert to a document's own newline style.
"""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from runbook.formatting import format_value

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

_REPO_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def templates_root() -> Traversable | Path:
    """The directory holding the templates: the installed package, else the repo's templates/."""
    try:
        root = importlib.resources.files("runbook_templates")
    except ModuleNotFoundError:
        return _REPO_TEMPLATES
    if not root.joinpath("notes.md.j2").is_file():
        return _REPO_TEMPLATES
    return root


def _load(name: str) -> str | None:
    node = templates_root()
    for part in name.split("/"):
        node = node.joinpath(part)
    if not node.is_file():
        return None
    return node.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load),
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["num"] = format_value
    return env


def render(name: str, **context: Any) -> str:
    """Render template `name` (e.g. "brief.md.j2") with `context`."""
    return environment().get_template(name).render(**context)


def read_resource(name: str) -> bytes:
    """Raw bytes of a shipped file, e.g. "examples/eagle3/eagle3-game-plan.md"."""
    node = templates_root()
    for part in name.split("/"):
        node = node.joinpath(part)
    return node.read_bytes()


def resource_exists(name: str) -> bool:
    node = templates_root()
    for part in name.split("/"):
        node = node.joinpath(part)
    return node.is_file()
