"""Comparing runs: columns across runs (`runbook history --metric`), sorting, sparklines, and the
difference between two runs (`runbook diff`). Pure: run records in, values and models out.

A column name is looked up in a run as the results table does (runbook/plan/writeback.py `cell`): its
metric of that name, else the other phase's metric its criterion read, else the value of the var
of that name; the built-in columns `run`, `phase`, `verdict`, `finished` and `took` sort too.
"""

from __future__ import annotations

import difflib
import math

from runbook.contract import (
    CodeDiff,
    CommandChange,
    ComparisonChange,
    DiffResult,
    DiffRun,
    ValueChange,
    top_metrics,
)
from runbook.formatting import format_took, format_value
from runbook.model import RunRecord

__all__ = ["BUILTIN", "diff", "known_names", "render_diff", "sort_runs", "sparkline", "unknown", "value"]

BUILTIN = ("run", "phase", "verdict", "finished", "took")
_BARS = "▁▂▃▄▅▆▇█"


def value(record: RunRecord, name: str) -> float | str | None:
    """A run's value for column `name` (None: it has none)."""
    from runbook.plan.writeback import cell

    if name == "run":
        return record.run_id
    if name == "phase":
        return record.phase
    if name == "verdict":
        return record.verdict
    if name == "finished":
        return record.finished or record.started
    if name == "took":
        return record.duration_s
    return cell(record, name)


def known_names(runs: list[RunRecord]) -> list[str]:
    """Every column name the runs have a value for (metrics without the per-step copies, read
    references, vars, metric series), in order of first appearance."""
    names: dict[str, None] = {}
    for record in runs:
        names.update(dict.fromkeys(top_metrics(record.metrics)))
        names.update(dict.fromkeys(record.ref_metrics))
        names.update(dict.fromkeys(record.vars))
        names.update(dict.fromkeys(s.name for s in record.series))
    return list(names)


