"""The sweeps `runbook sweep` started: one JSON file each, `state/sweeps/<sweep-id>.json`, committed.

A sweep's file says what it is (plan, phase, its points in order, how one trial is to be picked) and
is written once, before its first trial runs. Which points are done is never written here: it is
read from the ledger (the trials whose record names the sweep, runbook/model.py `Trial`), so a sweep
killed at any moment, even with -9, continues with the points that have no finished trial yet
(`runbook sweep --resume`, or the same `runbook sweep` command again).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runbook.files import atomic_write_text

__all__ = ["SWEEPS_DIR", "SweepSpec", "find_same", "load_all", "save", "sweep_path"]

SWEEPS_DIR = "sweeps"  # under the state directory


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    sweep_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    plan: str  # repo-relative
    phase: str  # phase id
    points: list[dict[str, str]]  # in the order they run
    pick: str | None = None  # "best:acc", "max:acc", "min:loss"; None: `runbook choose` decides
    jobs: int = 1  # trials at once
    created: str  # ISO 8601 UTC

    def same_as(self, other: SweepSpec) -> bool:
        """The same sweep asked again: same plan, phase and points (`--pick` may be added later)."""
        return (self.plan, self.phase, self.points) == (other.plan, other.phase, other.points)


def sweeps_dir(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / SWEEPS_DIR


def sweep_path(state_dir: str | os.PathLike[str], sweep_id: str) -> Path:
    return sweeps_dir(state_dir) / f"{sweep_id}.json"


def save(state_dir: str | os.PathLike[str], spec: SweepSpec) -> Path:
    path = sweep_path(state_dir, spec.sweep_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, spec.model_dump_json(indent=2) + "\n")
    return path


def load_all(state_dir: str | os.PathLike[str], problems: list[str] | None = None) -> list[SweepSpec]:
    """Every readable sweep file, oldest first; an unreadable one is named in `problems`."""
    found = []
    folder = sweeps_dir(state_dir)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            found.append(SweepSpec.model_validate_json(path.read_bytes()))
        except (OSError, ValueError, ValidationError) as exc:
            if problems is not None:
                problems.append(f"{path}: skipped, not a readable sweep ({str(exc).splitlines()[0]})")
    return sorted(found, key=lambda s: (s.created, s.sweep_id))


def find_same(state_dir: str | os.PathLike[str], spec: SweepSpec) -> list[SweepSpec]:
    """The sweeps already started that are the same as `spec`, oldest first."""
    return [s for s in load_all(state_dir) if s.same_as(spec)]
