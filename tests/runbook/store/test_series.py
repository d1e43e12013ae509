"""Metric series ($RUNBOOK_SERIES) and charts: what a step appends is kept, bounded, next to the run
record and committed with it; `runbook plot` and `runbook record --plot` draw it with matplotlib; a
real `eagle train` on the toy target writes its curve."""

from __future__ import annotations

import json
import math
from pathlib import Path

import helpers as H
import pytest

from runbook.model import StepResult
from runbook.store import series


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_long_series_is_thinned_to_the_bound_and_keeps_its_last_point(tmp_path: Path) -> None:
    n = 12_345
    path = _write(tmp_path / "s.jsonl", [json.dumps({"step": i * 10, "loss": 10 / (i + 1), "acc": i / n}) for i in range(n)])
    found, problem = series.read_step(path, "step-2")
    assert problem is None
    loss = series.find(found, "loss")
    assert loss is not None and loss.step_id == "step-2" and loss.points == n
    assert len(loss.x) <= series.MAX_POINTS and len(loss.x) == len(loss.y)
    assert loss.x[0] == 0 and loss.x[-1] == (n - 1) * 10  # first and last point kept
    assert loss.y[-1] == pytest.approx(10 / n, rel=1e-5)
    gaps = {b - a for a, b in zip(loss.x[:-2], loss.x[1:-1], strict=True)}
    assert gaps == {loss.every * 10}  # evenly thinned: every k-th point
    assert series.find(found, "step-2.acc") is not None and series.find(found, "step-1.acc") is None


def test_bad_lines_are_skipped_and_named_gaps_kept_and_other_values_ignored(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.jsonl", [
        '{"step": 1, "loss": 2.5, "note": "text", "flag": true}',
        "not json",
        "[1, 2]",
        '{"step": "x", "loss": 1}',
        '{"step": 2, "loss": NaN}',
        '{"loss": 1.5}',  # no step: its index in the series
        "",
        '{"step": 4, "loss": null, "nested": {"a": 1}}',
    ])
    found, problem = series.read_step(path, "step-1")
    loss = series.find(found, "loss")
    assert loss.x == [1, 2, 2, 4] and loss.y == [2.5, None, 1.5, None]
    assert series.find(found, "flag").y == [1.0]
    assert {s.name for s in found} == {"loss", "flag"}
    assert problem == ("step-1: $RUNBOOK_SERIES: skipped 3 line(s) (line 2: not JSON); write one JSON object per "
                       'line, {"step": N, "name": value}')
    assert series.read_step(tmp_path / "none.jsonl", "step-1") == ([], None)
    (tmp_path / "dir.jsonl").mkdir()
    assert "not a regular file" in series.read_step(tmp_path / "dir.jsonl", "step-1")[1]


def test_a_name_holding_half_a_character_skips_its_line_and_the_record_is_still_written(tmp_path: Path) -> None:
    """`{"lo\\ud800ss": 1}` (a \\u escape without its pair) decodes to a name no UTF-8 file can hold: it made
    `runbook next` fail with an internal error writing the run record; now the line is skipped and named."""
    path = _write(tmp_path / "s.jsonl", ['{"step": 1, "loss": 2.0}', '{"step": 2, "lo\\ud800ss": 1.0, "loss": 3.0}',
                                         '{"step": 3, "loss": 1.0, "\\ud83d\\ude00": 4}'])
    found, problem = series.read_step(path, "step-1")
    assert series.find(found, "loss").x == [1, 3] and {s.name for s in found} == {"loss", "\U0001f600"}
    assert problem is not None and "skipped 1 line(s) (line 2: a name holds '\\ud800', half of a character)" in problem
    assert all(json.loads(s.model_dump_json())["name"] == s.name for s in found)  # what the record keeps


