"""`eagle train` under torchrun with 2 CPU processes (gloo): trains, rank 0 writes, result close to 1 process.

The torchrun runs are processes (torchrun and its two ranks); the single-process runs (`eagle train`,
`python -m bench.step_times`) run their `main` in the test's process (helpers.eagle_inproc, module_inproc:
a child's argv, environment, cwd and output, the same CompletedProcess), which has torch, transformers and
speculators imported already: ~7 s of CPU a run spent on imports in a child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import _train_data as td
import helpers as H
import pytest

from eagle.serving.server import free_port


def _train(cmd: list[str] | Callable[..., subprocess.CompletedProcess], out: Path, metrics: Path) -> dict:
    """`cmd --out OUT` run as a process, or with `cmd` a function (H.eagle_inproc, a partial of
    H.module_inproc) in this one; the metrics it wrote."""
    env = {**os.environ, "RUNBOOK_METRICS": str(metrics), "OMP_NUM_THREADS": "1"}
    if callable(cmd):
        res = cmd("--out", str(out), env=env, timeout=600)
    else:
        res = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    return json.loads(metrics.read_text())


def _inproc(run: Callable[..., subprocess.CompletedProcess], *args: str) -> Callable[..., subprocess.CompletedProcess]:
    """`run(*args, *more, **kw)` later: eagle's or a module's main in this process, `--out` appended by _train."""
    return lambda *more, **kw: run(*args, *more, **kw)


ARGS = ["--epochs", "3", "--batch-tokens", "64", "--val-fraction", "0.2", "--device", "cpu", "--lr", "3e-3"]


def _torchrun(module: list[str]) -> list[str]:
    torchrun = Path(sys.executable).with_name("torchrun")
    port = str(free_port())  # not a fixed one: another test session may run torchrun at the same time
    return [str(torchrun), "--nproc-per-node", "2", "--master-port", port, "-m", *module]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], dict]:
    """One plain `eagle train` under torchrun (2 processes): its directory, arguments and metrics."""
    tmp = tmp_path_factory.mktemp("ddp")
    target = td.make_target(tmp / "target")
    data = td.make_data(target, tmp / "data", n=20, length=32)
    args = ["train", "--model", str(target), "--data", str(data), *ARGS]
    return tmp, args, _train(_torchrun(["eagle.cli", *args]), tmp / "ddp", tmp / "ddp.json")


@pytest.mark.slow
def test_ddp_two_processes_on_cpu(ddp_run: tuple[Path, list[str], dict]) -> None:
    from eagle.drafter import checkpoint

    tmp_path, args, ddp = ddp_run
    single = _train(_inproc(H.eagle_inproc, *args), tmp_path / "one", tmp_path / "one.json")

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


@pytest.mark.slow
def test_step_times_bench_keeps_ddp_math_and_times_every_step(ddp_run: tuple[Path, list[str], dict]) -> None:
    """bench/step_times.py (issue 24's breakdown of a DDP step) wraps eagle's CLI and replaces DDP's
    all-reduce by a timed comm hook: the training must stay what plain DDP computes, and every
    optimizer step of both ranks must come back with its times (bench.harness reads and sums them up)."""
    from bench import harness

    tmp_path, args, _ = ddp_run
    times = tmp_path / "step-times"
    _train(_torchrun(["bench.step_times", "--out", str(times), "--", *args]), tmp_path / "timed", tmp_path / "t.json")
    plain = json.loads((tmp_path / "ddp" / "train_log.json").read_text())["epochs"]
    timed = json.loads((tmp_path / "timed" / "train_log.json").read_text())["epochs"]
    for key in ("train_loss", "val_loss"):
        assert [e[key] for e in timed] == pytest.approx([e[key] for e in plain], rel=1e-5, abs=1e-6), key

    ranks = harness.read(times)
    assert len(ranks) == 2
    steps = sum(e["steps"] for e in plain) // 2  # optimizer steps of each rank: one batch a rank a step
    assert [len(r) for r in ranks] == [steps, steps]
    for rows in ranks:
        assert all(s["compute_ms"] > 0 and s["comm_ms"] >= 0 and s["opt_ms"] > 0 for s in rows)
        assert all(s["wall_ms"] >= s["compute_ms"] + s["comm_ms"] for s in rows[:-1]) and rows[-1]["wall_ms"] is None
        assert all(len(s["grid"]) == 2 for s in rows)  # shape buckets' [documents, width]
    summary = harness.summarise(ranks)
    assert summary["world"] == 2 and summary["slowest_compute_ms"] >= summary["per_rank"][0]["compute_ms"]
    assert "ranks' compute apart" in harness.describe(summary)


@pytest.mark.slow
def test_step_times_leave_the_shape_warm_up_out_of_step_one(ddp_run: tuple[Path, list[str], dict]) -> None:
    """The warm-up runs a backward per pack shape before step 1 and no optimizer step follows them:
    their marks must not be counted as step 1's (its compute once held the warm-up's too)."""
    from bench import harness

    tmp_path, args, _ = ddp_run
    times = tmp_path / "warm-times"
    cmd = _inproc(H.module_inproc, "bench.step_times", "--out", str(times), "--", *args, "--shape-buckets",
                  "--warm-shapes")
    _train(cmd, tmp_path / "warm", tmp_path / "warm.json")
    assert json.loads((tmp_path / "warm" / "train_log.json").read_text())["warmup"] is not None
    (rows,) = harness.read(times)
    assert rows and all(s["batches"] == 1 for s in rows)
