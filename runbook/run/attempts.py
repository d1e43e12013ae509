"""Attempts of a phase: how many of its runs in a row ended the same failure, and whether a
third would only repeat it. Pure but for `for_workspace`, which reads the ledger's index and git.

A run "ends the same failure" as another when both ended `error`, `timeout` or `inconclusive`
(`interrupted` is a person's or a machine's doing, not the phase's) and `failure_key` gives the
same: the verdict, where it stopped (the step that failed and its exit code; for a timeout the
step that was running; for inconclusive the metrics the steps wrote), the phase's text (its hash,
blocks and checkboxes aside), the commands as run (vars resolved), every var's value and which
were `--set`, and the `Pass:`. Skipped steps do not count: a resume that stops where the run it
resumed stopped is the same failure.

`repeated`: the phase's last two runs ended the same failure and no tracked file outside the plan,
its notes and `state/` changed since the first of them (git diff against the commit it ran on,
uncommitted changes included). Then `runbook next` does not offer a third identical run
(runbook/run/select.py: outcome `repeated`); `runbook next --phase ID --yes` still runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runbook.model import RunRecord

if TYPE_CHECKING:
    from runbook.store.workspace import Workspace

__all__ = ["REPEATABLE", "Attempts", "AttemptsOf", "attempts", "failure_key", "for_workspace", "from_runs",
           "with_other_values"]

REPEATABLE = frozenset({"error", "timeout", "inconclusive"})
_LOOK_BACK = 20  # runs of a phase read, at most, to count a streak


@dataclass(frozen=True)
class Attempts:
    """The runs of a phase in a row, latest last, that ended the way its latest did."""

    runs: tuple[RunRecord, ...] = ()
    repeated: bool = False  # the last two are the same failure and nothing changed since the first
    unknown: bool = False  # no git: runbook cannot tell whether files changed

    @property
    def count(self) -> int:
        return len(self.runs)


# the latest run of a phase -> its Attempts (select.py asks it before offering a resume or rerun)
AttemptsOf = Callable[[RunRecord], Attempts]


def failure_key(run: RunRecord) -> tuple[object, ...] | None:
    """What makes two failed runs the same failure (module docstring); None: not a failure."""
    if run.verdict not in REPEATABLE:
        return None
    where: tuple[object, ...] = ()
    for step in run.steps:
        if step.skipped or step.completed:
            continue
        if run.verdict == "timeout":
            where = (step.step_id,)
        else:
            where = (step.step_id, step.exit_code, step.metrics_error is not None)
        break
    if run.verdict == "inconclusive":
        where = tuple(sorted(k for k in run.metrics if not k.startswith("step-")))
    return (run.verdict, where, run.phase_text_hash, tuple(s.command for s in run.steps),
            tuple(sorted(run.vars.items())), tuple(sorted(run.overrides)), run.criterion)


def attempts(history: list[RunRecord], changed_since: Callable[[RunRecord], list[str] | None]) -> Attempts:
    """`history`: a phase's runs, oldest first. `changed_since(run)`: tracked files changed since the
    commit `run` ran on (None: cannot tell), asked only when the last two are the same failure."""
    if not history:
        return Attempts()
    key = failure_key(history[-1])
    if key is None:
        return Attempts()
    streak = [history[-1]]
    for run in reversed(history[:-1]):
        if failure_key(run) != key:
            break
        streak.insert(0, run)
    if len(streak) < 2:
        return Attempts(tuple(streak))
    changed = changed_since(streak[-2])
    return Attempts(tuple(streak), repeated=not changed, unknown=changed is None)


def from_runs(runs: list[RunRecord], changed_since: Callable[[RunRecord], list[str] | None]) -> AttemptsOf:
    """An `AttemptsOf` over runs in memory (oldest first): those of the phase of the run asked about,
    up to it."""

    def of(latest: RunRecord) -> Attempts:
        history = [r for r in runs if r.phase == latest.phase and r.plan == latest.plan]
        ids = [r.run_id for r in history]
        history = history[: ids.index(latest.run_id) + 1] if latest.run_id in ids else [*history, latest]
        return attempts(history, changed_since)

    return of


def with_other_values(attempts_of: AttemptsOf, overrides: dict[str, str]) -> AttemptsOf:
    """`attempts_of` for a `runbook next --set ...`: a run with other `--set` values than the failed
    runs had is a new attempt, never held back."""
    from runbook.plan.overrides import run_overrides

    def of(latest: RunRecord) -> Attempts:
        tried = attempts_of(latest)
        if tried.repeated and overrides != run_overrides(latest):
            return Attempts(tried.runs, repeated=False, unknown=tried.unknown)
        return tried

    return of


def for_workspace(ws: Workspace) -> AttemptsOf:
    """An `AttemptsOf` over the workspace's ledger (its index: only the runs of the streak are read)
    and its git."""

    def of(latest: RunRecord) -> Attempts:
        if latest.verdict not in REPEATABLE:
            return Attempts()
        ledger = ws.ledger()
        rows = ledger.rows(ws.plan_rel, latest.phase)
        ids = [row.run_id for row in rows]
        if latest.run_id not in ids:
            return Attempts((latest,))
        rows = rows[: ids.index(latest.run_id)][-_LOOK_BACK:]
        history = [latest]
        key = failure_key(latest)
        rows = [row for row in rows if not row.trial]  # a sweep's trials are no attempts of the phase
        for row in reversed(rows):  # read back only while the streak lasts
            if row.verdict != latest.verdict:
                break
            found = ledger.load([row])
            if not found or failure_key(found[0]) != key:
                break
            history.insert(0, found[0])
        return attempts(history, lambda run: ws.changed_since(run.commit_before))

    return of