def test_series_are_kept_compactly_next_to_the_record_and_a_resumed_step_keeps_its_own(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = series.step_file(state, "run-a", "step-1")
    first.parent.mkdir(parents=True)
    _write(first, [json.dumps({"step": i, "loss": 1 / (i + 1)}) for i in range(100)])
    found, problems = series.collect(state, "run-a", [StepResult(step_id="step-1", command="x", exit_code=0)])
    assert problems == [] and series.save(state, "run-a", found, problems) == state / "runs" / "run-a.series.jsonl"
    text = (state / "runs" / "run-a.series.jsonl").read_text()
    assert len(text) < 4000 and '"x":[0,1,2,' in text  # integers stay integers
    assert series.load(state, "run-a")[0].y[:2] == [1.0, 0.5]
    # the next run skips step-1 (done) and runs step-2
    second = series.step_file(state, "run-b", "step-2")
    second.parent.mkdir(parents=True)
    _write(second, ['{"step": 0, "val": 3}'])

    last = H.run_record(run_id="run-a", plan="p.md", plan_blob="0", phase="phase-0", phase_label="0",
                     phase_text_hash="0", started="2026-11-30T00:00:00Z", verdict="interrupted")
    found, _ = series.collect(state, "run-b", [StepResult(step_id="step-1", command="x", skipped=True),
                                               StepResult(step_id="step-2", command="y", exit_code=0)], last)
    assert [(s.name, s.step_id, s.points) for s in found] == [("loss", "step-1", 100), ("val", "step-2", 1)]
    info = series.summary(found)[0]
    assert (info.name, info.points, info.kept, info.first_x, info.last_x, info.max) == ("loss", 100, 100, 0, 99, 1.0)
    assert series.save(state, "run-c", [], []) is None and not (state / "runs" / "run-c.series.jsonl").exists()


PLAN = """\
---
runbook: 1
notes: notes.md
vars:
  n: "300"
---

## Phase 0: A curve

Steps:
- [ ] Fit: `python3 fit.py {n}`

Pass: final_loss < 1
"""

FIT = """\
import json, math, os, sys
n = int(sys.argv[1])
with open(os.environ["RUNBOOK_SERIES"], "a") as f:
    for i in range(n):
        f.write(json.dumps({"step": i, "loss": 3 * math.exp(-i / (n / 5)) + 0.1}) + "\\n")
json.dump({"final_loss": 3 * math.exp(-(n - 1) / (n / 5)) + 0.1}, open(os.environ["RUNBOOK_METRICS"], "w"))
"""


def _png_check(path: Path, curve: bool = True) -> None:
    """A real chart: the PNG opens, has the size drawn, and is far from blank; a curve chart shows
    a long line in matplotlib's first line colour (#1f77b4), a runs chart its green/red dots."""
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (800, 450)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    total = 800 * 450
    ink = sum(n for n, rgb in colours if rgb != (255, 255, 255))
    assert ink > 0.01 * total  # axes, labels and the data
    if curve:
        assert sum(n for n, (r, g, b) in colours if b > 150 and r < 100) > 200
    else:
        assert sum(n for n, (r, g, b) in colours if g > 120 and r < 100 and b < 100) > 20  # a green (pass) dot


def test_series_are_committed_with_the_run_history_shows_a_sparkline_and_record_plot_embeds_the_chart(
        tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    (repo / "fit.py").write_text(FIT)
    H.git(repo, "add", "fit.py")
    H.git(repo, "commit", "-qm", "fit")
    assert H.runbook_inproc(repo, "next", "--yes").returncode == 0
    run_id = next((repo / "state" / "runs").glob("*.json")).stem
    committed = H.git(repo, "show", "--name-only", "--format=", "HEAD").split()
    assert f"state/runs/{run_id}.series.jsonl" in committed
    record = json.loads((repo / "state" / "runs" / f"{run_id}.json").read_text())
    (info,) = record["series"]
    assert (info["name"], info["step_id"], info["points"], info["kept"]) == ("loss", "step-1", 300, 300)
    hist = H.runbook_inproc(repo, "history", "--metric", "loss")
    assert "█" in hist.stdout and "▁" in hist.stdout and "warning" not in hist.stderr
    # plot: the series of the run
    out = json.loads(H.runbook_inproc(repo, "plot", "--metric", "loss", "--json").stdout)["result"]
    assert out["kind"] == "series" and out["runs"] == [run_id] and out["points"] == 300
    assert out["png"] == f"state/runs/{run_id}/plots/runs-loss.png"  # gitignored, beside the run's logs
    _png_check(repo / out["png"])
    assert (repo / out["svg"]).read_text().lstrip().startswith("<?xml")
    # a second run with another n: the metric across runs, and two curves
    assert H.runbook_inproc(repo, "next", "--phase", "0", "--restart", "--set", "n=100", "--yes").returncode == 0
    across = json.loads(H.runbook_inproc(repo, "plot", "0", "--metric", "final_loss", "--json").stdout)["result"]
    assert across["kind"] == "runs" and len(across["runs"]) == 2
    _png_check(repo / across["png"], curve=False)
    curves = json.loads(H.runbook_inproc(repo, "plot", "--metric", "loss", "--out", "curves.png", "--json").stdout)["result"]
    assert curves["kind"] == "series" and len(curves["runs"]) == 2 and curves["points"] == 400
    bad = H.runbook(repo, "plot", "--metric", "los")
    assert bad.returncode == 2 and "did you mean loss?" in bad.stderr
    H.assert_no_traceback(bad)
    # record --plot: the chart in the notes, committed with them
    rec = json.loads(H.runbook_inproc(repo, "record", "Curve", "--run", run_id, "--plot", "loss", "--json").stdout)
    assert rec["ok"], rec
    png = f"plans/plots/{run_id}-loss.png"
    assert rec["result"]["plots"] == [png]
    notes = (repo / "plans" / "notes.md").read_text()
    assert f"![loss by step, run {run_id}](plots/{run_id}-loss.png)" in notes
    assert sorted(H.git(repo, "show", "--name-only", "--format=", "HEAD").split()) == ["plans/notes.md", png]
    _png_check(repo / png)
    # forget drops the run's series with its record, in the same commit
    assert H.runbook_inproc(repo, "forget", run_id).returncode == 0
    assert not (repo / "state" / "runs" / f"{run_id}.series.jsonl").exists()
    assert f"state/runs/{run_id}.series.jsonl" in H.git(repo, "show", "--name-only", "--format=", "HEAD").split()


@pytest.mark.slow
def test_a_real_eagle_train_writes_its_curve_and_it_becomes_a_png(toy_target: Path, toy_data: Path,
                                                                  tmp_path: Path) -> None:
    plan = f"""\
---
runbook: 1
vars:
  target: {toy_target}
  data: {toy_data}
---

## Phase 0: Train the drafter

Steps:
- [ ] Train: `eagle train --model {{target}} --data {{data}} --out work/draft --epochs 2 --batch-tokens 256 --no-tensorboard`

Pass: train_loss < 100
"""
    repo = H.make_repo(tmp_path / "repo", plan)
    done = H.runbook_inproc(repo, "next", "--yes", timeout=900, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = next((repo / "state" / "runs").glob("*.json")).stem
    record = json.loads((repo / "state" / "runs" / f"{run_id}.json").read_text())
    by_name = {s["name"]: s for s in record["series"]}
    log = json.loads((repo / "work" / "draft" / "train_log.json").read_text())
    steps = sum(e["steps"] for e in log["epochs"])
    # one point per optimizer step, per-step accuracies, the learning rate, validation per epoch
    assert by_name["train_loss"]["points"] == steps and by_name["lr"]["points"] == steps
    assert {"train_acc_0", "train_loss_0", "val_loss", "val_acc_0", "val_accept_len"} <= set(by_name)
    assert by_name["val_loss"]["points"] == 2 and by_name["val_loss"]["last"] == pytest.approx(
        log["epochs"][-1]["val_loss"], rel=1e-4)
    kept = series.load(repo / "state", run_id)
    loss = series.find(kept, "train_loss")
    assert loss.x == list(range(1, steps + 1)) and all(v is not None and math.isfinite(v) for v in loss.y)
    out = json.loads(H.runbook_inproc(repo, "plot", "--metric", "train_loss", "--out", "curve.png", "--json").stdout)
    assert out["ok"] and out["result"]["points"] == steps
    _png_check(repo / "curve.png")
    assert H.git(repo, "status", "--porcelain", "--untracked-files=no") == ""  # the series file was committed


DAMAGES = {
    "x longer than y": lambda s: {**s, "x": [*s["x"], 1e9]},
    "y shorter than x": lambda s: {**s, "y": s["y"][:-3]},
    "x not numbers": lambda s: {**s, "x": ["a"] * len(s["x"])},
    "y of objects": lambda s: {**s, "y": [{}] * len(s["y"])},
    "no name": lambda s: {k: v for k, v in s.items() if k != "name"},
    "huge values": lambda s: {**s, "y": [1e308] * len(s["y"])},
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_hand_damaged_series_file_gives_a_chart_or_a_refusal_never_an_internal_error(tmp_path: Path,
                                                                                        damage: str) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    (repo / "fit.py").write_text(FIT)
    assert H.runbook_inproc(repo, "next", "--yes", "--set", "n=40").returncode == 0
    run_id = next((repo / "state" / "runs").glob("*.json")).stem
    kept = repo / "state" / "runs" / f"{run_id}.series.jsonl"
    header, line = kept.read_text().splitlines()
    kept.write_text(header + "\n" + json.dumps(DAMAGES[damage](json.loads(line))) + "\n")
    out = H.runbook_inproc(repo, "plot", "--metric", "loss", "--out", "c.png")
    H.assert_no_traceback(out)
    assert "internal error" not in out.stderr, out.stderr
    if damage == "huge values":  # still a series, but no axis spans it: refused, naming the metric and the range
        assert out.returncode == 2 and "could not draw loss" in out.stderr and "1e+308" in out.stderr, out.stderr
    else:  # the series is gone; the run has no value of `loss` either: refused, naming the metric
        assert out.returncode == 2 and "loss" in out.stderr, (out.returncode, out.stderr)


def test_a_runs_chart_of_thousands_of_runs_labels_a_few_and_draws_every_point(tmp_path: Path) -> None:
    from runbook.report.plotting import MAX_TICK_LABELS, Chart, Line, draw, tick_positions

    assert tick_positions(5) == [0, 1, 2, 3, 4]
    many = tick_positions(10_000)
    assert len(many) == MAX_TICK_LABELS and many[0] == 0 and many[-1] == 9_999
    n = 10_000
    chart = Chart(kind="runs", metric="acc", title="acc across 10000 runs",
                  lines=[Line(label="acc", x=[float(i) for i in range(n)], y=[(i % 7) / 7 for i in range(n)])],
                  xlabels=[f"run-{i}" for i in range(n)], colours=["#2a9d3f" if i % 2 else "#d1342f" for i in range(n)],
                  runs=[f"run-{i}" for i in range(n)])
    png, svg = draw(chart, tmp_path / "c.png", tmp_path / "c.svg")
    _png_check(png, curve=False)
    text = svg.read_text()
    assert f"{MAX_TICK_LABELS} of 10000 runs labelled" in text
    assert "run-0" in text and "run-9999" in text and "run-5001" not in text


THREE_STEPS = """\
---
runbook: 1
title: Three evaluations
---

## Phase 0: Evaluate three times (~1 min)

Steps:
- [ ] First: `python3 curve.py 0.1`
- [ ] Second: `python3 curve.py 0.4`
- [ ] Third: `python3 curve.py 0.7`

Pass: val_acc >= 0.5
"""

CURVE = """\
import json, os, sys
base = float(sys.argv[1])
with open(os.environ["RUNBOOK_SERIES"], "a") as f:
    for i in range(4):
        f.write(json.dumps({"step": i, "val_acc": base + i / 20}) + "\\n")
json.dump({"val_acc": base + 0.15}, open(os.environ["RUNBOOK_METRICS"], "w"))
"""


def test_a_metric_three_steps_log_is_drawn_as_three_curves_named_by_step(tmp_path: Path) -> None:
    import re

    from runbook.report.plotting import plan_chart

    repo = H.make_repo(tmp_path / "repo", THREE_STEPS)
    H.commit_files(repo, {"curve.py": CURVE}, "curve")
    assert H.runbook_inproc(repo, "next", "--yes").returncode == 0
    run_id = next((repo / "state" / "runs").glob("*.json")).stem
    out = json.loads(H.runbook_inproc(repo, "plot", "--metric", "val_acc", "--json").stdout)["result"]
    assert out["kind"] == "series" and out["curves"] == ["step-1", "step-2", "step-3"] and out["points"] == 12
    # the SVG's legend names the three steps (matplotlib writes each text it draws as a comment)
    svg = (repo / out["svg"]).read_text()
    assert 'id="legend_1"' in svg
    assert re.findall(r"<!-- (step-\d) -->", svg) == ["step-1", "step-2", "step-3"]
    # the chart model: each step's own points
    from runbook.store.workspace import Workspace

    ws = Workspace.open(str(repo / "plans" / "plan.md"))
    chart = plan_chart("val_acc", ws.runs(), ws.state)
    assert [(line.label, line.y[0]) for line in chart.lines] == [("step-1", 0.1), ("step-2", 0.4), ("step-3", 0.7)]
    assert chart.title == f"val_acc by step, run {run_id}"
    # one step's series by its step-qualified name is one curve
    assert [line.label for line in plan_chart("step-2.val_acc", ws.runs(), ws.state).lines] == [run_id]
    # two runs: the run and the step in each label
    assert H.runbook_inproc(repo, "next", "--phase", "0", "--restart", "--yes").returncode == 0
    two = json.loads(H.runbook_inproc(repo, "plot", "--metric", "val_acc", "--json").stdout)["result"]
    assert len(two["curves"]) == 6 and two["curves"][0] == f"{run_id} step-1"
