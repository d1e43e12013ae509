"""`runbook plot [PHASE] --metric M`: a metric's series, or its values across runs, as PNG and SVG."""

from __future__ import annotations

import re
from pathlib import Path

import click

from runbook.commands._options import json_option, open_runs_filter, warn
from runbook.commands._output import Output
from runbook.errors import RunbookError


@click.command("plot")
@click.argument("phase_ref", metavar="[PHASE]", required=False)
@click.option("--metric", "-m", required=True, metavar="NAME",
              help="The metric: its series ($RUNBOOK_SERIES) when the runs have one, else its value in each run.")
@click.option("--runs", "run_refs", multiple=True, metavar="RUN[,RUN...]",
              help="These runs (ids, unique prefixes, `last`, `last~N`; repeatable or comma-separated). "
                   "Default: the runs of PHASE (or of every phase), the last 8 with a series of NAME.")
@click.option("--out", "out", type=click.Path(dir_okay=False), metavar="FILE.png",
              help="Where the PNG goes (the SVG beside it). Default: state/runs/<newest run drawn>/plots/.")
@click.option("--plan", "plan_opt", metavar="PATH", help="Runs of this plan file (default: the only plan, or every plan).")
@json_option
def command(phase_ref: str | None, metric: str, run_refs: tuple[str, ...], out: str | None, plan_opt: str | None,
            as_json: bool) -> Output:
    """Draw METRIC as PNG and SVG files with matplotlib.

    When the runs wrote a series of METRIC (JSON lines appended to $RUNBOOK_SERIES; `eagle train`
    writes its losses and accuracies per step), one curve per run against the step; otherwise the
    metric's value in each run, in run order, coloured by verdict. Runs that differ in a var are
    labelled with its value.

    \b
    Examples:
      runbook plot 1 --metric train_loss              # the training curves of Phase 1's runs
      runbook plot --metric accept_len                # accept_len across every run
      runbook plot --metric val_loss --runs last~1,last --out val.png
    """
    from runbook.report.plotting import draw, plan_chart

    ws, plan, phase_id = open_runs_filter(plan_opt, phase_ref)
    index = ws.ledger()
    problems = list(index.problems)
    plan_rel = ws.plan_rel if plan is not None else None
    if run_refs:  # only the runs named are read
        warn(problems)
        rows = index.rows(plan_rel, phase_id)
        refs = [ref for item in run_refs for ref in item.split(",") if ref.strip()]
        chosen = [ws.find_run(ref.strip(), rows) for ref in refs]
        runs = sorted({r.run_id: r for r in chosen}.values(), key=lambda r: (r.started, r.run_id))
    else:  # a chart across the runs: every one of them
        runs = index.runs(plan_rel, phase_id, problems)[0]
        warn(problems)
    if not runs:
        raise RunbookError("no runs to plot" + (f" of {phase_ref}" if phase_ref else ""), "unknown_run",
                           hint="run a phase first (`runbook next`), or name runs with --runs")
    chart = plan_chart(metric, runs, ws.state)
    if out:
        png = _resolve(out)
    else:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{phase_ref or 'runs'}-{metric}").strip("_") or "plot"
        from runbook.store.ledger import run_dir

        png = run_dir(ws.state, chart.runs[-1]) / "plots" / f"{slug}.png"
    svg = png.with_suffix(".svg")
    written = draw(chart, png, svg)
    from runbook.contract import PlotResult

    def shown(path: Path) -> str:
        try:
            return ws.rel(path.resolve()) if path.resolve().is_relative_to(ws.root) else str(path)
        except OSError:
            return str(path)

    result = PlotResult(metric=metric, kind=chart.kind, png=shown(written[0]), svg=shown(written[1]),
                        runs=chart.runs, points=chart.points,
                        curves=[line.label for line in chart.lines] if chart.kind == "series" else [])
    what = (f"the series of {metric} of {len(chart.runs)} run(s)" if chart.kind == "series"
            else f"{metric} across {len(chart.runs)} run(s)")
    return Output(result, 0, f"plotted {what} ({chart.points} points):\n  {result.png}\n  {result.svg}")


def _resolve(out: str) -> Path:
    path = Path(out)
    if path.suffix.lower() != ".png":
        raise RunbookError(f"--out {out}: name a .png file (the SVG is written beside it)", "usage")
    return path
