"""Write a command's summary metrics where `runbook next` reads them.

`runbook` gives each step a fresh JSON file named by $RUNBOOK_METRICS. Commands merge their
numbers into it (a flat object of numbers), so several commands in one step all count.
"""

from __future__ import annotations

import json
import math
import os
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
    current: dict[str, float] = {}
    if target.exists() and target.stat().st_size > 0:
        current = json.loads(target.read_text())
    current.update(clean)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, target)
    return target
