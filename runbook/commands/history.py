"""`runbook history [PHASE]`: past runs from the ledger (state/runs/*.json), oldest first."""

from __future__ import annotations

import click

from runbook.cli import Output
from runbook.commands._options import json_option, warn
from runbook.contract import HistoryResult, RunView
from runbook.errors import RunbookError


@click.command("history")
@click.argument("phase_ref", metavar="[PHASE]", required=False)
@click.option("--plan", "plan_opt", metavar="PATH",
              help="Only runs of this plan file (default: every plan's runs; the only plan's when PHASE is given).")
@click.option("--metric", "metrics", metavar="NAME", multiple=True,
              help="Show this metric as a column (repeatable; default: the metrics each run's criterion names).")
@json_option
def command(phase_ref: str | None, plan_opt: str | None, metrics: tuple[str, ...], as_json: bool) -> Output:
    """List past runs: id, phase, verdict, when, how long, metrics, and why; and the run in progress.

    PHASE filters by label (`1`, `"Phase 1"`) or id (`phase-1`) of the plan (`--plan`, or the
    only plan). Reads only the ledger and the run lock, so it works while a phase runs.

    \b
    Examples:
      runbook history
      runbook history 1 --metric accept_len --metric train_loss
      runbook history --json | jq '.result.runs[-1].verdict'
    """
    from runbook.commands.show import unknown_phase
    from runbook.planstate import holder_view
    from runbook.project import discover_plans
    from runbook.workspace import Workspace

    plan = None
    if plan_opt or phase_ref:
        ws = Workspace.open(plan_opt)
        plan = ws.load_plan()
    else:
        ws = Workspace.at()
        if not ws.state.is_dir() and not discover_plans(ws.root):
            raise RunbookError(
                f"no plan and no ledger here: {ws.root} has no {ws.rel(ws.state)}/ and no plan "
                f"({', '.join(ws.config.plans)} with `runbook: 1` front matter)",
                "no_plan",
                hint="run it inside a runbook workspace, or create one with `runbook init`",
            )
    phase_id = None
    if phase_ref and plan is not None:
        phase = plan.find_phase(phase_ref)
        if phase is None:
            raise unknown_phase(plan, phase_ref, ws.plan_display)
        phase_id = phase.id
    problems: list[str] = []
    runs = ws.runs(problems, every_plan=plan is None)
    warn(problems)
    if phase_id:
        runs = [r for r in runs if r.phase == phase_id]
    pending = _pending(ws, plan is not None, phase_id)
    lock = ws.lock_info()
    labels = plan if plan is not None else _only_plan()
    holder = (holder_view(lock, labels, ws.rel(ws.state), live=ws.live_of(lock.run_id), root=ws.root)
              if lock is not None else None)
    running = holder if holder is not None and holder.alive is not False else None
    if running is not None and plan is not None and running.plan not in (None, ws.plan_rel):
        running = None
    if running is not None and phase_id and running.phase != phase_id:
        running = None
    views = [RunView.of(r) for r in runs] + [RunView.of(r, pending=True) for r in pending]
    result = HistoryResult(plan=ws.plan_rel if plan is not None else None, phase=phase_id,
                           runs=views, running=running)
    if as_json:
        return Output(result)
    return Output(result, 0, _render(result, runs + pending, metrics, ws.rel(ws.state), {r.run_id for r in pending}))


def _pending(ws, one_plan: bool, phase_id: str | None) -> list:
    """Runs whose runbook died before recording them (runbook/live.py), as `runbook next` will record them."""
    from runbook.live import death_reason, interrupted_record, orphans

    ids = {r.run_id for r in ws.runs(every_plan=True)}
    found = orphans(ws.state, ws.plan_rel if one_plan else None, ids)
    records = [o.record or interrupted_record(o, ws.root, death_reason(o)) for o in found]
    return [r for r in records if phase_id is None or r.phase == phase_id]


def _render(result: HistoryResult, runs: list, metrics: tuple[str, ...], state_rel: str,
            pending: set[str] | frozenset[str] = frozenset()) -> str:
    from runbook.criteria import format_value
    from runbook.writeback import format_took

    lines: list[str] = []
    if not runs:
        lines.append("no runs yet" + (f" of {result.phase}" if result.phase else "") + f" (ledger: {state_rel}/runs/)")
    else:
        rows = []
        for r in runs:
            names = list(metrics) or _criterion_names(r.criterion)
            shown = " ".join(
                f"{n}={format_value(r.metrics[n]) if isinstance(r.metrics[n], (int, float)) else r.metrics[n]}"
                if n in r.metrics else f"{n}=-" for n in names)
            when = (r.finished or r.started)[:16].replace("T", " ")
            verdict = r.verdict + (" (not yet recorded)" if r.run_id in pending else "")
            rows.append([r.run_id, r.phase, verdict, when, format_took(r.duration_s), shown, r.reason])
        header = ["run", "phase", "verdict", "finished", "took", "metrics", "reason"]
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
        for row in [header, *rows]:
            cells = [str(c).ljust(w) for c, w in zip(row[:-1], widths, strict=False)] + [str(row[-1])]
            lines.append("  ".join(cells).rstrip())
    if result.running is not None:
        from runbook.planstate import running_text

        lines.append("")
        lines.append("now: " + running_text(result.running, result.plan or result.running.plan or ""))
    return "\n".join(lines)


def _only_plan():  # -> Plan | None
    """The repository's only plan, for phase labels; None when there are several, none, or it is broken."""
    from runbook.workspace import Workspace

    try:
        return Workspace.open(None).load_plan()
    except RunbookError:
        return None


def _criterion_names(criterion: str | None) -> list[str]:
    if not criterion:
        return []
    from runbook.criteria import CriterionError, metric_names, parse_criterion

    try:
        return metric_names(parse_criterion(criterion))
    except (CriterionError, RecursionError):
        return []
