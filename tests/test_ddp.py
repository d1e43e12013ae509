"""`eagle train` under torchrun with 2 CPU processes (gloo): trains, rank 0 writes, result close to 1 process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _train_data as td
import pytest

from eagle.serve import free_port


def _train(cmd: list[str], out: Path, metrics: Path) -> dict:
    env = {**os.environ, "RUNBOOK_METRICS": str(metrics), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    return json.loads(metrics.read_text())


@pytest.mark.slow
def test_ddp_two_processes_on_cpu(tmp_path: Path) -> None:
    from eagle import checkpoint

    target = td.make_target(tmp_path / "target")
    data = td.make_data(target, tmp_path / "data", n=20, length=32)
    args = ["train", "--model", str(target), "--data", str(data), "--epochs", "3", "--batch-tokens", "64",
            "--val-fraction", "0.2", "--device", "cpu", "--lr", "3e-3"]
    torchrun = Path(sys.executable).with_name("torchrun")
    port = str(free_port())  # not a fixed one: another test session may run torchrun at the same time
    ddp = _train([str(torchrun), "--nproc-per-node", "2", "--master-port", port, "-m", "eagle.cli", *args],
                 tmp_path / "ddp", tmp_path / "ddp.json")
    single = _train([sys.executable, "-m", "eagle.cli", *args], tmp_path / "one", tmp_path / "one.json")

    log = json.loads((tmp_path / "ddp" / "train_log.json").read_text())
    assert log["args"]["world_size"] == 2
    one_log = json.loads((tmp_path / "one" / "train_log.json").read_text())
    # each DDP step takes one batch per process: half the steps of one process over the same data
    assert log["epochs"][0]["steps"] == one_log["epochs"][0]["steps"] // 2 * 2
    losses = [e["train_loss"] for e in log["epochs"]]
    assert losses[-1] < losses[0]
    checkpoint.load_draft_state(tmp_path / "ddp")  # rank 0 wrote a valid checkpoint
    assert sorted(p.name for p in (tmp_path / "ddp" / "checkpoints").iterdir()) == ["epoch-1", "epoch-2", "epoch-3"]
    # same data, same epochs: the validation loss lands near the single-process one
    print({"ddp": ddp, "single": single})
    assert abs(ddp["val_loss"] - single["val_loss"]) < 0.25 * single["val_loss"]
