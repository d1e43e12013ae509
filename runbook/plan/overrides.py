"""`runbook next --set NAME=VALUE`: a plan var's value for this run only, and the vars a run used.

An override replaces the value of a var declared under `vars:` for the runs of one `runbook next`
invocation; the plan file is not changed. The value is quoted for where `{NAME}` stands exactly as
a value written in the plan is (runbook/plan/resolve.py), so a value no quoting can make safe there is
refused before anything runs, naming the step. The run record keeps every var the phase's commands
used with the value they ran with (`RunRecord.vars`) and which of them were overridden
(`RunRecord.overrides`); `runbook.run.select.stale_reason` compares a judged run against the plan with
the run's own overrides applied, so a verdict reached with `--set` stays the phase's verdict until
the phase's text, a var it did not override, or its `Pass:` changes.
"""

from __future__ import annotations

from runbook.errors import RunbookError
from runbook.model import Phase, Plan, RunRecord

__all__ = ["effective", "parse_sets", "run_overrides", "used_vars"]


def parse_sets(items: tuple[str, ...] | list[str], plan: Plan, file: str | None = None, *,
               flag: str = "--set") -> dict[str, str]:
    """`("lr=0.1", "epochs=30")` -> {"lr": "0.1", "epochs": "30"}; RunbookError(usage) naming the
    fix for anything else: no `=`, a name the plan does not declare (with a did-you-mean), a name
    given twice with different values. `flag` names where the items came from in messages."""
    from runbook.plan.resolve import closest

    out: dict[str, str] = {}
    declared = list(plan.vars)
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise RunbookError(f"{flag} {item!r}: write NAME=VALUE (e.g. {flag} lr=0.01)", "usage")
        if name not in plan.vars:
            guess = closest(name, declared)
            known = ", ".join(declared) if declared else "none"
            raise RunbookError(
                f"{flag} {name}: the plan declares no var {name!r}" + (f"; did you mean {guess}?" if guess else "")
                + f" (its vars: {known})",
                "usage", file=file,
                hint=f"{flag} names a var declared under `vars:` in the plan's front matter; declare it there first",
            )
        if name in out and out[name] != value:
            raise RunbookError(f"{flag} {name} is given twice ({out[name]!r} and {value!r}); give it once", "usage")
        out[name] = value
    return out


def effective(plan: Plan, overrides: dict[str, str]) -> Plan:
    """The plan with `overrides` applied to its vars (a copy; the plan itself is unchanged)."""
    if not overrides:
        return plan
    return plan.model_copy(update={"vars": {**plan.vars, **overrides}})


def used_vars(phase: Phase, vars: dict[str, str]) -> dict[str, str]:
    """The declared vars the phase's commands use (inside literal groups too), with their values,
    in order of first use."""
    from runbook.plan.resolve import scan

    used: dict[str, str] = {}
    for step in phase.steps:
        for piece in scan(step.command):
            if piece.kind == "var" and piece.value in vars and piece.value not in used:
                used[piece.value] = str(vars[piece.value])
    return used


def check(plan: Plan, phase: Phase, overrides: dict[str, str], *, flag: str = "--set") -> list[str]:
    """Refuse overrides no quoting makes safe where the phase uses them (RunbookError(usage));
    return warnings for overrides the phase does not use."""
    from runbook.plan.resolve import unsafe_vars

    if not overrides:
        return []
    vars = {**plan.vars, **overrides}
    for step in phase.steps:
        for unsafe in unsafe_vars(step.command, vars):
            if unsafe.piece.value in overrides:
                raise RunbookError(
                    f"{flag} {unsafe.piece.value}: {phase.display_name} {step.id}: {unsafe.piece.text} cannot take "
                    f"this value there: {unsafe.reason}", "usage",
                    hint="give a value without what the message names, or change the step",
                )
    used = used_vars(phase, vars)
    return [f"{flag} {name}: {phase.display_name}'s commands do not use {{{name}}}; it changes nothing in this run"
            for name in overrides if name not in used]


def run_overrides(run: RunRecord) -> dict[str, str]:
    """The overrides a recorded run ran with (names and values)."""
    return {name: run.vars[name] for name in run.overrides if name in run.vars}
