"""How runbook writes numbers and times: metric values, durations and timestamps.

The one home for all three: criteria explanations, results tables, status lines, milestones, the
brief (the templates' `num` filter), history and diff call these, so a value reads the same
everywhere it appears. Times: the ledger and live state write `iso` (UTC, microseconds, `Z`:
sortable as text), the --json views and locks `iso_utc` (to the second), people read `minute_text`
("2026-11-29 14:30", with " UTC" after it).
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from typing import overload

__all__ = ["format_took", "format_value", "iso", "iso_utc", "minute_text", "parse_iso", "parse_utc", "utc_now"]


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


# ---- times ---------------------------------------------------------------------------------------

_NOTES_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2})(?::(\d{2}))?(?:\.\d+)?\s*(?:UTC|Z)?$")


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def iso(moment: _dt.datetime) -> str:
    """ISO 8601 UTC with microseconds and a `Z`: sortable as text (the ledger's and live state's times)."""
    return moment.astimezone(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> _dt.datetime:
    """The moment an ISO 8601 text names (`Z` or an offset); ValueError when it is not one."""
    return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@overload
def iso_utc(value: str | _dt.datetime) -> str: ...
@overload
def iso_utc(value: None) -> None: ...
@overload
def iso_utc(value: str | _dt.datetime | None) -> str | None: ...
def iso_utc(value: str | _dt.datetime | None) -> str | None:
    """Any time runbook writes (ledger ISO with microseconds, lock ISO, notes "2026-11-29 14:30
    UTC") as ISO 8601 UTC to the second: "2026-11-29T14:30:00Z". Unparsable text is returned as is."""
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=_dt.timezone.utc)
        return moment.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    text = value.strip()
    try:
        return iso_utc(parse_iso(text))
    except ValueError:
        pass
    match = _NOTES_TIME.match(text)
    if match:
        return f"{match.group(1)}T{match.group(2)}:{match.group(3) or '00'}Z"
    return text


def parse_utc(value: str | None) -> _dt.datetime | None:
    """The moment an `iso_utc`-able text names, None when it names none."""
    text = iso_utc(value)
    if not text:
        return None
    try:
        return parse_iso(text)
    except ValueError:
        return None


def parse_utc_precise(value: str | None) -> _dt.datetime | None:
    """The moment an ISO 8601 text names, to the text's own precision (the ledger's and the notes'
    microseconds kept, where `parse_utc` rounds to the second); None when it names none."""
    if not value:
        return None
    try:
        moment = parse_iso(value.strip())
    except ValueError:
        return parse_utc(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=_dt.timezone.utc)


def minute_text(value: str | _dt.datetime | None) -> str:
    """A time as people read it, to the minute, in UTC: "2026-11-29 14:30" (the callers say " UTC"
    where the reader needs it); `-` for none, the text's first 16 characters when it is not a time."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        try:
            moment = parse_iso(value)
        except ValueError:
            return value[:16].replace("T", " ")
    else:
        moment = value
    if moment.tzinfo is not None:
        moment = moment.astimezone(_dt.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M")
