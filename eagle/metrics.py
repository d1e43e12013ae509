"""Write a command's summary metrics where `runbook next` reads them.

`runbook` gives each step a fresh JSON file named by $RUNBOOK_METRICS. Commands merge their
numbers into it (a flat object of numbers), so several commands in one step all count.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import tempfile
from pathlib import Path


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
    # Several processes (shards, DDP ranks) may merge into one file: serialise the
    # read-modify-write with a lock file, and replace the file atomically.
    with open(target.with_name(target.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current: dict[str, float] = {}
        if target.exists() and target.stat().st_size > 0:
            current = json.loads(target.read_text())
        current.update(clean)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(current, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, target)
    return target
