"""The plan a `record` / `brief` invocation is about, and the paths around it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from runbook.model import Plan


@dataclass
class PlanContext:
    root: Path  # repository root (git top level)
    plan_path: Path  # absolute
    plan_rel: str  # repo-relative, "/" separated: what the ledger records
    plan: Plan
    state: Path  # the state directory
    several: bool  # more than one plan discovered: commands must name the plan

    @property
    def notes_path(self) -> Path | None:
        if not self.plan.notes:
            return None
        return Path(os.path.normpath(self.plan_path.parent / self.plan.notes))

    @property
    def notes_rel(self) -> str | None:
        path = self.notes_path
        return None if path is None else _rel(path, self.root)

    @property
    def plan_arg(self) -> str | None:
        """What to pass as `--plan` in commands we print, None when the plan is the only one."""
        return self.plan_rel if self.several else None


def _rel(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def open_plan(plan_opt: str | None) -> PlanContext:
    """Find the plan (`--plan`, else the only discovered plan) and load it; errors exit 2."""
    from runbook.commands._common import fail, load_checked
    from runbook.project import ConfigError, discover_plans, find_repo_root, state_dir

    plan = load_checked(plan_opt)
    plan_path = Path(plan.path).resolve()
    root = Path(find_repo_root(plan_path)).resolve()
    try:
        found = {Path(p).resolve() for p in discover_plans(root)}
        state = Path(state_dir(root))
    except ConfigError as exc:
        fail(str(exc))
    if plan.notes and not Path(os.path.normpath(plan_path.parent / plan.notes)).resolve().is_relative_to(root):
        fail(
            f"{_rel(plan_path, root)}: `notes: {plan.notes}` points outside the repository {root}; "
            "runbook writes only inside it: name a file relative to the plan, e.g. `notes: notes.md`"
        )
    return PlanContext(
        root=root,
        plan_path=plan_path,
        plan_rel=_rel(plan_path, root),
        plan=plan,
        state=state,
        several=len(found | {plan_path}) > 1,
    )
