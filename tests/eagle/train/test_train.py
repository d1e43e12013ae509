"""`eagle train`: exact resume, --init-from checks, metrics, and a useful drafter on the toy target."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import _train_data as td
import pytest
import torch
from click.testing import CliRunner


def test_val_accept_len_and_step_accuracies() -> None:
    from eagle.train.steps import step_accuracies, val_accept_len

    assert val_accept_len([]) == 1.0
    assert val_accept_len([1.0, 1.0, 1.0]) == 4.0
    assert val_accept_len([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    # cumulative "all steps so far right" counts -> per-step conditional accuracies
    assert step_accuracies([8, 4, 1], [10, 10, 10]) == pytest.approx([0.8, 0.5, 0.25])


def test_pack_and_split_are_deterministic() -> None:
    from eagle.train.dataset import pack_batches, shard, split_indices

    train, val = split_indices(20, 0.1, seed=3)
    assert len(val) == 2 and sorted(train + val) == list(range(20))
    assert split_indices(20, 0.1, seed=3) == (train, val)
    lengths = [11] * 20
    b1 = pack_batches(train, lengths, 25, seed=0, epoch=1)
    assert b1 == pack_batches(train, lengths, 25, seed=0, epoch=1)
    assert b1 != pack_batches(train, lengths, 25, seed=0, epoch=2)
    assert all(len(b) == 2 for b in b1[:-1]) and sorted(i for b in b1 for i in b) == train
    assert shard([[0], [1], [2]], 1, 2) == [[1]] and shard([[0], [1], [2]], 0, 2) == [[0]]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return td.make_small(tmp_path_factory.mktemp("train"))


def _args(target: Path, data: Path, out: Path, **kw):
    return td.train_args(target, data, out, **{"epochs": 2, "batch_tokens": 128, "lr": 3e-3, **kw})


@pytest.mark.slow
def test_resume_gives_the_same_losses(small: tuple[Path, Path], tmp_path: Path) -> None:
    from eagle.drafter import checkpoint
    from eagle.train.trainer import train

    target, data = small
    full = train(_args(target, data, tmp_path / "full"), echo=False)
    # a run interrupted after epoch 1: only that epoch's state exists; --resume runs epoch 2 from it
    (tmp_path / "part" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full" / "checkpoints" / "epoch-1", tmp_path / "part" / "checkpoints" / "epoch-1")
    resumed = train(_args(target, data, tmp_path / "part", resume=True), echo=False)
    assert [r.epoch for r in resumed.epochs] == [1, 2]
    a, b = full.epochs[1], resumed.epochs[1]
    assert (a.train_loss, a.val_loss, a.val_acc) == (b.train_loss, b.val_loss, b.val_acc)
    assert full.epochs[1].train_loss < full.epochs[0].train_loss
    sa, sb = checkpoint.load_draft_state(tmp_path / "full"), checkpoint.load_draft_state(tmp_path / "part")
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    log = json.loads((tmp_path / "part" / "train_log.json").read_text())
    assert [e["epoch"] for e in log["epochs"]] == [1, 2] and log["best_epoch"] in (1, 2)
    assert sorted(p.name for p in (tmp_path / "part" / "checkpoints").iterdir()) == ["epoch-1", "epoch-2"]


@pytest.mark.slow
def test_cli_metrics_and_init_from(small: tuple[Path, Path], tmp_path: Path) -> None:
    from eagle.commands.train import command

    target, data = small
    metrics = tmp_path / "metrics.json"
    runner = CliRunner()
    base = ["--model", str(target), "--data", str(data), "--batch-tokens", "128", "--val-fraction", "0.2", "--device", "cpu"]
    res = runner.invoke(command, [*base, "--out", str(tmp_path / "a"), "--epochs", "1"], env={"RUNBOOK_METRICS": str(metrics)})
    assert res.exit_code == 0, res.output
    got = json.loads(metrics.read_text())
    assert {"train_loss", "val_loss", "val_acc_0", "val_acc_1", "val_acc_2", "val_accept_len", "train_tok_s"} <= set(got)
    assert got["val_accept_len"] == pytest.approx(1 + got["val_acc_0"] * (1 + got["val_acc_1"] * (1 + got["val_acc_2"])))

    # matching drafter: fine-tunes from it (its first epoch starts far below a fresh drafter's)
    res = runner.invoke(command, [*base, "--out", str(tmp_path / "b"), "--epochs", "1", "--init-from", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    first = json.loads((tmp_path / "a" / "train_log.json").read_text())["epochs"][0]
    tuned = json.loads((tmp_path / "b" / "train_log.json").read_text())["epochs"][0]
    assert tuned["val_loss"] < first["val_loss"]

    # mismatched drafter: a wider target (another draft vocabulary is fine: its rows come from the
    # target); the hidden size is named in one line, exit 2, nothing written
    other = td.make_target(tmp_path / "wide", hidden=48)
    other_data = td.make_data(other, tmp_path / "wide-data", n=4, length=12, draft_vocab=32)
    res = runner.invoke(command, ["--model", str(other), "--data", str(other_data), "--out", str(tmp_path / "w"),
                                  "--epochs", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(command, [*base, "--out", str(tmp_path / "c"), "--init-from", str(tmp_path / "w")])
    assert res.exit_code == 2
    assert f"--init-from {tmp_path / 'w'}: " in res.output and "hidden states of size 48, the target's are 32" in res.output
    assert len([line for line in res.output.splitlines() if line.startswith("error:")]) == 1
    # the drafter's own layer shape is kept unless one is asked for: then a different one is named too
    assert "intermediate_size" not in res.output
    res = runner.invoke(command, [*base, "--out", str(tmp_path / "c"), "--init-from", str(tmp_path / "w"),
                                  "--draft-intermediate-size", "64"])
    assert res.exit_code == 2 and "intermediate_size: drafter has 96, --draft-* asks for 64" in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "c").exists()

    # a norm flag the drafter was not trained with is refused before training starts
    res = runner.invoke(command, [*base, "--out", str(tmp_path / "d"), "--init-from", str(tmp_path / "a"),
                                  "--norm-output"])
    assert res.exit_code == 2 and "norm_output=false" in res.output and not (tmp_path / "d").exists()


@pytest.mark.slow
def test_toy_target_training_gives_a_useful_drafter(toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    """The default `eagle train` on the toy target: estimated acceptance well above 1."""
    import time

    from eagle.train.config import summary_metrics
    from eagle.train.trainer import train

    t0 = time.perf_counter()
    log = train(_args(toy_target, toy_data, tmp_path / "draft", epochs=8, batch_tokens=256, val_fraction=0.1), echo=True)
    m = summary_metrics(log)
    print({"seconds": round(time.perf_counter() - t0, 1), **{k: round(v, 3) for k, v in m.items()},
           "losses": [round(r.train_loss, 3) for r in log.epochs]})
    assert m["val_accept_len"] > 1.8
    assert log.epochs[-1].train_loss < log.epochs[0].train_loss


@pytest.mark.slow
def test_flag_checks_happen_before_training(small: tuple[Path, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A norm flag the writer would refuse (here: pretend no pinned vLLM serves norm_output) stops the
    run before its first step, with nothing written, instead of after an epoch at save."""
    from eagle.drafter import checkpoint
    from eagle.train.trainer import train

    target, data = small
    monkeypatch.setitem(checkpoint.VLLM_SERVES, "norm_output", ())
    with pytest.raises(checkpoint.CheckpointError, match="norm_output=True is served by none of the pinned vLLM"):
        train(_args(target, data, tmp_path / "out", norm_output=True), echo=False)
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    log = train(_args(target, data, tmp_path / "ok", norm_output=True, epochs=1), echo=False)  # served: trains, saves
    assert log.epochs and checkpoint.read_draft_config(tmp_path / "ok").norm_output


