"""bench/k2_train_cli.py at tiny widths on the CPU: the code path the H200 runs at the K2 drafter's widths
(a 61-layer DeepSeek-V3 config with only the drafter's three target tensors on disk, data written as prepare and
extract write it, `eagle vocab`, then `eagle train` in its own process timed from the outside)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import k2_train_cli


@pytest.mark.slow  # trains (eagle train in a subprocess)
def test_the_smoke_run_trains_from_the_files_and_times_it(tmp_path: Path) -> None:
    rc = k2_train_cli.main(["--smoke", "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "w"),
                            "--batch-tokens", "128", "--epochs", "1"])
    doc = json.loads((tmp_path / "out" / "k2_train_cli.json").read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    assert rc == 0 and all(r["value"] is not None for r in doc["rows"]), doc["rows"]
    # the target on disk is the 61-layer config and three tensors, all that eagle train reads of a K2 checkpoint
    cfg = json.loads((tmp_path / "w" / "target" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 61 and cfg["model_type"] == "deepseek_v3"
    meta = json.loads((tmp_path / "w" / "data" / "eagle_data.json").read_text())
    assert meta["layer_ids"] == [2, 30, 58] and meta["num_samples"] == 8
    to_training = rows["B=128: process start to 'training ...' (imports, target rows, data)"]["value"]
    assert 0 < to_training <= rows["B=128: time to step 1"]["value"] < rows["B=128: whole process"]["value"]
    assert rows["B=128: steady training"]["value"] > 0
    assert rows["largest --batch-tokens that trained"]["value"] == 128
    draft = json.loads((tmp_path / "w" / "draft-128" / "train_log.json").read_text())
    assert draft["args"]["batch_tokens"] == 128 and len(draft["epochs"]) == 1
