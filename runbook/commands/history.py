"""`runbook history [PHASE]`: past runs from the ledger (state/runs/*.json), oldest first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from runbook.commands._options import json_option, open_runs_filter, warn
from runbook.commands._output import Output
from runbook.contract import HistoryResult, RunView
from runbook.errors import RunbookError, warning
from runbook.model import MetricValue, Plan, RunRecord

if TYPE_CHECKING:
    from runbook.store.workspace import Workspace

DEFAULT_LIMIT = 50  # runs listed without --limit: the last ones, the earlier counted


@click.command("history")
@click.argument("phase_ref", metavar="[PHASE]", required=False)
@click.option("--plan", "plan_opt", metavar="PATH",
              help="Only runs of this plan file (default: every plan's runs; the only plan's when PHASE is given).")
@click.option("--metric", "metrics", metavar="NAME", multiple=True,
              help="Show NAME as a column of its own (repeatable): a metric, another phase's metric a criterion "
                   "read (phase-0.acc), or a var. Default: one column with the metrics each run's criterion names.")
@click.option("--sort", "sort", metavar="NAME",
              help="Order the runs by this column (a --metric name, a var, or run/phase/verdict/finished/took), "
                   "lowest first; runs without a value last. `-NAME` or --desc: highest first.")
@click.option("--desc", is_flag=True, help="Newest first (with --sort: highest first).")
@click.option("--limit", type=click.IntRange(min=0), default=DEFAULT_LIMIT, show_default=True,
              help="List the last N runs (then --sort orders them); 0 lists every run.")
@click.option("--since", "since_text", metavar="WHEN",
              help="Only runs started at or after WHEN: a date (2026-11-29), a UTC time (2026-11-29T14:30) or a run id.")
@json_option
def command(phase_ref: str | None, plan_opt: str | None, metrics: tuple[str, ...], sort: str | None, desc: bool,
            limit: int, since_text: str | None, as_json: bool) -> Output:
    """List past runs: id, phase, verdict, when, how long, metrics, and why; and the run in progress.

    PHASE filters by label (`1`, `"Phase 1"`) or id (`phase-1`) of the plan (`--plan`, or the
    only plan). With PHASE, a column is added for each var whose value differs between its runs.
    Below the table, a sparkline shows each --metric column across the runs (oldest first). A run
    that wrote a series of a --metric name ($RUNBOOK_SERIES, e.g. `eagle train`'s train_loss) shows
    its curve as a sparkline next to the value. The last --limit runs (since --since) are listed,
    after a line counting the earlier ones, and only they are read from the ledger; --sort orders
    them (--limit 0 --sort NAME ranks every run). Reads only the ledger and the run lock, so it
    works while a phase runs.

    \b
    Examples:
      runbook history
      runbook history 1 --metric accept_len --metric train_loss --sort accept_len --desc
      runbook history --since 2026-11-29 --limit 0
      runbook history --desc --limit 5   # the last five runs, newest first
      runbook history --json | jq '.result.runs[-1].verdict'
    """
    from runbook.run.planstate import holder_view
    from runbook.store.project import discover_plans

    ws, plan, phase_id = open_runs_filter(plan_opt, phase_ref)
    if plan is None:
        if not ws.state.is_dir() and not discover_plans(ws.root):
            raise RunbookError(
                f"no plan and no ledger here: {ws.root} has no {ws.rel(ws.state)}/ and no plan "
                f"({', '.join(ws.config.plans)} with `runbook: 1` front matter)",
                "no_plan",
                hint="run it inside a runbook workspace, or create one with `runbook init`",
            )
    since = _since(since_text) if since_text is not None else None
    index = ws.ledger()
    problems = list(index.problems)
    runs, omitted = index.runs(ws.plan_rel if plan is not None else None, phase_id, problems,
                               limit=limit or None, since=since)
    warn(problems)
    pending = _pending(ws, plan is not None, phase_id)
    lock = ws.lock_info()
    labels = (plan if plan is not None else _only_plan()) if lock is not None else None  # parsed only when needed
    holder = (holder_view(lock, labels, ws.rel(ws.state), live=ws.live_of(lock.run_id), root=ws.root,
                          state_dir=ws.state)
              if lock is not None else None)
    running = holder if holder is not None and holder.alive is not False else None
    if running is not None and plan is not None and running.plan not in (None, ws.plan_rel):
        running = None
    if running is not None and phase_id and running.phase != phase_id:
        running = None
    from runbook.report.compare import sort_runs, unknown

    every = runs + pending
    if sort and sort.startswith("-"):
        sort, desc = sort[1:], True
    warnings = unknown([*metrics, *([sort] if sort else [])], every)
    for line in warnings:
        warning(line)
    chrono = list(every)
    if sort:
        every = sort_runs(every, sort, desc)
    elif desc:
        every = every[::-1]
    waiting = {r.run_id for r in pending}
    views = [RunView.of(r, pending=r.run_id in waiting) for r in every]
    result = HistoryResult(plan=ws.plan_rel if plan is not None else None, phase=phase_id,
                           runs=views, omitted=omitted, running=running, columns=list(metrics), sort=sort,
                           descending=desc, warnings=warnings)
    if as_json:
        return Output(result)
    return Output(result, 0, _render(result, every, metrics, ws.rel(ws.state), waiting, phase_id is not None, chrono,
                                     ws.state))


def _pending(ws: Workspace, one_plan: bool, phase_id: str | None) -> list[RunRecord]:
    """Runs whose runbook died before recording them (runbook/store/live.py), as `runbook next` will record them."""
    index = ws.ledger()
    among = index.unrecorded_dirs()  # a live state lives in the folder of a run without a record
    if not among:
        return []
    from runbook.store.live import death_reason, interrupted_record, orphans

    found = orphans(ws.state, ws.plan_rel if one_plan else None, index.run_ids(), among=among)
    records = [o.record or interrupted_record(o, ws.root, death_reason(o)) for o in found]
    return [r for r in records if phase_id is None or r.phase == phase_id]


def _render(result: HistoryResult, runs: list[RunRecord], metrics: tuple[str, ...], state_rel: str,
            pending: set[str] | frozenset[str] = frozenset(), one_phase: bool = False,
            chrono: list[RunRecord] | None = None, state_dir: Path | None = None) -> str:
    from runbook.formatting import format_took, format_value, minute_text
    from runbook.plan.writeback import varying_vars, verdict_cell
    from runbook.report.compare import value

    def fmt(v: MetricValue | None) -> str:
        text = "-" if v is None else format_value(v)
        return text if len(text) <= 40 else text[:39] + "…"

    lines: list[str] = []
    if result.omitted:
        lines.append(f"({result.omitted:,} earlier run{'s' * (result.omitted != 1)} not listed: --limit N shows the "
                     "last N, --limit 0 all of them)")
    if not runs:
        lines.append("no runs yet" + (f" of {result.phase}" if result.phase else "") + f" (ledger: {state_rel}/runs/)")
    else:
        var_names = varying_vars(runs, exclude=metrics) if one_phase else []
        rows = []
        for r in runs:
            when = minute_text(r.finished or r.started)
            verdict = verdict_cell(r) + (" (not yet recorded)" if r.run_id in pending else "")
            cells = [r.run_id, r.phase, verdict, when, format_took(r.duration_s)]
            cells += [fmt(r.vars.get(n)) for n in var_names]
            if metrics:
                cells += [_cell(r, n, fmt, state_dir) for n in metrics]
            else:
                cells.append(" ".join(f"{n}={fmt(value(r, n))}" for n in _criterion_names(r.criterion)))
            rows.append([*cells, r.reason])
        header = ["run", "phase", "verdict", "finished", "took", *var_names, *(metrics or ["metrics"]), "reason"]
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
        numeric = {i for i in range(5, len(header) - 1) if metrics and i >= 5 + len(var_names)}
        for row in [header, *rows]:
            cells = [str(c).rjust(w) if i in numeric and row is not header else str(c).ljust(w)
                     for i, (c, w) in enumerate(zip(row[:-1], widths, strict=False))] + [str(row[-1])]
            lines.append("  ".join(cells).rstrip())
        lines += _sparklines(chrono or runs, metrics)
    if result.running is not None:
        from runbook.run.planstate import running_text

        lines.append("")
        lines.append("now: " + running_text(result.running, result.plan or result.running.plan or ""))
    return "\n".join(lines)


def _cell(record: RunRecord, name: str, fmt: Callable[[MetricValue | None], str], state_dir: Path | None) -> str:
    """A --metric cell: the run's value, and when the run wrote a series of that name, its curve as a
    sparkline after the value (the series' last value when the run has no scalar of the name)."""
    from runbook.report.compare import sparkline, value

    v = value(record, name)
    if state_dir is None or not any(s.name == name for s in record.series):
        return fmt(v)
    from runbook.store.series import find, load

    found = find(load(state_dir, record.run_id), name)
    if found is None:
        return fmt(v)
    if v is None:
        v = next((y for y in reversed(found.y) if y is not None), None)
    return f"{fmt(v)} {sparkline(found.y, 12)}"


def _sparklines(runs: list[RunRecord], metrics: tuple[str, ...]) -> list[str]:
    """One line per --metric column with numbers in two runs or more: its values across the runs,
    oldest first, as a sparkline, then the first and last values."""
    from runbook.formatting import format_value
    from runbook.report.compare import sparkline, value

    out: list[str] = []
    width = max((len(n) for n in metrics), default=0)
    for name in metrics:
        values = [value(r, name) for r in runs]
        numbers = [float(v) if isinstance(v, (int, float)) else None for v in values]
        seen = [v for v in numbers if v is not None]
        if len(seen) < 2:
            continue
        out.append(f"  {name.ljust(width)}  {sparkline(numbers)}  {format_value(seen[0])} … {format_value(seen[-1])} "
                   f"(min {format_value(min(seen))}, max {format_value(max(seen))}, {len(seen)} runs, oldest first)")
    return ["", *out] if out else []


def _since(text: str) -> int:
    """--since as UTC epoch seconds: a date, an ISO time (UTC unless it says otherwise) or a run id."""
    import re

    from runbook.formatting import parse_utc

    value = text.strip()
    match = re.fullmatch(r"(\d{4})(\d{2})(\d{2})-(\d{2})(\d{2})(\d{2})(?:-[0-9a-fA-F]+)?", value)
    if match:
        y, mo, d, h, mi, sec = match.groups()
        value = f"{y}-{mo}-{d}T{h}:{mi}:{sec}Z"
    moment = parse_utc(value)
    if moment is None:
        raise click.BadParameter(f"{text!r} is not a date, a time or a run id (e.g. 2026-11-29, "
                                 "2026-11-29T14:30, 20261129-143012-7f3a)", param_hint="--since")
    return int(moment.timestamp())


def _only_plan() -> Plan | None:
    """The repository's only plan, for phase labels; None when there are several, none, or it is broken."""
    from runbook.store.workspace import Workspace

    try:
        return Workspace.open(None).load_plan()
    except RunbookError:
        return None


def _criterion_names(criterion: str | None) -> list[str]:
    if not criterion:
        return []
    from runbook.plan.criteria import CriterionError, metric_names, parse_criterion

    try:
        return metric_names(parse_criterion(criterion))
    except (CriterionError, RecursionError):
        return []
