"""eagle.metrics: what every eagle command writes to $RUNBOOK_METRICS."""

from __future__ import annotations

import json
import math
from multiprocessing import get_context
from pathlib import Path

import pytest

from eagle.metrics import write_metrics


def _write_one(args: tuple[str, int]) -> None:
    path, i = args
    write_metrics({f"rank{i}_tokens": i}, path)


def test_merges_into_existing_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.json"
    path.write_text("{}")
    monkeypatch.setenv("RUNBOOK_METRICS", str(path))
    write_metrics({"a": 1.5, "b": 2})
    write_metrics({"b": 3})
    assert json.loads(path.read_text()) == {"a": 1.5, "b": 3}


def test_no_target_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNBOOK_METRICS", raising=False)
    assert write_metrics({"a": 1}) is None


def test_non_finite_is_refused_and_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    write_metrics({"loss": 1.0}, path)
    with pytest.raises(ValueError, match="non-finite"):
        write_metrics({"loss": math.nan}, path)
    assert json.loads(path.read_text()) == {"loss": 1.0}


def test_parallel_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    with get_context("fork").Pool(6) as pool:
        pool.map(_write_one, [(str(path), i) for i in range(48)])
    assert json.loads(path.read_text()) == {f"rank{i}_tokens": i for i in range(48)}
    assert not list(tmp_path.glob("*.tmp"))
