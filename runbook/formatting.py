"""How runbook writes numbers for people: metric values and durations.

The one home for both: criteria explanations, results tables, status lines, milestones, the brief
(the templates' `num` filter), history and diff all call these, so a value reads the same
everywhere it appears.
"""

from __future__ import annotations

import math

__all__ = ["format_took", "format_value"]


def format_value(value: float | str | None) -> str:
    """A metric value: integers without a fraction (2912.0 -> "2912"), others to 6 significant
    digits (1.3125 -> "1.3125", 1e-05 -> "1e-05"), strings as they are (at most 60 characters),
    `-` for none."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value if len(value) <= 60 else value[:57] + "..."
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def format_took(seconds: float | None) -> str:
    """A duration: `5s`, `4m12s`, `2h01m`; `-` for none."""
    if seconds is None:
        return "-"
    total = int(round(seconds))
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{(total % 3600) // 60:02d}m"
