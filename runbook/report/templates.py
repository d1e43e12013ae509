"""Load and render the jinja2 templates shipped in the top-level `templates/` directory.

The directory is installed as the package `runbook_templates` (see pyproject.toml). A checkout's
own `templates/` beside the `runbook` package comes first (a checkout on sys.path renders with its
own templates even when another checkout's are installed); otherwise the installed package.
Templates render with `\\n` newlines; callers convert to a document's own newline style.

Compiled templates are kept between runs in `$XDG_CACHE_HOME/runbook/templates` (jinja2's bytecode
cache, checked against each template's source), so `runbook brief` does not compile its
templates on every call; a cache that cannot be read or written is simply not used.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.resources
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from runbook.formatting import format_value

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

_REPO_TEMPLATES = Path(__file__).resolve().parents[2] / "templates"  # runbook/report/ -> the checkout


def templates_root() -> Traversable | Path:
    """The directory holding the templates: the checkout's templates/ beside this package, else the
    installed package."""
    if (_REPO_TEMPLATES / "notes.md.j2").is_file() and (_REPO_TEMPLATES / "brief-next.md.j2").is_file():
        return _REPO_TEMPLATES
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


class _Compiled(jinja2.FileSystemBytecodeCache):
    """jinja2's bytecode cache that never fails a render: an unreadable or unwritable entry is skipped."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # noqa: BLE001 - a damaged entry: compile the template again
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def _compiled_cache() -> _Compiled | None:
    try:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = Path(base) / "runbook" / "templates"
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # no home, a read-only one
        return None
    return _Compiled(str(folder))


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load),
        bytecode_cache=_compiled_cache(),
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
