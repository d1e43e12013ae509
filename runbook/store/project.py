"""Where things are: the repository root, `runbook.toml` / `[tool.runbook]`, plans, `state/`.

- The root is the git top level of a path, found by walking up to the first directory holding
  `.git` (a directory, or a file in worktrees and submodules). Outside git, the nearest directory
  holding `runbook.toml`, else the starting directory itself.
- Config comes from `<root>/runbook.toml`, else `[tool.runbook]` in `<root>/pyproject.toml`, else
  defaults: `plans = ["plans/*.md"]`, `state = "state"`, `runbook_bin = "append"` (where steps find
  runbook's interpreter directory on PATH: "append", "prepend" or "off"). Paths are relative to
  the root.
- Discovered plans are the files the `plans` globs match that start with front matter holding
  `runbook:` (a notes document beside the plan is not a plan).

No `git` import here: `runbook status` must start fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Config", "ConfigError", "discover_plans", "find_repo_root", "load_config", "state_dir"]

CONFIG_FILE = "runbook.toml"
DEFAULT_PLANS = ["plans/*.md"]
DEFAULT_STATE = "state"


class ConfigError(Exception):
    """`runbook.toml` or `[tool.runbook]` cannot be used; the message names the file and the fix."""


class SlurmConfig(BaseModel):
    """`[slurm]` in runbook.toml: defaults of phases with `Executor: slurm` (docs/next.md)."""

    model_config = ConfigDict(extra="forbid")

    resources: str = ""  # `Resources:` words every Slurm phase starts from; the phase's own win
    sbatch_args: list[str] = []  # further sbatch options, passed as they are (e.g. "--account=ml")
    poll_s: float = Field(default=10.0, gt=0, le=3600)  # seconds between squeue / scontrol polls


class Config(BaseModel):
    model_config = ConfigDict(extra="ignore")

    plans: list[str] = list(DEFAULT_PLANS)  # globs, relative to the root
    state: str = DEFAULT_STATE  # relative to the root
    # where the directory of runbook's interpreter (and `eagle` beside it) goes on steps' PATH:
    # "append" (added at the end only when PATH lacks it; the user's PATH order is kept),
    # "prepend" (runbook's wins), "off" (PATH as the user has it)
    runbook_bin: Literal["append", "prepend", "off"] = "append"
    slurm: SlurmConfig = SlurmConfig()
    # a folder (relative to the root; gitignore it) where each judged run's `Outputs:` are copied,
    # `<folder>/<run-id>/<path>`, so that `runbook choose RUN` puts RUN's outputs back; None: not kept
    keep_outputs: str | None = None
    # commit runs on this branch instead of the checked-out one (`{branch}`: its name), e.g.
    # "runbook/{branch}"; merge it when you choose (runbook/store/gitops.py). None: the current branch
    run_branch: str | None = None
    source: str | None = None

    @field_validator("run_branch")
    @classmethod
    def _branch_name(cls, value: str | None) -> str | None:
        import re

        if value is not None and (not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/{}-]*", value) or ".." in value
                                  or value.endswith((".", "/", ".lock")) or "//" in value):
            raise ValueError(f"run_branch: {value!r} is not a branch name git takes (e.g. \"runbook/{{branch}}\")")
        return value

    @field_validator("keep_outputs")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        from runbook.plan.outputs import check_path

        problem = check_path(value) if value is not None else None
        if problem:
            raise ValueError(f"keep_outputs: {problem}; give a folder relative to the repository root")
        return value.rstrip("/") if value else value  # the file the config came from; None for defaults


def find_repo_root(path: str | os.PathLike[str] | None = None) -> Path:
    """The git top level containing `path` (default: the current directory)."""
    start = Path(path if path is not None else os.getcwd()).resolve()
    if start.is_file() or not start.exists():
        start = start.parent
    for directory in (start, *start.parents):
        if (directory / ".git").exists():
            return directory
    for directory in (start, *start.parents):
        if (directory / CONFIG_FILE).is_file():
            return directory
    return start


def load_config(root: str | os.PathLike[str]) -> Config:
    """Read `runbook.toml` or `[tool.runbook]`; raise `ConfigError` on a broken file."""
    root = Path(root)
    own = root / CONFIG_FILE
    if own.is_file():
        return _config_from(own, _read_toml(own))
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = _read_toml(pyproject)
        except ConfigError:
            return Config()  # a broken pyproject.toml is not ours to judge
        section = data.get("tool", {}).get("runbook")
        if isinstance(section, dict):
            return _config_from(pyproject, section, prefix="[tool.runbook] ")
    return Config()


CONFIG_MAX_BYTES = 4 * 1024 * 1024


def _read_toml(path: Path) -> dict[str, Any]:
    from runbook.files import NotReadable, read_bounded

    try:
        return tomllib.loads(read_bounded(path, CONFIG_MAX_BYTES).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except NotReadable as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    except ValueError as exc:  # TOMLDecodeError, and int() refusing a number of thousands of digits
        raise ConfigError(f"{path}: not valid TOML: {str(exc)[:200]}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None


def _config_from(path: Path, data: dict[str, Any], prefix: str = "") -> Config:
    plans = data.get("plans", DEFAULT_PLANS)
    if isinstance(plans, str):
        data = {**data, "plans": [plans]}
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        expected = ('[slurm] resources = "time=2:00:00", sbatch_args = ["--account=ml"], poll_s = 10'
                    if where.startswith("slurm")
                    else 'plans = ["plans/*.md"], state = "state", runbook_bin = "append" | "prepend" | "off"')
        raise ConfigError(f"{path}: {prefix}{where}: {first['msg']} (expected {expected})") from None
    if config.slurm.resources:
        from runbook.plan.resources import ResourcesError, parse_resources

        try:
            parse_resources(config.slurm.resources)
        except ResourcesError as exc:
            raise ConfigError(f"{path}: {prefix}slurm.resources: {exc}") from None
    config.source = str(path)
    return config


def discover_plans(root: str | os.PathLike[str]) -> list[Path]:
    """Plan files under `root` matched by the config's globs and carrying `runbook:` front matter."""
    from runbook.plan.parse import is_plan_text

    root = Path(root)
    config = load_config(root)
    found: list[Path] = []
    seen: set[Path] = set()
    for pattern in config.plans:
        for path in sorted(root.glob(pattern)):
            if path in seen or not path.is_file():
                continue
            seen.add(path)
            if is_plan_text(_head(path)):
                found.append(path)
    return found


def _head(path: Path, size: int = 8192) -> str:
    try:
        with path.open("rb") as handle:
            return handle.read(size).decode("utf-8", errors="replace")
    except OSError:
        return ""


def state_dir(root: str | os.PathLike[str]) -> Path:
    """The ledger directory (`state/` unless the config says otherwise); it must lie inside `root`."""
    config = load_config(root)
    path = Path(root) / config.state
    if not path.resolve().is_relative_to(Path(root).resolve()):
        if config.source is None:  # the default `state`, a link out of the repository
            raise ConfigError(
                f"{config.state}: the state directory is a link to {path.resolve()}, outside the repository "
                f"{root}; the ledger is committed with the plan, so it must live inside it: replace the link "
                "with a real directory"
            )
        raise ConfigError(
            f"{config.source}: state = {config.state!r} points outside the repository {root}; "
            "the ledger is committed with the plan, so it must live inside it (e.g. state = \"state\")"
        )
    return path
