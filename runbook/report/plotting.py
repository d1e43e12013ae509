"""Charts of runs as PNG and SVG files, drawn with matplotlib (the only runbook module importing it,
and only inside the functions: `runbook --help` and every other verb start without it).

Two kinds, chosen by the data (`plan_chart`):

- a series chart: the metric's series (`$RUNBOOK_SERIES`, runbook/store/series.py) of one run or more,
  one line per run against the step, e.g. the training curve of `eagle train`; where several steps
  of a run logged the metric, one line per step, the step id in the legend (`step-2`, or
  `<run> step-2` when several runs are drawn);
- a runs chart: a scalar metric across runs, one point per run in run order, coloured by verdict
  (pass green, fail red, anything else grey), labelled with short run ids.

A run is labelled by its id and, when the runs plotted differ in a var, by that var's value
(`20261130-1301-ab12 lr=0.05`). Files are written atomically (a temp file in the same folder,
then a rename); the SVG carries no date, so the same data draws the same SVG.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from runbook.errors import RunbookError
from runbook.model import RunRecord

__all__ = ["Chart", "draw", "plan_chart"]

VERDICT_COLOURS = {"pass": "#2a9d3f", "fail": "#d1342f"}
# A runs chart labels at most this many runs (evenly spaced, the first and last always): one label per
# run made 10,000 runs take minutes of text layout in matplotlib, for labels nobody could read.
MAX_TICK_LABELS = 24
OTHER_COLOUR = "#8a8a8a"


@dataclass
class Line:
    label: str
    x: list[float]
    y: list[float | None]
    colour: str | None = None


@dataclass
class Chart:
    kind: Literal["series", "runs"]
    metric: str
    title: str
    lines: list[Line] = field(default_factory=list)
    xlabels: list[str] = field(default_factory=list)  # runs chart: one label per x
    colours: list[str] = field(default_factory=list)  # runs chart: one colour per point
    runs: list[str] = field(default_factory=list)  # the run ids drawn

    @property
    def points(self) -> int:
        return sum(sum(1 for v in line.y if v is not None) for line in self.lines)


def _labels(runs: list[RunRecord]) -> dict[str, str]:
    from runbook.plan.writeback import varying_vars

    names = varying_vars(runs)
    out = {}
    for r in runs:
        parts = [f"{n}={r.vars[n]}" for n in names if n in r.vars]
        out[r.run_id] = r.run_id + (" " + " ".join(parts) if parts else "")
    return out


def plan_chart(metric: str, runs: list[RunRecord], state_dir: str | os.PathLike[str], *,
               title: str | None = None, max_curves: int = 8) -> Chart:
    """What to draw for `metric` over `runs` (oldest first): the series of the runs that have one
    (the last `max_curves` of them), else the metric's value in each run that has it.
    RunbookError(usage) when no run has either, with a "did you mean"."""
    from runbook.store import series as series_mod

    curves = []
    for record in runs:
        found = series_mod.find_all(series_mod.load(state_dir, record.run_id), metric) if record.series else []
        found = [s for s in found if any(v is not None for v in s.y)]
        if found:
            curves.append((record, found))
    if curves:
        curves = curves[-max_curves:]
        labels = _labels([r for r, _ in curves])
        one = len(curves) == 1
        chart = Chart(kind="series", metric=metric, runs=[r.run_id for r, _ in curves],
                      title=title or f"{metric} by step" + (f", run {curves[0][0].run_id}" if one else ""))
        for record, found in curves:
            for s in found:  # several steps logged it: one curve each, the step in the legend
                label = labels[record.run_id] if len(found) == 1 else (
                    s.step_id if one else f"{labels[record.run_id]} {s.step_id}")
                chart.lines.append(Line(label=label, x=list(s.x), y=list(s.y)))
        return chart
    from runbook.report.compare import value

    values = [(r, value(r, metric)) for r in runs]
    have = [(r, float(v)) for r, v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not have:
        raise RunbookError(f"no run shown has a metric or a series called {metric!r}{_guess(metric, runs)}",
                           "usage", hint="`runbook history --json` lists each run's metrics and series")
    chart = Chart(kind="runs", metric=metric, runs=[r.run_id for r, _ in have],
                  title=title or f"{metric} across {len(have)} run{'s' if len(have) != 1 else ''}")
    labels = _labels([r for r, _ in have])
    chart.lines.append(Line(label=metric, x=[float(i) for i in range(len(have))], y=[v for _, v in have]))
    chart.xlabels = [labels[r.run_id] for r, _ in have]
    chart.colours = [VERDICT_COLOURS.get(r.verdict, OTHER_COLOUR) for r, _ in have]
    return chart


def _guess(metric: str, runs: list[RunRecord]) -> str:
    import difflib

    from runbook.report.compare import known_names

    names = known_names(runs) + sorted({s.name for r in runs for s in r.series})
    close = difflib.get_close_matches(metric, names, n=1, cutoff=0.6)
    shown = ", ".join(list(dict.fromkeys(names))[:12]) or "nothing"
    return (f"; did you mean {close[0]}?" if close else "") + f" (they have: {shown})"


def draw(chart: Chart, png: str | os.PathLike[str], svg: str | os.PathLike[str] | None = None) -> list[Path]:
    """Write the chart as PNG (and SVG); returns the paths written. RunbookError when matplotlib
    is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        from matplotlib.figure import Figure
    except ImportError:
        raise RunbookError("drawing charts needs matplotlib, which is not installed in runbook's environment",
                           "usage", hint="pip install 'runbook-eagle[plots]' (or `make setup`)") from None
    matplotlib.rcParams["svg.hashsalt"] = "runbook"  # the same data draws the same SVG

    fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    if chart.kind == "series":
        for line in chart.lines:
            xs = [x for x, y in zip(line.x, line.y, strict=True) if y is not None]
            ys = [y for y in line.y if y is not None]
            ax.plot(xs, ys, linewidth=1.4, label=line.label, marker="o" if len(xs) <= 20 else None, markersize=3)
        ax.set_xlabel("step")
        if len(chart.lines) > 1 or any(" " in line.label for line in chart.lines):
            ax.legend(fontsize=8, loc="best")
    else:
        line = chart.lines[0]
        ys = [math.nan if y is None else y for y in line.y]  # (a chart of runs has a value for each)
        many = len(line.x) > MAX_TICK_LABELS
        ax.plot(line.x, ys, color="#4c72b0", linewidth=0.6 if many else 1.2, zorder=1)
        ax.scatter(line.x, ys, c=chart.colours, s=4 if many else 36, zorder=2)
        shown = tick_positions(len(line.x))
        ax.set_xticks([line.x[i] for i in shown])
        ax.set_xticklabels([chart.xlabels[i] for i in shown], rotation=30, ha="right", fontsize=7)
        ax.set_xlabel("run (green: pass, red: fail)" + (f"; {len(shown)} of {len(line.x)} runs labelled" if many else ""))
        if len(line.x) == 1:
            ax.set_xlim(-1, 1)
    ax.set_ylabel(chart.metric)
    ax.set_title(chart.title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if _positive_wide(chart):
        ax.set_yscale("log")
    written = []
    for path, fmt in ((Path(png), "png"), (Path(svg) if svg else None, "svg")):
        if path is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fig.savefig(tmp, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
            os.replace(tmp, path)
        except (ValueError, OverflowError) as exc:  # matplotlib's axes cannot span values near the float limit
            values = [v for line in chart.lines for v in line.y if v is not None and math.isfinite(v)]
            span = f"; its values run from {min(values):.6g} to {max(values):.6g}" if values else ""
            raise RunbookError(f"matplotlib could not draw {chart.metric} ({exc}){span}", "usage",
                               hint="a hand-edited series or metric value may be out of range: "
                                    "`runbook history --json` shows what the runs hold") from None
        finally:
            tmp.unlink(missing_ok=True)
        written.append(path)
    return written


def tick_positions(n: int, most: int = MAX_TICK_LABELS) -> list[int]:
    """Indices of the runs a runs chart labels: all of them up to `most`, else `most` evenly spaced
    ones from the first to the last."""
    if n <= most:
        return list(range(n))
    return sorted({round(i * (n - 1) / (most - 1)) for i in range(most)})


def _positive_wide(chart: Chart) -> bool:
    """A loss curve spanning several decades reads better on a log scale."""
    values = [v for line in chart.lines for v in line.y if v is not None]
    if chart.kind != "series" or len(values) < 3 or min(values) <= 0:
        return False
    return math.log10(max(values) / min(values)) >= 2