def _series(path: Path) -> dict[int, float]:
    """Per-step train_loss of a $RUNBOOK_SERIES file (a step written twice: the later line)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return {row["step"]: row["train_loss"] for row in lines if "train_loss" in row}


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_with_the_same_losses(small: tuple[Path, Path], tmp_path: Path) -> None:
    """`eagle train --save-every-steps 3` in a real subprocess, SIGKILLed as soon as its first step state
    exists (epoch 1 of 2, 13 packs an epoch), then `--resume`d: the per-step loss curve, the epochs'
    records and the weights equal those of a run never stopped, exactly (CPU, float32)."""
    import os
    import signal
    import sys

    from eagle.cli import cli
    from eagle.drafter import checkpoint
    from eagle.train.trainer import STEP_STATE

    target, data = small
    args = ["train", "--model", str(target), "--data", str(data), "--batch-tokens", "32", "--val-fraction", "0.2",
            "--lr", "3e-3", "--epochs", "2", "--device", "cpu", "--no-tensorboard", "--save-every-steps", "3"]
    runner = CliRunner()
    full = runner.invoke(cli, [*args, "--out", str(tmp_path / "full")],
                         env={"RUNBOOK_SERIES": str(tmp_path / "full.jsonl")}, catch_exceptions=False)
    assert full.exit_code == 0, full.output
    out, series = tmp_path / "killed", tmp_path / "killed.jsonl"
    state = out / "checkpoints" / STEP_STATE
    env = dict(os.environ, RUNBOOK_SERIES=str(series), OMP_NUM_THREADS="1")
    code = td.kill_at_step_state([sys.executable, "-m", "eagle.cli", *args, "--out", str(out)], state, env)
    assert code == -signal.SIGKILL
    assert not (out / "checkpoints" / "epoch-2").exists()  # killed before the run's end
    position = torch.load(state, weights_only=False)["position"]
    assert 0 < position["done"] < len(position["batches"])  # mid-epoch
    resumed = runner.invoke(cli, [*args, "--out", str(out), "--resume"], env={"RUNBOOK_SERIES": str(series)},
                            catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming from {state} (epoch {position['epoch']}, {position['done']} of" in resumed.output
    want, got = _series(tmp_path / "full.jsonl"), _series(series)
    assert len(want) == 26 and got == want  # every optimizer step's loss, bit for bit
    logs = [json.loads((d / "train_log.json").read_text())["epochs"] for d in (tmp_path / "full", out)]
    for a, b in zip(*logs, strict=True):
        assert (a["train_loss"], a["val_loss"], a["val_acc"]) == (b["train_loss"], b["val_loss"], b["val_acc"])
    sa, sb = checkpoint.load_draft_state(tmp_path / "full"), checkpoint.load_draft_state(out)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    print(f"\n[resume] killed at optimizer step {position['opt_step']} (epoch {position['epoch']}, "
          f"{position['done']}/{len(position['batches'])} packs); {len(got)} step losses equal")


def test_a_train_log_of_the_old_metric_name_still_reads() -> None:
    """val_accept_len was est_accept_len before issue 50: a train_log.json written then (a run to resume,
    a log to read) loads, the value under the new name; what is written now uses the new name."""
    from eagle.train.config import EpochRecord

    old = {"epoch": 1, "train_loss": 1.0, "val_loss": 0.9, "val_acc": [0.8], "est_accept_len": 1.8,
           "train_tok_s": 10.0, "step_ms": 1.0, "steps": 1, "seconds": 0.1}
    record = EpochRecord.model_validate(old)
    assert record.val_accept_len == 1.8
    assert "val_accept_len" in record.model_dump() and "est_accept_len" not in record.model_dump()
    assert EpochRecord(**{**old, "est_accept_len": None, "val_accept_len": 2.5}).val_accept_len == 2.5
