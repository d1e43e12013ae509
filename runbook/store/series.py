"""Metric series: what a step appends to `$RUNBOOK_SERIES`, and the compact copy the ledger keeps.

A step may append JSON lines to the file named by `$RUNBOOK_SERIES`
(`state/runs/<run>/<step-id>.series.jsonl`, gitignored like the logs), one object per logged step::

    {"step": 100, "train_loss": 2.31, "train_acc_0": 0.61}
    {"step": 200, "train_loss": 1.87, "train_acc_0": 0.70, "lr": 0.0003}

`step` is the x of every other name's point (without it, a point's x is its index in that name's
series); every other number is a point of the series of that name (`true`/`false` are 1 / 0;
`null`, NaN and infinities are gaps); strings, lists and objects are ignored. A line that is not a
JSON object, or whose `step` is not a number, is skipped; the run says how many and which first.

After the steps ran, runbook reads each step's file in one pass with bounded memory and keeps, per
series, at most `MAX_POINTS` points: every k-th point (k doubling as the series grows) and always
the last, values to 6 significant digits. At most `MAX_SERIES` series per run (the first names
seen), at most `MAX_LINES` lines and `MAX_BYTES` bytes per step file are read. The result is
written next to the run record as `state/runs/<run-id>.series.jsonl` (a header line, then one line
per series) and committed with it; the record lists each series with its summary
(`RunRecord.series`). Why committed: the curve is part of what the run measured, `runbook plot`
and `record --plot` must work on every clone, and the bound keeps it small: a typical `eagle train`
run (a dozen series) adds 30-60 KB, which git compresses to a few KB; a run writing no series adds
no file. A step skipped on resume keeps the series it wrote in the run it was done in.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from pydantic import BaseModel, ValidationError, model_validator

from runbook.files import NotReadable, atomic_write_text, half_character, open_regular, read_bounded
from runbook.model import RunRecord, SeriesInfo, StepResult
from runbook.store.ledger import run_dir, series_path

__all__ = ["MAX_POINTS", "Series", "collect", "find", "find_all", "load", "read_step", "save", "step_file", "summary"]

SCHEMA_VERSION = 1
MAX_POINTS = 500  # per series kept in the ledger
MAX_SERIES = 64  # per run
MAX_LINES = 5_000_000  # read per step file
MAX_BYTES = 512 * 1024 * 1024  # read per step file
MAX_LINE_BYTES = 64 * 1024
MAX_NAME = 200
COMPACT_MAX_BYTES = 16 * 1024 * 1024  # a compact file bigger than this is not read back


class Series(BaseModel):
    """One metric's curve from one step: points (x, y), y None for a gap."""

    name: str
    step_id: str
    x: list[float]
    y: list[float | None]
    points: int  # points the step wrote (kept: len(x))
    every: int = 1  # every k-th point was kept (and the last)

    @model_validator(mode="after")
    def _paired(self) -> Series:
        # a hand-damaged kept file with an x for no y (or a y for no x) is not a series: it is skipped
        # on load like any other line that does not validate, instead of breaking the chart
        if len(self.x) != len(self.y):
            raise ValueError(f"{len(self.x)} x values for {len(self.y)} y values")
        return self


class _Header(BaseModel):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    max_points: int = MAX_POINTS
    problems: list[str] = []  # lines skipped, files cut short


def step_file(state_dir: str | os.PathLike[str], run_id: str, step_id: str) -> Path:
    """Where a step's raw series go: the `$RUNBOOK_SERIES` of that step (beside its log)."""
    return run_dir(state_dir, run_id) / f"{step_id}.series.jsonl"


class _Thin:
    """Keep every `every`-th point of a stream, at most MAX_POINTS, plus the last one."""

    __slots__ = ("x", "y", "every", "seen", "last")

    def __init__(self) -> None:
        self.x: list[float] = []
        self.y: list[float | None] = []
        self.every = 1
        self.seen = 0
        self.last: tuple[float, float | None] | None = None

    def add(self, x: float, y: float | None) -> None:
        if self.seen % self.every == 0:
            self.x.append(x)
            self.y.append(y)
            if len(self.x) > MAX_POINTS:
                self.x, self.y = self.x[::2], self.y[::2]
                self.every *= 2
        self.seen += 1
        self.last = (x, y)

    def points(self) -> tuple[list[float], list[float | None]]:
        x, y = list(self.x), list(self.y)
        if self.last is not None and (self.seen - 1) % self.every != 0:
            if len(x) >= MAX_POINTS:
                x, y = x[:-1], y[:-1]
            x.append(self.last[0])
            y.append(self.last[1])
        return x, y


def _round(v: float) -> float:
    return float(f"{v:.6g}")


def _number(v: object) -> float | None | bool:
    """A point's value: a float, None for a gap, False when the value is not a point at all."""
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        try:
            f = float(v)
        except OverflowError:
            return None
        return _round(f) if math.isfinite(f) else None
    if v is None:
        return None
    return False


