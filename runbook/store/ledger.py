"""The run ledger: one JSON file per run at `state/runs/<run-id>.json` (a `RunRecord`).

Logs and metrics files of a run live in `state/runs/<run-id>/` (gitignored); the JSON keeps the
last lines of each log (at most 20 lines and 8 KiB: a log without newlines cannot bloat
the record). Run ids are `YYYYMMDD-HHMMSS-xxxx`: UTC time plus random hex, so they sort
by time and do not collide across machines. Runs are ordered by their start time (to the
microsecond), then by id.

A ledger file that cannot be read does not hide the others: `load_runs` skips it and reports it
through `problems`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import secrets
from pathlib import Path

from pydantic import ValidationError

from runbook.files import atomic_write_text
from runbook.formatting import utc_now
from runbook.model import RunRecord

RUNS_DIR = "runs"
LOG_TAIL_LINES = 20
LOG_TAIL_BYTES = 8 * 1024  # the most of a log a run record keeps
LOG_LINE_CHARS = 400


def new_run_id(now: _dt.datetime | None = None) -> str:
    moment = (now or utc_now()).astimezone(_dt.timezone.utc)
    return f"{moment:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def runs_dir(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / RUNS_DIR


def run_path(state_dir: str | os.PathLike[str], run_id: str) -> Path:
    return runs_dir(state_dir) / f"{run_id}.json"


def series_path(state_dir: str | os.PathLike[str], run_id: str) -> Path:
    """The run's metric series, committed next to its record (runbook/store/series.py)."""
    return runs_dir(state_dir) / f"{run_id}.series.jsonl"


def run_dir(state_dir: str | os.PathLike[str], run_id: str) -> Path:
    """Where a run's logs, metrics files and artifacts go (gitignored)."""
    return runs_dir(state_dir) / run_id


def save_run(state_dir: str | os.PathLike[str], record: RunRecord) -> Path:
    """Write (or rewrite) the run's JSON atomically; returns its path."""
    path = run_path(state_dir, record.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, record.model_dump_json(indent=2) + "\n")
    return path


RECORD_MAX_BYTES = 64 * 1024 * 1024


def load_run(path: str | os.PathLike[str]) -> RunRecord:
    """One run record; raises OSError, ValueError (not JSON, not UTF-8, not a regular file, too
    big, nested too deep) or pydantic's ValidationError."""
    return parse_run(read_record_bytes(path))


def read_record_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a run record file (a regular file of at most RECORD_MAX_BYTES); OSError or ValueError."""
    from runbook.files import read_bounded

    return read_bounded(path, RECORD_MAX_BYTES)


def parse_run(data: bytes) -> RunRecord:
    """A run record from its file's bytes; ValueError or ValidationError as `load_run`."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return RunRecord.model_validate(parsed)


def unreadable_text(path: str | os.PathLike[str], exc: BaseException) -> str:
    """The problem line for a ledger file that is not a readable run record."""
    return f"{path}: skipped, not a readable run record ({first_line(exc)})"


def first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _order(record: RunRecord) -> tuple[str, str]:
    return (record.started, record.run_id)


def load_runs(
    state_dir: str | os.PathLike[str],
    plan: str | None = None,
    phase: str | None = None,
    problems: list[str] | None = None,
) -> list[RunRecord]:
    """All runs, oldest first, optionally only those of `plan` (repo-relative) and `phase` (id).

    Unreadable files are skipped; a line naming each goes to `problems` when given.
    """
    folder = runs_dir(state_dir)
    if not folder.is_dir():
        return []
    records: list[RunRecord] = []
    for path in sorted(folder.glob("*.json")):
        try:
            record = load_run(path)
        except (OSError, ValueError, ValidationError) as exc:  # ValueError: JSON, UTF-8, size
            if problems is not None:
                problems.append(unreadable_text(path, exc))
            continue
        if plan is not None and record.plan != plan:
            continue
        if phase is not None and record.phase != phase:
            continue
        records.append(record)
    records.sort(key=_order)
    return records


def tail_lines(
    path: str | os.PathLike[str],
    n: int = LOG_TAIL_LINES,
    max_bytes: int = LOG_TAIL_BYTES,
    line_chars: int = LOG_LINE_CHARS,
) -> list[str]:
    """The last `n` lines of a text log (decoded leniently, without line ends), bounded by bytes.

    Only the last `max_bytes` of the file are read, so a log without newlines (a progress bar,
    one long line) cannot put megabytes into a run record; `\r` ends a line too (a tqdm bar shows
    its last state), and a line longer than `line_chars` keeps its end, marked with `…`."""
    from runbook.files import NotReadable, open_regular

    try:
        with open_regular(path) as handle:  # a step that swapped its log for a FIFO cannot hang us
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            handle.seek(start)
            data = handle.read(max_bytes)
    except (OSError, NotReadable):
        return []
    text = data.decode("utf-8", "replace")
    lines = re.split(r"\r\n|\r|\n", text)
    if lines and lines[-1] == "":
        lines.pop()
    if start > 0 and lines:
        lines[0] = "…" + lines[0]  # cut: the read began inside this line
    out = []
    for line in lines[-n:]:
        out.append(line if len(line) <= line_chars else "…" + line[-(line_chars - 1) :])
    return out
