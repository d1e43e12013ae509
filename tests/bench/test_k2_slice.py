"""bench/k2_slice.py at tiny widths on the CPU: the same code path the H200 runs at Kimi-K2's widths
(the slice built from DeepSeek-V3's config class, eagle's capture engine, the generic decoder, the K2
drafter's training step), every section giving its row."""

from __future__ import annotations

import json
from pathlib import Path

from bench import k2_slice


def test_the_smoke_run_gives_every_row_and_the_capture_equals_transformers(tmp_path: Path) -> None:
    rc = k2_slice.main(["--smoke", "--out", str(tmp_path), "--steps", "2", "--warmup", "1"])
    doc = json.loads((tmp_path / "k2_slice.json").read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    assert doc["meta"]["experts_implementation"] == "grouped_mm"  # no Python loop over the experts
    assert rows["slice built on the device"]["value"] > 0
    for name in ("naive transformers forward (output_hidden_states)", "eagle capture engine (extract_rows, compute only; as eagle extract runs it)",
                 "generic decoder step (batch 1, DynamicCache)", "eagle train step, per-document attention (now)"):
        assert rows[name]["value"] and rows[name]["value"] > 0, rows[name]
    assert rows["capture vs output_hidden_states at the aux layers (max abs diff)"]["value"] < 1e-5
    layers = rows["time per layer (naive forward, one batch)"]["note"]
    assert "layer 0 (dense)" in layers and "layer 2 (MoE)" in layers
    assert "one llama layer, hidden 64" in rows["drafter built"]["note"] and "draft vocab 64" in rows["drafter built"]["note"]
    # speculators' own Trainer needs an accelerator: on the CPU its row says so, and only it fails
    failed = [r["name"] for r in doc["rows"] if r["value"] is None]
    assert failed == ["speculators Trainer"] and "accelerator" in rows["speculators Trainer"]["note"]
    assert rc == 2 and (tmp_path / "k2_slice.md").read_text().count("\n|") == len(doc["rows"]) + 2  # header, rule, a line a row
