"""Write a command's summary metrics where `runbook next` reads them.

`runbook` gives each step a fresh JSON file named by $RUNBOOK_METRICS. Commands merge their
numbers into it (a flat object of numbers), so several commands in one step all count.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from pathlib import Path

from eagle.fsutil import atomic_write_json, read_json_file, regular_file


def write_metrics(metrics: dict[str, float], path: str | os.PathLike[str] | None = None) -> Path | None:
    """Merge `metrics` into the JSON file at `path` or $RUNBOOK_METRICS; return the path written.

    Non-finite numbers are refused (a NaN loss must not pass a criterion silently).
    """
    target = path if path is not None else os.environ.get("RUNBOOK_METRICS")
    if not target:
        return None
    clean: dict[str, float] = {}
    for name, value in metrics.items():
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"metric {name!r} is {number}; refusing to record a non-finite value")
        clean[name] = int(number) if isinstance(value, (bool, int)) else number
    target = Path(target)
    fix = "point $RUNBOOK_METRICS at a regular file"
    lock_path = target.with_name(target.name + ".lock")
    regular_file(lock_path, "lock file", fix)  # SpecialFileError (exit 2): a FIFO's open would block
    # Several processes (shards, DDP ranks) may merge into one file: serialise the
    # read-modify-write with a lock file, and replace the file atomically.
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current: dict[str, float] = {}
        if regular_file(target, "metrics file", fix) and target.stat().st_size > 0:  # a FIFO, a device: refused
            current = read_json_file(target)
        current.update(clean)
        atomic_write_json(target, current, sort_keys=True)
    return target


# ---- metric series ($RUNBOOK_SERIES) ----------------------------------------------------------------

# TensorBoard tags (eagle/train/step_log.py) -> series names, so that a series and the summary metric of
# the same quantity share a name (`val_loss`, `val_acc_0`, `val_accept_len`, `train_tok_s`).
_SERIES_NAMES = {"train/loss": "train_loss", "train/lr": "lr", "val/loss": "val_loss",
                 "val/accept_len": "val_accept_len", "speed/train_tok_s": "train_tok_s"}


def series_name(tag: str) -> str:
    """`train/acc_step1` -> `train_acc_1`, `val/acc_step0` -> `val_acc_0`, `train/loss` -> `train_loss`."""
    if tag in _SERIES_NAMES:
        return _SERIES_NAMES[tag]
    head, _, tail = tag.partition("/")
    for kind in ("acc", "loss"):
        if tail.startswith(f"{kind}_step"):
            return f"{head}_{kind}_{tail[len(kind) + 5:]}"
    return tag.replace("/", "_")


class SeriesWriter:
    """Appends `{"step": N, name: value, ...}` lines to $RUNBOOK_SERIES (runbook keeps them as the
    run's metric series, runbook/store/series.py). Non-finite values are written as null (a gap).

    `from_env()` gives None when the variable is not set (not run by runbook) or `enabled` is false
    (a DDP rank other than the main one), so callers write `if writer: writer.write(...)`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    @classmethod
    def from_env(cls, enabled: bool = True) -> SeriesWriter | None:
        target = os.environ.get("RUNBOOK_SERIES")
        if not enabled or not target:
            return None
        try:
            return cls(target)
        except OSError:
            return None  # the curve is a nicety: never fail a training run over it

    def write(self, step: int, values: dict[str, float]) -> None:
        line: dict[str, float | None] = {"step": int(step)}
        for name, value in values.items():
            number = float(value)
            line[name] = number if math.isfinite(number) else None
        self._handle.write(json.dumps(line, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()
