"""`runbook history [PHASE]`: past runs from the ledger (state/runs/*.json), oldest first."""

from __future__ import annotations

import json

import click


@click.command("history")
@click.argument("phase_ref", metavar="[PHASE]", required=False)
@click.option("--plan", "plan_path", metavar="PATH", type=click.Path(dir_okay=False),
              help="Only runs of this plan file (default: runs of every plan).")
@click.option("--metric", "metrics", metavar="NAME", multiple=True,
              help="Show this metric as a column (repeatable; default: the metrics each run's criterion names).")
@click.option("--json", "as_json", is_flag=True, help="Print the run records as a JSON list on stdout.")
def command(phase_ref: str | None, plan_path: str | None, metrics: tuple[str, ...], as_json: bool) -> None:
    """List past runs: id, phase, verdict, when, how long, metrics, and why.

    PHASE filters by label (`1`, `"Phase 1"`) or id (`phase-1`). Reads only the ledger, so it
    works while a phase runs.

    \b
    Examples:
      runbook history
      runbook history 1 --metric accept_len --metric train_loss
      runbook history --json | jq '.[-1].verdict'
    """
    import os
    from pathlib import Path

    from runbook.ledger import load_runs
    from runbook.project import ConfigError, find_repo_root, state_dir

    start = Path(plan_path).resolve() if plan_path else Path.cwd()
    root = Path(find_repo_root(start)).resolve()
    try:
        state = state_dir(root)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    plan_rel = Path(os.path.relpath(Path(plan_path).resolve(), root)).as_posix() if plan_path else None
    problems: list[str] = []
    runs = load_runs(state, plan=plan_rel, problems=problems)
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    if phase_ref:
        runs = [r for r in runs if _matches(r.phase, r.phase_label, phase_ref)]
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in runs], indent=2))
        return
    if not runs:
        click.echo("no runs yet" + (f" of {phase_ref}" if phase_ref else "") + f" (ledger: {state}/runs/)")
        return
    from runbook.criteria import format_value
    from runbook.writeback import format_took

    rows = []
    for r in runs:
        names = list(metrics) or _criterion_names(r.criterion)
        shown = " ".join(f"{n}={format_value(r.metrics[n])}" if n in r.metrics else f"{n}=-" for n in names)
        when = (r.finished or r.started)[:16].replace("T", " ")
        rows.append([r.run_id, r.phase, r.verdict, when, format_took(r.duration_s), shown, r.reason])
    header = ["run", "phase", "verdict", "finished", "took", "metrics", "reason"]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row[:-1], widths, strict=False)] + [str(row[-1])]
        click.echo("  ".join(cells).rstrip())


def _matches(phase_id: str, label: str, ref: str) -> bool:
    wanted = ref.strip().lower()
    return wanted in (phase_id.lower(), label.lower(), f"phase {label}".lower())


def _criterion_names(criterion: str | None) -> list[str]:
    if not criterion:
        return []
    from runbook.criteria import CriterionError, metric_names, parse_criterion

    try:
        return metric_names(parse_criterion(criterion))
    except CriterionError:
        return []