def unknown(names: list[str] | tuple[str, ...], runs: list[RunRecord]) -> list[str]:
    """A warning for each name no run has a value for, with a "did you mean" when one is close."""
    known = known_names(runs)
    every = set(known) | {n for r in runs for n in r.metrics}
    out = []
    for name in names:
        if name in every or name in BUILTIN:
            continue
        close = difflib.get_close_matches(name, known + list(BUILTIN), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        listing = ", ".join(known[:12]) + (f" and {len(known) - 12} more" if len(known) > 12 else "")
        out.append(f"no run shown has {name!r}{hint} (they have: {listing or 'nothing'})")
    return out


def sort_runs(runs: list[RunRecord], name: str, descending: bool = False) -> list[RunRecord]:
    """Runs ordered by column `name` (numbers numerically, text as text); runs without a value
    last, in their own order."""
    def key(item: tuple[int, RunRecord]) -> tuple[int, float, str, int]:
        v = value(item[1], name)
        if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
            return (0, -v if descending else v, "", item[0])
        if isinstance(v, str):
            number = _number(v)
            if number is not None:
                return (0, -number if descending else number, "", item[0])
            return (1, 0.0, v, item[0])
        return (2, 0.0, "", item[0])

    ordered = sorted(enumerate(runs), key=key)
    if descending:  # text sorts descending too, missing values stay last
        texts = [r for r in ordered if key(r)[0] == 1]
        texts.sort(key=lambda r: key(r)[2], reverse=True)
        ordered = [r for r in ordered if key(r)[0] == 0] + texts + [r for r in ordered if key(r)[0] == 2]
    return [r for _, r in ordered]


def _number(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def sparkline(values: list[float | None], width: int = 24) -> str:
    """`▁▃▅█`: one bar per value (at most `width`, evenly picked, the last always), scaled from the
    lowest to the highest; a space for a value that is missing or not finite."""
    if not values:
        return ""
    if len(values) > width:
        step = (len(values) - 1) / (width - 1)
        values = [values[round(i * step)] for i in range(width)]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return " " * len(values)
    low, high = min(finite), max(finite)
    span = high - low
    bars = []
    for v in values:
        if v is None or not math.isfinite(v):
            bars.append(" ")
        elif span == 0:
            bars.append(_BARS[len(_BARS) // 2])
        else:
            bars.append(_BARS[min(int((v - low) / span * (len(_BARS) - 1) + 0.5), len(_BARS) - 1)])
    return "".join(bars)


# ---- two runs ------------------------------------------------------------------------------------


def _change(name: str, a: object, b: object) -> ValueChange:
    delta = rel = None
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if math.isfinite(a) and math.isfinite(b):
            delta = float(f"{b - a:.12g}")
            rel = float(f"{(b - a) / abs(a):.6g}") if a != 0 else None
    same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return ValueChange(name=name, a=_plain(a), b=_plain(b), delta=delta, rel=rel, changed=not same)


def _plain(v: object) -> float | str | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    return str(v)


def _run(record: RunRecord) -> DiffRun:
    from runbook.contract import phase_label
    from runbook.formatting import iso_utc

    return DiffRun(run_id=record.run_id, plan=record.plan, phase=record.phase, label=phase_label(record.phase_label),
                   verdict=record.verdict, reason=record.reason, finished=iso_utc(record.finished or record.started),
                   commit=record.commit_before, duration_s=record.duration_s)


def diff(a: RunRecord, b: RunRecord, changed_files: list[str] | None = None) -> DiffResult:
    """What differs from run `a` to run `b`. `changed_files`: tracked files that differ between
    their commits (None: unknown, e.g. outside git)."""
    from runbook.contract import RunView

    var_names = list(dict.fromkeys([*a.vars, *b.vars]))
    vars_ = [_change(n, a.vars.get(n), b.vars.get(n)) for n in var_names]
    am, bm = top_metrics(a.metrics), top_metrics(b.metrics)
    metrics = [_change(n, am.get(n), bm.get(n)) for n in dict.fromkeys([*am, *bm])]
    refs = [_change(n, a.ref_metrics.get(n), b.ref_metrics.get(n))
            for n in dict.fromkeys([*a.ref_metrics, *b.ref_metrics])]

    a_steps = {s.step_id: s.command for s in a.steps}
    b_steps = {s.step_id: s.command for s in b.steps}
    commands = []
    for step in dict.fromkeys([*a_steps, *b_steps]):
        ca, cb = a_steps.get(step), b_steps.get(step)
        if ca != cb:
            lines = list(difflib.unified_diff((ca or "").splitlines(), (cb or "").splitlines(), lineterm="", n=1))
            commands.append(CommandChange(step=step, a=ca, b=cb, diff=lines[2:]))

    judged_a, judged_b = RunView.of(a).comparisons, RunView.of(b).comparisons
    comparisons = []
    for i in range(max(len(judged_a), len(judged_b))):
        x = judged_a[i] if i < len(judged_a) else None
        y = judged_b[i] if i < len(judged_b) else None
        comparisons.append(ComparisonChange(
            a=x.text if x else None, b=y.text if y else None,
            a_held=x.held if x else None, b_held=y.held if y else None,
        ))

    code = CodeDiff(a=a.commit_before, b=b.commit_before, same=a.commit_before == b.commit_before,
                    files=changed_files, a_dirty_files=list(a.dirty_files), b_dirty_files=list(b.dirty_files))
    env = _env_changes(a, b)
    return DiffResult(
        a=_run(a), b=_run(b), same_phase=(a.plan, a.phase) == (b.plan, b.phase),
        verdict=_change("verdict", a.verdict, b.verdict), vars=vars_, commands=commands, metrics=metrics,
        ref_metrics=refs, comparisons=comparisons, code=code, env=env,
        duration=_change("duration_s", a.duration_s, b.duration_s),
    )


def _env_changes(a: RunRecord, b: RunRecord) -> list[ValueChange]:
    if a.env is None and b.env is None:
        return []
    ea = a.env.model_dump() if a.env else {}
    eb = b.env.model_dump() if b.env else {}
    out = []
    for key in ("python", "platform", "host", "torch", "cuda", "gpus"):
        va, vb = ea.get(key), eb.get(key)
        if isinstance(va, list) or isinstance(vb, list):
            va, vb = ", ".join(va or []) or None, ", ".join(vb or []) or None
        out.append(_change(key, va, vb))
    env_a, env_b = ea.get("env") or {}, eb.get("env") or {}
    for key in sorted(set(env_a) | set(env_b)):
        out.append(_change(f"env.{key}", env_a.get(key), env_b.get(key)))
    if a.executor != b.executor:
        out.append(_change("executor", a.executor, b.executor))
    return [c for c in out if c.changed]


def render_diff(result: DiffResult, show_all: bool = False) -> str:
    """The text of `runbook diff`: what changed from A to B, section by section."""

    a, b = result.a, result.b
    lines = [f"A  {a.run_id}  {a.label} ({a.phase})  {a.verdict}  {a.finished or '-'}",
             f"B  {b.run_id}  {b.label} ({b.phase})  {b.verdict}  {b.finished or '-'}"]
    if not result.same_phase:
        lines.append("   (runs of different phases)")

    def fmt(v: float | str | None) -> str:
        return "-" if v is None else format_value(v)

    def section(title: str, changes: list[ValueChange], numbers: bool = False) -> None:
        shown = changes if show_all else [c for c in changes if c.changed]
        same = [c.name for c in changes if not c.changed]
        if not shown and not same:
            return
        lines.append("")
        lines.append(title + ":")
        width = max((len(c.name) for c in shown), default=0)
        for c in shown:
            text = f"  {c.name.ljust(width)}  {fmt(c.a)} -> {fmt(c.b)}"
            if numbers and c.delta is not None and c.changed:
                text += f"  ({'+' if c.delta >= 0 else ''}{format_value(c.delta)}"
                text += f", {'+' if c.rel >= 0 else ''}{c.rel * 100:.3g}%)" if c.rel is not None else ")"
            lines.append(text)
        if same and not show_all:
            lines.append(f"  unchanged: {', '.join(same[:20])}" + (f" and {len(same) - 20} more" if len(same) > 20 else ""))

    lines.append("")
    lines.append(f"verdict: {a.verdict} -> {b.verdict}" if result.verdict.changed else f"verdict: {a.verdict} (both)")
    for c in result.comparisons:
        if c.a != c.b or c.a_held != c.b_held:
            mark = {True: "holds", False: "✗", None: "?"}
            lines.append(f"  {c.a or '-'} [{mark[c.a_held]}]  ->  {c.b or '-'} [{mark[c.b_held]}]")
    section("vars", result.vars)
    if result.commands:
        lines.append("")
        lines.append("commands:")
        for change in result.commands:
            lines.append(f"  {change.step}:")
            lines += [f"    {line}" for line in change.diff]
    section("metrics", result.metrics, numbers=True)
    section("other phases' metrics read", result.ref_metrics, numbers=True)
    code = result.code
    lines.append("")
    if code.same:
        lines.append(f"code: the same commit {(code.a or '-')[:10]}")
    else:
        lines.append(f"code: {(code.a or '-')[:10]} -> {(code.b or '-')[:10]}")
        if code.files is not None:
            shown = ", ".join(code.files[:15]) + (f" and {len(code.files) - 15} more" if len(code.files) > 15 else "")
            lines.append(f"  files changed between them: {shown or 'none (besides the plan, notes and ledger)'}")
    for side, files in (("A", code.a_dirty_files), ("B", code.b_dirty_files)):
        if files:
            lines.append(f"  {side} ran with uncommitted changes to: {', '.join(files[:10])}")
    if result.env:
        section("environment", result.env)
    else:
        lines += ["", "environment: the same"]
    if format_took(a.duration_s) != format_took(b.duration_s):
        lines += ["", f"took: {format_took(a.duration_s)} -> {format_took(b.duration_s)}"]
    return "\n".join(lines)
