"""`runbook status`: the phase table and the next action, from runbook/run/planstate.py."""

from __future__ import annotations

import shlex

import click

from runbook.commands._options import json_option, open_plan, plan_option, warn
from runbook.commands._output import Output
from runbook.contract import PhaseView, PlanStateView, StatusResult
from runbook.formatting import minute_text


def render(view: PlanStateView, plan_path: str) -> str:
    lines = [f"{view.title}  ({plan_path})" if view.title else plan_path]
    table = [["", "ID", "TITLE", "ESTIMATE", "STEPS", "STATE", "DECIDED BY", "LAST RUN"]]
    for row in view.phases:
        title = row.title if len(row.title) <= 40 else row.title[:39] + "…"
        last = " · ".join(x for x in (row.verdict, minute_text(row.finished) + " UTC" if row.finished else None, row.reason) if x) or "-"
        table.append([">" if row.next else "", row.id, title, row.estimate or "-",
                      f"{row.steps_done}/{row.steps_total}", row.state.replace("_", " "), _decided(row), last])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    for row in view.phases:
        if row.note:
            lines.append(f"  {row.label}: {row.note}")
        if row.decided_by and row.decided_how != "last run":
            lines.append(f"  {row.label}: decided by run {row.decided_by}, {row.decided_how} (record {row.run_id})")
    latest = view.last_run
    if latest is not None and latest.overrides:
        lines.append(f"  last run {latest.run_id} ({latest.label}) ran with {_sets(latest.vars, latest.overrides)}")
    lines.append("")
    lines.append(view.summary)
    if view.running is not None and view.running.log_tail:
        lines.append(f"  last lines of {view.running.log_path}:")
        lines += [f"    {line}" for line in view.running.log_tail[-5:]]
        lines.append("  follow it: runbook logs -f · stop it: runbook cancel")
    nxt = view.next
    if nxt.command:
        lines.append(f"next ({nxt.kind}): {nxt.command}")
    else:
        lines.append(f"next ({nxt.kind}): {nxt.why}")
    if nxt.overrides:
        lines.append(f"  with {_sets(nxt.overrides, list(nxt.overrides))}"
                     + (f" (the values run {nxt.run_id} was started with)" if nxt.kind == "resume" and nxt.run_id else ""))
    return "\n".join(lines)


def _decided(row: PhaseView) -> str:
    """`<run> (last run)`, `<run> (chosen)`, `<run> (picked)`: the run whose verdict the phase has."""
    if not row.decided_by:
        return "-"
    how = row.decided_how or ""
    return f"{row.decided_by} ({'picked' if how.startswith('picked') else 'chosen' if how.startswith('chosen') else how})"


def _sets(values: dict[str, str], names: list[str]) -> str:
    return " ".join(f"--set {shlex.quote(f'{name}={values[name]}')}" for name in names if name in values)


@click.command("status")
@plan_option
@json_option
def command(plan_opt: str | None, as_json: bool) -> Output:
    """Show the phase table: each phase's state and last run, and what runs next.

    States come from the run ledger (state/runs/) and the run lock: not run, running, passed,
    failed, inconclusive, stale (judged under commands or a Pass: the phase no longer has),
    resumable (its last run ended error, timeout or interrupted). `>` marks the phase the next
    action acts on; the last lines say where the plan stands and the exact command to continue
    (the same as `runbook brief` and `runbook next --dry-run`). Nothing runs, nothing is written.
    """
    from runbook.run.planstate import for_workspace

    ws = open_plan(plan_opt)
    problems: list[str] = []
    view = for_workspace(ws, problems=problems).view
    warn(problems)
    return Output(StatusResult(**view.model_dump()), 0, render(view, ws.plan_display))
