"""The workspace a command works in: repository root, config, plan, notes, state dir, git.

`Workspace.open(plan_opt)` is the one way every verb finds its plan: `--plan PATH`, else the only
plan discovered under the repository root (runbook/store/project.py). Every refusal is a `RunbookError`
(no plan, several plans, a broken runbook.toml, notes or state outside the repository, a plan that
does not validate), so the verbs never print or exit on their own.

No `git` import here (status and brief must start fast); git work goes through runbook/store/gitops.py.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from runbook.errors import RunbookError
from runbook.files import half_character, whole_text
from runbook.model import Plan, Problem, RunRecord
from runbook.store.project import Config, ConfigError

if TYPE_CHECKING:
    from runbook.store.index import LedgerIndex, Row
    from runbook.store.live import LiveRun
    from runbook.store.lock import LockInfo

__all__ = ["Workspace", "display_path"]


def display_path(path: str | os.PathLike[str]) -> str:
    """`path` relative to the current directory when it lies below it, for messages."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _rel(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def _config_error(exc: ConfigError) -> RunbookError:
    message = str(exc)
    file = message.split(": ", 1)[0] if ": " in message else None
    return RunbookError(message, "config", file=file)


@dataclass
class Workspace:
    root: Path  # the repository root (git top level), absolute
    config: Config
    state: Path  # the state directory (run ledger, locks)
    git: bool  # the root is a git work tree
    plan_path: Path | None = None  # absolute; None for verbs that need no plan
    several: bool = False  # more than one plan discovered: printed commands must name the plan
    _plan: Plan | None = field(default=None, repr=False)
    _warnings: list[Problem] = field(default_factory=list, repr=False)
    _ledger: LedgerIndex | None = field(default=None, repr=False)  # once asked for

    # ---- finding it -------------------------------------------------------------------------

    @classmethod
    def at(cls, start: str | os.PathLike[str] | None = None) -> Workspace:
        """The workspace holding `start` (default: the current directory), without a plan."""
        from runbook.store.gitops import git_dir
        from runbook.store.project import find_repo_root, load_config, state_dir

        root = Path(find_repo_root(start)).resolve()
        if half_character(str(root)) is not None:  # every record holds paths under it, in UTF-8
            raise RunbookError(f"the repository's path {whole_text(str(root))} is not UTF-8 text; runbook keeps "
                               "its records in UTF-8: move the repository to a path of UTF-8 characters")
        try:
            config = load_config(root)
            state = Path(state_dir(root))
        except ConfigError as exc:
            raise _config_error(exc) from None
        return cls(root=root, config=config, state=state, git=git_dir(root) is not None)

    @classmethod
    def open(cls, plan_opt: str | None = None) -> Workspace:
        """The workspace of `--plan PATH`, else of the only plan discovered from the current directory."""
        from runbook.store.project import discover_plans

        if plan_opt:
            path = Path(plan_opt)
            if not path.is_file():
                what = "is a directory, not a plan file" if path.is_dir() else "no such file"
                raise RunbookError(f"{plan_opt}: {what}", "no_plan", file=plan_opt,
                                   hint="name a plan file with --plan PATH, or leave --plan out to use the only plan")
            ws = cls.at(Path(os.path.abspath(path)).parent)  # the plan's own place, not a link's target
            ws.plan_path = path.resolve()
        else:
            ws = cls.at()
            try:
                plans = discover_plans(ws.root)
            except ConfigError as exc:
                raise _config_error(exc) from None
            if not plans:
                globs = ", ".join(ws.config.plans)
                raise RunbookError(
                    f"no plan found: looked for {globs} with `runbook: 1` front matter under "
                    f"{display_path(ws.root) or '.'}",
                    "no_plan",
                    hint="create one with `runbook init`, or name a file with --plan PATH",
                )
            if len(plans) > 1:
                listing = "\n".join(f"  --plan {shlex.quote(display_path(p))}" for p in plans)  # pasted as data
                raise RunbookError(f"several plans found; pick one with --plan:\n{listing}", "several_plans",
                                   hint="pass --plan PATH")
            ws.plan_path = Path(plans[0]).resolve()
        if not ws.plan_path.is_relative_to(ws.root):
            shown = plan_opt or display_path(plans[0])
            raise RunbookError(
                f"{shown} is a link to {ws.plan_path}, outside the repository {ws.root}: runbook writes the plan "
                "and commits it with its ledger, so the plan must live inside",
                "no_plan", file=shown,
                hint="copy the plan into the repository, or run runbook in the repository it lives in",
            )
        try:
            found = {Path(p).resolve() for p in discover_plans(ws.root)}
        except ConfigError as exc:
            raise _config_error(exc) from None
        ws.several = len(found | {ws.plan_path}) > 1
        return ws

    # ---- the plan ---------------------------------------------------------------------------

    @property
    def plan_rel(self) -> str:
        """The plan's repo-relative path, "/" separated: what the ledger records."""
        assert self.plan_path is not None
        return _rel(self.plan_path, self.root)

    @property
    def plan_file(self) -> Path:
        """The plan's absolute path, for verbs opened with a plan (`Workspace.open`)."""
        assert self.plan_path is not None
        return self.plan_path

    @property
    def plan_display(self) -> str:
        """The plan's path as messages print it (relative to the current directory)."""
        assert self.plan_path is not None
        return display_path(self.plan_path)

    @property
    def plan_arg(self) -> str | None:
        """What to pass as `--plan` in commands we print; None when the plan is the only one."""
        return self.plan_rel if self.several else None

    def load_plan(self) -> Plan:
        """Read and validate the plan from disk (again); RunbookError(plan_invalid) listing every error.

        Warnings are kept in `warnings`, with every block edited by hand since runbook wrote it
        (`writeback.hand_edits`): every verb that opens the plan names them, `file:line`."""
        from runbook.plan.parse import read_plan

        assert self.plan_path is not None
        plan, problems = read_plan(self.plan_display)
        errors = [p for p in problems if p.severity == "error"]
        if plan is None or errors:
            listed = errors or problems
            first = listed[0] if listed else None
            raise RunbookError(
                f"{self.plan_display}: fix the problems above, then run `runbook validate {self.plan_display}`; nothing ran",
                "plan_invalid",
                file=first.file if first else self.plan_display,
                line=first.line if first else None,
                col=first.col if first else None,
                problems=errors or problems,
            )
        from runbook.plan.writeback import hand_edits

        self._plan = plan
        self._warnings = sorted([*(p for p in problems if p.severity != "error"), *hand_edits(plan, self.plan_display)],
                                key=lambda p: (p.line, p.col))
        return plan

    @property
    def plan(self) -> Plan:
        """The validated plan (loaded on first use)."""
        return self._plan if self._plan is not None else self.load_plan()

    @property
    def warnings(self) -> list[Problem]:
        return list(self._warnings)

    # ---- notes ------------------------------------------------------------------------------

    @property
    def notes_path(self) -> Path | None:
        """The notes document named by the plan's front matter (relative to the plan), or None."""
        if not self.plan.notes:
            return None
        assert self.plan_path is not None
        return Path(os.path.normpath(self.plan_path.parent / self.plan.notes))

    @property
    def notes_rel(self) -> str | None:
        path = self.notes_path
        return None if path is None else _rel(path, self.root)

    def check_notes_inside(self) -> None:
        """Refuse a `notes:` that points (or links) outside the repository: runbook writes only inside it."""
        path = self.notes_path
        if path is not None and not path.resolve().is_relative_to(self.root):
            raise RunbookError(
                f"{self.plan_rel}: `notes: {self.plan.notes}` points outside the repository {self.root}; "
                "runbook writes only inside it",
                "config",
                file=self.plan_rel,
                hint="name a file relative to the plan, e.g. `notes: notes.md`",
            )

    def read_notes(self, warn: list[str] | None = None) -> str | None:
        """The notes document's text, None when there is none (or it cannot be read: `warn` says why)."""
        path = self.notes_path
        if path is None or not path.is_file():
            return None
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            if warn is not None:
                warn.append(f"{self.notes_rel}: not read ({exc})")
            return None

    # ---- git, ledger, lock ------------------------------------------------------------------

    @property
    def git_dir(self) -> Path | None:
        from runbook.store.gitops import git_dir

        return git_dir(self.root) if self.git else None

    def rel(self, path: Path) -> str:
        return _rel(path, self.root)

    def ledger(self) -> LedgerIndex:
        """The run ledger through its index (runbook/store/index.py), checked against state/runs/
        on first use in this workspace; `ledger_changed()` after writing or removing run records."""
        if self._ledger is None:
            from runbook.store.index import LedgerIndex

            self._ledger = LedgerIndex.open(self.state)
        return self._ledger

    def find_run(self, ref: str, rows: list[Row] | None = None) -> RunRecord:
        """A run of this plan (of the workspace, without a plan; or one of `rows`, from its ledger's
        index) by a run reference: its id, a unique id prefix, `last`, or `last~N` (the N-th run
        before the last; runbook/store/index.py `pick_rows`); RunbookError(unknown_run). Only the run
        found is read from the ledger. Every verb that takes a RUN resolves it here."""
        row = self.find_row(ref, rows)
        found = self.ledger().load([row])
        if not found:  # it changed since the index was checked, a moment ago
            raise RunbookError(f"{ref!r}: {self.rel(self.state)}/runs/{row.name} is no longer a readable run record",
                               "unknown_run", hint="`runbook history` lists the runs")
        return found[0]

    def find_row(self, ref: str, rows: list[Row] | None = None) -> Row:
        """`find_run`'s run as the ledger's index lists it (nothing read)."""
        from runbook.store.index import LAST_REF, pick_rows

        if rows is None:
            rows = self.ledger().rows(self.plan_rel if self.plan_path is not None else None)
        whose = self.plan_rel if self.plan_path is not None else "this workspace"
        matches = pick_rows(rows, ref)
        if len(matches) == 1:
            return matches[0]
        if LAST_REF.fullmatch(ref):
            have = f"only {len(rows)} run(s)" if rows else "no runs"
            raise RunbookError(f"{ref!r}: {whose} has {have} in {self.rel(self.state)}/runs", "unknown_run",
                               hint="run a phase first (`runbook next`), or name a run from `runbook history`")
        known = ", ".join(r.run_id for r in rows[-5:]) or "none"
        what = "matches several runs" if matches else "is not a run"
        raise RunbookError(f"{ref!r} {what} of {whose} (latest: {known})", "unknown_run",
                           hint="`runbook history` lists them")

    def ledger_changed(self) -> None:
        """Run records were written or removed: the next `ledger()` checks state/runs/ again."""
        self._ledger = None

    def runs(self, problems: list[str] | None = None, *, every_plan: bool = False) -> list[RunRecord]:
        """This plan's runs from the ledger, oldest first (every plan's with `every_plan`). Reads
        every record: readers that show less ask `ledger()` for less (`latest_runs`, a page)."""
        ledger = self.ledger()
        if problems is not None:
            problems.extend(ledger.problems)
        plan = None if every_plan or self.plan_path is None else self.plan_rel
        return ledger.runs(plan, problems=problems)[0]

    def latest_runs(self, problems: list[str] | None = None) -> list[RunRecord]:
        """The latest run of each phase of this plan, oldest first: where the plan stands and what
        runs next depend on these alone (runbook/run/select.py). Unreadable ledger files go to `problems`."""
        ledger = self.ledger()
        if problems is not None:
            problems.extend(ledger.problems)
        return ledger.latest_runs(self.plan_rel, problems)

    def lock_info(self) -> LockInfo | None:
        """Who holds the run lock now (None: nobody, or the file is not a lock we can read)."""
        if not os.path.lexists(self.state / "lock"):  # lock.LOCK_NAME; the common case needs no import
            return None
        from runbook.store.lock import LOCK_NAME, LockCorrupt, read_lock

        try:
            return read_lock(self.state / LOCK_NAME)
        except (LockCorrupt, OSError):
            return None

    def live_of(self, run_id: str | None) -> LiveRun | None:
        """The live state of run `run_id` while it runs (runbook/store/live.py), None when it has none."""
        if not run_id:
            return None
        from runbook.store.live import live_path, read_live

        try:
            return read_live(live_path(self.state, run_id))
        except ValueError:
            return None

    def changed_since(self, commit: str | None) -> list[str] | None:
        """Tracked files that differ between `commit` and the work tree, besides runbook's own
        (plans, notes, state/); None when that cannot be told (no git, unknown commit)."""
        if not self.git or not commit:
            return None
        from runbook.store.gitops import changed_files

        changed = changed_files(self.root, commit)
        if changed is None:
            return None
        own = {self.plan_rel}
        if self.plan_path is not None and self.notes_rel:
            own.add(self.notes_rel)
        state = self.rel(self.state).rstrip("/") + "/"
        return [p for p in changed if p not in own and not p.startswith(state)]