def read_step(path: str | os.PathLike[str], step_id: str) -> tuple[list[Series], str | None]:
    """The series of one step's `$RUNBOOK_SERIES` file (none when it does not exist), and a
    problem line when lines were skipped or the file was cut short."""
    p = Path(path)
    try:
        if not p.is_file():
            return [], None if not p.exists() else f"{step_id}: $RUNBOOK_SERIES is not a regular file; ignored"
        handle = open_regular(p)  # swapped for a FIFO after the check: refused, never waited on
    except NotReadable:
        return [], f"{step_id}: $RUNBOOK_SERIES is not a regular file; ignored"
    except OSError as exc:
        return [], f"{step_id}: $RUNBOOK_SERIES could not be read ({exc.strerror or exc})"
    thin: dict[str, _Thin] = {}
    skipped, first_bad, dropped = 0, None, 0
    cut = None
    read = 0
    with handle:
        for n, raw in enumerate(handle, 1):
            read += len(raw)
            if n > MAX_LINES or read > MAX_BYTES:
                cut = f"read only its first {n - 1:,} lines"
                break
            if len(raw) > MAX_LINE_BYTES:
                skipped += 1
                first_bad = first_bad or f"line {n}: longer than {MAX_LINE_BYTES // 1024} KiB"
                continue
            text = raw.strip()
            if not text:
                continue
            try:
                data = json.loads(text)
            except (ValueError, RecursionError):
                skipped += 1
                first_bad = first_bad or f"line {n}: not JSON"
                continue
            if not isinstance(data, dict):
                skipped += 1
                first_bad = first_bad or f"line {n}: not a JSON object"
                continue
            half = next(filter(None, map(half_character, data)), None)  # JSON's names are str
            if half is not None:  # no run record could hold that name
                skipped += 1
                first_bad = first_bad or f"line {n}: a name holds {half!r}, half of a character"
                continue
            x = data.get("step")
            if x is not None:
                x = _number(x)
                if x is None or x is False:
                    skipped += 1
                    first_bad = first_bad or f"line {n}: `step` is not a number"
                    continue
            for name, value in data.items():
                if name == "step" or not isinstance(name, str) or not name or len(name) > MAX_NAME:
                    continue
                y = _number(value)
                if y is False:
                    continue
                series = thin.get(name)
                if series is None:
                    if len(thin) >= MAX_SERIES:
                        dropped += 1
                        continue
                    series = thin[name] = _Thin()
                series.add(x if x is not None else float(series.seen), y)
    out = []
    for name, t in thin.items():
        xs, ys = t.points()
        out.append(Series(name=name, step_id=step_id, x=xs, y=ys, points=t.seen, every=t.every))
    notes = []
    if skipped:
        notes.append(f"skipped {skipped:,} line(s) ({first_bad}); write one JSON object per line, "
                     '{"step": N, "name": value}')
    if dropped:
        notes.append(f"kept the first {MAX_SERIES} series names, ignored {dropped:,} value(s) of others")
    if cut:
        notes.append(cut)
    return out, (f"{step_id}: $RUNBOOK_SERIES: " + "; ".join(notes)) if notes else None


def _compact(v: float) -> float | int:
    return int(v) if v.is_integer() and abs(v) < 1e15 else v


def summary(series: list[Series]) -> list[SeriesInfo]:
    out = []
    for s in series:
        finite = [v for v in s.y if v is not None]
        out.append(SeriesInfo(
            name=s.name, step_id=s.step_id, points=s.points, kept=len(s.x),
            first_x=s.x[0] if s.x else None, last_x=s.x[-1] if s.x else None,
            last=finite[-1] if finite else None, min=min(finite) if finite else None,
            max=max(finite) if finite else None,
        ))
    return out


def save(state_dir: str | os.PathLike[str], run_id: str, series: list[Series], problems: list[str]) -> Path | None:
    """Write the run's compact series file (atomically); None (and no file) when there are none."""
    if not series:
        return None
    path = series_path(state_dir, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [_Header(run_id=run_id, problems=problems).model_dump_json()]
    lines += [json.dumps({**s.model_dump(), "x": [_compact(v) for v in s.x]}, separators=(",", ":"), allow_nan=False)
              for s in series]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def load(state_dir: str | os.PathLike[str], run_id: str) -> list[Series]:
    """The series the ledger keeps for a run ([] when it has none or the file cannot be used)."""
    path = series_path(state_dir, run_id)
    if not path.is_file():
        return []
    try:
        text = read_bounded(path, COMPACT_MAX_BYTES).decode("utf-8")
    except (OSError, NotReadable, UnicodeDecodeError):
        return []
    out = []
    for line in text.splitlines()[1:]:
        try:
            out.append(Series.model_validate_json(line))
        except (ValidationError, ValueError):
            continue
    return out


def collect(state_dir: str | os.PathLike[str], run_id: str, results: list[StepResult],
            last: RunRecord | None = None) -> tuple[list[Series], list[str]]:
    """The series of a run's steps, in step order: read from the files the steps that ran wrote;
    a step skipped on resume keeps those it wrote in `last` (the run it was done in)."""
    earlier = load(state_dir, last.run_id) if last is not None else []
    series: list[Series] = []
    problems: list[str] = []
    for result in results:
        if result.skipped:
            series += [s for s in earlier if s.step_id == result.step_id]
            continue
        found, problem = read_step(step_file(state_dir, run_id, result.step_id), result.step_id)
        series += found
        if problem:
            problems.append(problem)
    if len({s.name for s in series}) > MAX_SERIES:
        names = list(dict.fromkeys(s.name for s in series))[:MAX_SERIES]
        series = [s for s in series if s.name in names]
        problems.append(f"kept the series of the first {MAX_SERIES} names")
    return series, problems


def find_all(series: list[Series], name: str) -> list[Series]:
    """Every series called `name`, in step order: one per step that wrote it (`step-3.train_loss`:
    the one step-3 wrote)."""
    step, dot, rest = name.partition(".")
    if dot and step.startswith("step-"):
        return [s for s in series if s.step_id == step and s.name == rest]
    return [s for s in series if s.name == name]


def find(series: list[Series], name: str) -> Series | None:
    """The series called `name` (`step-3.train_loss`: the one step-3 wrote); the last step's wins
    (a chart draws them all: `find_all`)."""
    matches = find_all(series, name)
    return matches[-1] if matches else None
