"""`eagle train`'s settings for real models: the learning-rate rule, no silent truncation, TTT depth
and loss weights, gradient accumulation, step-wise validation and checkpoints, TensorBoard files."""

from __future__ import annotations

import json
from pathlib import Path

import _train_data as td
import pytest
import torch
from click.testing import CliRunner


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return td.make_small(tmp_path_factory.mktemp("train-options"))


def _args(target: Path, data: Path, out: Path, **kw):
    return td.train_args(target, data, out, **{"epochs": 1, "batch_tokens": 64, "tensorboard": False, **kw})


def test_default_learning_rate_follows_the_published_recipes() -> None:
    from eagle.train.config import default_lr

    assert default_lr(4096) == pytest.approx(1e-4)  # SpecForge, Llama-3.1-8B
    assert default_lr(8192) == pytest.approx(5e-5)  # EAGLE, 70B
    assert 5e-5 < default_lr(7168) < 1e-4  # Kimi-K2
    assert default_lr(2048) == pytest.approx(2e-4)  # the 1.1B shape (3e-3 diverged there)
    assert default_lr(128) == 3e-3 and default_lr(32) == 3e-3  # the toy keeps what it was tuned with


def test_a_sample_longer_than_the_batch_is_refused_not_cut(small: tuple[Path, Path], tmp_path: Path) -> None:
    from eagle.commands.train import command

    target, data = small
    out = tmp_path / "draft"
    res = CliRunner().invoke(command, ["--model", str(target), "--data", str(data), "--out", str(out),
                                    "--batch-tokens", "20", "--device", "cpu", "--epochs", "1"])
    assert res.exit_code == 1
    msg = res.output
    assert "16 of 16 samples are longer than --batch-tokens 20" in msg
    assert "31 tokens" in msg and "--batch-tokens 31 or more" in msg and str(data) in msg
    assert "Traceback" not in msg and not out.exists()
    # exactly the longest sample fits: trains
    res = CliRunner().invoke(command, ["--model", str(target), "--data", str(data), "--out", str(out),
                                    "--batch-tokens", "31", "--device", "cpu", "--epochs", "1", "--no-tensorboard"])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(("kw", "needle"), [
    ({"ttt_steps": 8}, "--ttt-steps must be in 1..7"),
    ({"loss_decay": 0.0}, "--loss-decay must be in (0, 1]"),
    ({"grad_accum": 0}, "--grad-accum must be >= 1"),
    ({"val_every": -1}, "--val-every must be >= 0"),
])
def test_bad_settings_are_named(small: tuple[Path, Path], tmp_path: Path, kw: dict, needle: str) -> None:
    from eagle.common import EagleError
    from eagle.train.trainer import train

    with pytest.raises(EagleError) as err:
        train(_args(*small, tmp_path / "d", **kw), echo=False)
    assert needle in str(err.value)


def test_loss_decay_weighs_each_draft_step(small: tuple[Path, Path], tmp_path: Path) -> None:
    from eagle.drafter import model as drafter
    from eagle.train import dataset
    from eagle.train import steps as train

    target, data = small
    hs = dataset.HiddenStates(data, 64)
    d2t, t2d = dataset.read_vocab(data)
    torch.manual_seed(0)
    model = drafter.build_drafter(target, layer_ids=td.LAYER_IDS, d2t=d2t, t2d=t2d, ttt_steps=7)
    batch = hs.batch([0, 1], torch.device("cpu"))
    with torch.no_grad():
        flat, m1 = train.forward(model, batch, 7, drafter.loss_config(), 1.0)
        weighted, m8 = train.forward(model, batch, 7, drafter.loss_config(), 0.8)
    per_step = [float(m1[f"loss_{i}_sum"]) for i in range(7)]
    assert float(flat) == pytest.approx(sum(per_step), rel=1e-5)
    assert float(weighted) == pytest.approx(sum(x * 0.8 ** i for i, x in enumerate(per_step)), rel=1e-5)


@pytest.mark.slow
def test_accumulation_stepwise_validation_checkpoints_and_tensorboard(small: tuple[Path, Path], tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from eagle.train import dataset
    from eagle.train.trainer import train

    target, data = small
    out = tmp_path / "draft"
    log = train(_args(target, data, out, epochs=2, ttt_steps=5, grad_accum=2, val_every=2, save_every=3,
                      tensorboard=True), echo=False)
    train_idx, _ = dataset.split_indices(16, 0.2, 0)
    batches = [len(dataset.pack_batches(train_idx, [32] * 16, 64, 0, e)) for e in (1, 2)]
    opt_steps = sum(-(-b // 2) for b in batches)  # two batches per optimizer step
    assert [r.steps for r in log.epochs] == batches
    assert len(log.epochs[-1].val_acc) == 5

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "val/loss", "val/accept_len", "speed/train_tok_s"} <= tags
    assert {f"train/acc_step{i}" for i in range(5)} | {f"train/loss_step{i}" for i in range(5)} <= tags
    steps = [e.step for e in acc.Scalars("train/loss")]
    assert steps == list(range(1, opt_steps + 1))
    assert all(0 <= e.value <= 1 for e in acc.Scalars("train/acc_step0"))
    # validation every 2 optimizer steps and at each epoch's end
    val_steps = sorted({e.step for e in acc.Scalars("val/loss")})
    assert set(range(2, opt_steps + 1, 2)) <= set(val_steps)
    assert acc.Scalars("val/loss")[-1].value == pytest.approx(log.epochs[-1].val_loss, rel=1e-5)
    # a servable checkpoint every 3 optimizer steps
    saved = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert saved == [f"step-{n}" for n in range(3, opt_steps + 1, 3)]
    cfg = json.loads((out / "checkpoints" / saved[0] / "config.json").read_text())
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5


def test_global_batch_text_counts_packs_accumulation_and_processes() -> None:
    from eagle.train.config import global_batch_text

    assert global_batch_text(8192, 1, 1) == "8,192 tokens"
    assert global_batch_text(8192, 1, 2) == "8,192 x 2 processes = 16,384 tokens"
    assert global_batch_text(4096, 4, 8) == "4,096 x 4 x 8 processes = 131,072 tokens"


def test_out_of_memory_names_the_flags_that_trade_memory_for_steps() -> None:
    """What `eagle train` says when the device runs out of memory (it ended as 'eagle did not expect this'
    at --batch-tokens 98304 on the H200 with the K2 drafter shape, 2026-12-04): torch's first sentence, the
    batch that did not fit, and the flags that keep the global batch in smaller steps."""
    from eagle.train.config import TrainConfig, out_of_memory

    torch_says = ("CUDA out of memory. Tried to allocate 1.31 GiB. GPU 0 has a total capacity of 139.80 GiB of "
                  "which 289.50 MiB is free. Including non-PyTorch memory, this process has 129.80 GiB memory in use.")
    err = out_of_memory(torch_says, TrainConfig(model="t", data="d", out="o", batch_tokens=98304))
    assert err.code == 1
    assert str(err).startswith("out of device memory training at --batch-tokens 98304 (CUDA out of memory). ")
    assert "try --batch-tokens 49152 --grad-accum 2, the same global batch" in str(err)
    err = out_of_memory("", TrainConfig(model="t", data="d", out="o", batch_tokens=8192, grad_accum=2))
    assert "at --batch-tokens 8192 --grad-accum 2 (out of memory)" in str(err)
    assert "try --batch-tokens 4096 --grad-accum 4" in str(err)
    assert isinstance(torch.OutOfMemoryError("x"), RuntimeError)  # what the command catches, in this torch
