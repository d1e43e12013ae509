"""A sweep's grid and its pick, as text: the points of `runbook sweep --set/--point` and of a
phase's `Sweep:` line, and `--pick` / `Pick:` (`best:acc`, `max:acc`, `min:loss`) with the
direction `best` reads from the phase's `Pass:`. Pure: the parser checks a plan's `Sweep:` and
`Pick:` with the same functions `runbook sweep` checks its flags with (runbook/run/sweep.py).

`flag` names where the words came from in messages (`--set` / `--pick`, or `Sweep:` / `Pick:`).
"""

from __future__ import annotations

import itertools

from runbook.errors import RunbookError
from runbook.model import Expr, Phase, Plan

__all__ = ["PICK_HOWS", "direction_of", "parse_pick", "parse_points", "phase_points", "resolve_pick", "split_axes"]

PICK_HOWS = ("best", "max", "min")


def _one(item: str, plan: Plan, file: str, flag: str) -> dict[str, str]:
    from runbook.plan.overrides import parse_sets

    return parse_sets([item], plan, file, flag=flag)


def parse_points(sets: tuple[str, ...] | list[str], points: tuple[str, ...] | list[str], plan: Plan,
                 file: str, *, flag: str = "--set") -> list[dict[str, str]]:
    """The sweep's points, in order: the grid of `sets` (`NAME=V1,V2,...` each; the product, the
    last NAME varying fastest), then each `points` item (`NAME=V,NAME2=V2`). Names must be plan
    vars (RunbookError usage, with a did-you-mean); a point given twice runs once. Values cannot
    hold a comma."""
    axes: list[tuple[str, list[str]]] = []
    for item in sets:
        name, eq, values = item.partition("=")
        parts = values.split(",")
        if not eq or not name.strip() or any(not v.strip() for v in parts):
            raise RunbookError(f"{flag} {item!r}: write NAME=V1,V2,... (e.g. {flag} lr=0.003,0.01,0.03)", "usage")
        name = name.strip()
        parts = [v.strip() for v in parts] if flag != "--set" else parts
        _one(f"{name}={parts[0]}", plan, file, flag)  # a var the plan declares
        if any(name == n for n, _ in axes):
            raise RunbookError(f"{flag} {name} is given twice; give its values once, comma-separated", "usage")
        axes.append((name, list(dict.fromkeys(parts))))
    out: list[dict[str, str]] = []
    if axes:
        for combo in itertools.product(*(values for _, values in axes)):
            out.append({name: value for (name, _), value in zip(axes, combo, strict=True)})
    for item in points:
        point: dict[str, str] = {}
        for part in item.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise RunbookError(f"--point {item!r}: write NAME=V,NAME2=V2 (e.g. --point 'lr=0.01,hidden=8')",
                                   "usage")
            for name, value in _one(part.strip(), plan, file, "--point").items():
                if name in point and point[name] != value:
                    raise RunbookError(f"--point {item!r} gives {name} twice", "usage")
                point[name] = value
        if not point:
            raise RunbookError(f"--point {item!r}: no NAME=VALUE in it", "usage")
        out.append(point)
    unique = []
    for point in out:
        if point not in unique:
            unique.append(point)
    if not unique:
        raise RunbookError("a sweep needs points: --set NAME=V1,V2 (a grid) or --point 'NAME=V,...'", "usage",
                           hint="runbook sweep PHASE --set lr=0.003,0.01,0.03 --set hidden=8,64 --yes")
    return unique


def split_axes(value: str) -> list[str]:
    """A `Sweep:` line's value -> its axes as `--set` items: `n=100,200; lr=0.1,0.3` ->
    ["n=100,200", "lr=0.1,0.3"] (backticks around the line or an axis are fine)."""
    return [part.strip().strip("`").strip() for part in value.strip().strip("`").split(";") if part.strip("` \t")]


def phase_points(plan: Plan, phase: Phase, file: str) -> list[dict[str, str]]:
    """The points of the phase's `Sweep:` line, in the order they run (`[]` without one)."""
    return parse_points(phase.sweep, [], plan, file, flag="`Sweep:`") if phase.sweep else []


def parse_pick(pick: str, *, flag: str = "--pick") -> tuple[str, str]:
    """`best:acc` / `max:acc` / `min:loss` -> (how, metric); RunbookError(usage) otherwise."""
    how, colon, metric = pick.strip().partition(":")
    if not colon or how.strip() not in PICK_HOWS or not metric.strip():
        raise RunbookError(f"{flag} {pick!r}: write best:METRIC, max:METRIC or min:METRIC (e.g. {flag} best:val_acc)",
                           "usage")
    return how.strip(), metric.strip()


def direction_of(expr: Expr | None, metric: str) -> str | None:
    """"max" or "min": which way `metric` is better by the phase's `Pass:` (`acc >= 0.9`: max;
    `loss < 0.2`: min), or None when the criterion does not compare it with a bound one way."""
    from runbook.model import BoolOp, Compare, MetricRef, Not

    found: set[str] = set()

    def walk(node: object, flipped: bool) -> None:
        if isinstance(node, BoolOp):
            for item in node.items:
                walk(item, flipped)
        elif isinstance(node, Not):
            walk(node.item, not flipped)
        elif isinstance(node, Compare) and node.op in ("<", "<=", ">", ">="):
            up = node.op in (">", ">=")
            if isinstance(node.left, MetricRef) and node.left.name == metric:
                found.add("max" if up != flipped else "min")
            elif isinstance(node.right, MetricRef) and node.right.name == metric:
                found.add("min" if up != flipped else "max")

    walk(expr, False)
    return found.pop() if len(found) == 1 else None


def resolve_pick(pick: str, phase: Phase, *, flag: str = "--pick") -> tuple[str, str]:
    """(direction, metric) of a `--pick`; `best` reads the direction from the phase's `Pass:`."""
    how, metric = parse_pick(pick, flag=flag)
    if how != "best":
        return how, metric
    direction = direction_of(phase.criterion.expr if phase.criterion else None, metric)
    if direction is None:
        raise RunbookError(
            f"{flag} {pick}: the Pass: of {phase.display_name} does not say whether a higher or a lower {metric} "
            "is better", "usage", hint=f"say it: {flag} max:{metric} or {flag} min:{metric}")
    return direction, metric
