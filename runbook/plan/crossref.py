"""`phase-0.baseline_acc` in a `Pass:`: a metric of another phase's latest run.

A metric name whose part before the first `.` names a phase of the plan (its id, explicit id or
label, as everywhere: `phase-0.acc`, `baseline.acc`, `S.accept_len`) is a reference; the rest is the
metric's name in that phase's run (`phase-0.step-2.loss` works too). The value comes from the
phase's latest run that got as far as its criterion (pass, fail or inconclusive): an error or an
interrupted run has no verdict to lean on. A reference with no such run, or whose run has no such
metric, leaves the comparison `inconclusive`, and the reason says which.

A name that only looks like a phase (`phase-9.x` in a plan without Phase 9) and a reference to the
phase's own metrics are errors `runbook validate` reports with their column (`check`).
Pure: the plan and the ledger's records come in, values come out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from runbook.model import Expr, Metrics, Phase, Plan, RunRecord

__all__ = ["Refs", "check", "resolve", "split"]

_LOOKS_LIKE_PHASE = re.compile(r"phase-[A-Za-z0-9_]+", re.IGNORECASE)
COUNTED = frozenset({"pass", "fail", "inconclusive"})  # runs whose metrics a reference reads


def split(name: str, index: dict[str, Phase]) -> tuple[Phase, str] | None:
    """(the phase, the metric name in it) when `name` is a reference; `index` is
    plan.phase_index() (lower-cased references -> phase)."""
    head, dot, rest = name.partition(".")
    if not dot or not rest:
        return None
    target = index.get(head.lower())
    return (target, rest) if target is not None else None


def check(plan: Plan, phase: Phase, index: dict[str, Phase]) -> list[tuple[int, str]]:
    """Problems with the references of `phase`'s `Pass:`: (1-based column within its text, message)."""
    from runbook.plan.criteria import name_columns

    if phase.criterion is None:
        return []
    problems: list[tuple[int, str]] = []
    for name, col in name_columns(phase.criterion.text):
        found = split(name, index)
        head, _, rest = name.partition(".")
        if found is not None and found[0].id == phase.id:
            problems.append((col, f"`{name}` names a metric of this phase itself; write `{found[1]}`"))
        elif found is None and rest and _LOOKS_LIKE_PHASE.fullmatch(head):
            label = head.split("-", 1)[1].lower()
            same = next((p for p in plan.phases if p.label.lower() == label), None)
            if same is not None:  # Phase 0 {#base}: its id is `base`
                fix = f"{same.display_name}'s id is `{same.id}`: write `{same.id}.{rest}`"
            else:
                fix = f"phases: {', '.join(p.id for p in plan.phases)}"
            problems.append((col, f"`{name}`: this plan has no phase `{head}` ({fix})"))
    return problems


@dataclass
class Refs:
    """The references of one criterion, resolved against the ledger."""

    values: Metrics = field(default_factory=dict)  # reference name -> value (those found)
    runs: dict[str, str] = field(default_factory=dict)  # phase id -> the run its values came from
    missing: dict[str, str] = field(default_factory=dict)  # reference name -> why it has no value


def resolve(plan: Plan, phase: Phase, expr: Expr | None, runs: list[RunRecord]) -> Refs:
    """The values of `expr`'s references to other phases, from `runs` (this plan's, oldest first)."""
    from runbook.plan.criteria import metric_names

    refs = Refs()
    if expr is None:
        return refs
    index = plan.phase_index()
    latest: dict[str, RunRecord] = {}
    for record in runs:
        if record.verdict in COUNTED:
            latest[record.phase] = record
    for name in metric_names(expr):
        found = split(name, index)
        if found is None or found[0].id == phase.id:
            continue
        target, metric = found
        run = latest.get(target.id)
        if run is None:
            refs.missing[name] = f"{target.display_name} has no judged run yet"
            continue
        refs.runs[target.id] = run.run_id
        if metric in run.metrics:
            refs.values[name] = run.metrics[metric]
        else:
            refs.missing[name] = f"{target.display_name}'s latest run ({run.run_id}) has no {metric}" + _near(
                metric, run.metrics)
    return refs


def _near(name: str, metrics: Metrics) -> str:
    import difflib

    close = difflib.get_close_matches(name, [n for n in metrics if not n.startswith("step-")], n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
