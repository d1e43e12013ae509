"""Run ids and the JSON ledger."""

from __future__ import annotations

import datetime as dt
import re

from helpers import run_record

from runbook.store.index import find_run
from runbook.store.ledger import load_runs, new_run_id, save_run, tail_lines


def _rec(run_id, phase="phase-0", started="2026-01-01T00:00:00.000000Z", verdict="pass"):
    return run_record(
        run_id=run_id, plan="plans/p.md", plan_blob="0" * 40, phase=phase, phase_label="0",
        phase_text_hash="h", started=started, verdict=verdict,
    )


def test_run_ids_sortable_and_unique():
    t = dt.datetime(2026, 11, 29, 14, 30, 12, tzinfo=dt.timezone.utc)
    rid = new_run_id(t)
    assert re.fullmatch(r"20261129-143012-[0-9a-f]{4}", rid)
    ids = {new_run_id(t) for _ in range(200)}
    assert len(ids) > 150
    assert new_run_id(t + dt.timedelta(seconds=1)) > rid


def test_save_load_filter_order_and_bad_file(tmp_path):
    save_run(tmp_path, _rec("20260101-000000-ffff", started="2026-01-01T00:00:00.000002Z"))
    save_run(tmp_path, _rec("20260101-000000-0000", started="2026-01-01T00:00:00.000009Z", phase="phase-1"))
    (tmp_path / "runs" / "broken.json").write_text("{not json")
    problems = []
    runs = load_runs(tmp_path, problems=problems)
    # same second: ordered by start time, not by the random suffix
    assert [r.run_id for r in runs] == ["20260101-000000-ffff", "20260101-000000-0000"]
    assert len(problems) == 1 and "broken.json" in problems[0]
    assert [r.phase for r in load_runs(tmp_path, phase="phase-1")] == ["phase-1"]
    assert load_runs(tmp_path, plan="other.md") == []
    assert find_run(tmp_path, "last").run_id == "20260101-000000-0000"
    assert find_run(tmp_path, "20260101-000000-f").run_id == "20260101-000000-ffff"


def test_tail_lines(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"".join(b"line %d\r\n" % i for i in range(50)) + b"\xff bad")
    tail = tail_lines(log, 3)
    assert tail == ["line 48", "line 49", "\ufffd bad"]
    assert tail_lines(tmp_path / "missing.log") == []
