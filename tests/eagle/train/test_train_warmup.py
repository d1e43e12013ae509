"""`eagle train --warm-shapes`: every attention shape of the run is met before step 1, and nothing else
changes (issue 17: a shape first met in a later epoch compiled mid-training on the H200).

On the CPU nothing compiles (speculators compiles the drafter's forward on CUDA only), so these tests
check what the GPU relies on: which shapes the drafter's attention meets and when, and that the
warm-up leaves the weights, the optimizer and the data order as they were."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import _train_data as td
import pytest
import torch
from click.testing import CliRunner

LENGTHS = [8 + (i * 7) % 25 for i in range(20)]  # 8..32 tokens: packs of varying document counts and widths
SETTINGS = {"epochs": 2, "batch_tokens": 64, "shape_buckets": True, "layout_multiple": 8, "tensorboard": False}


@pytest.fixture(scope="module")
def varied(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("train-warmup")
    target = td.make_target(root / "target")
    return target, td.make_data(target, root / "data", n=len(LENGTHS), lengths=LENGTHS)


def test_grid_shape_is_the_layouts_shape() -> None:
    from eagle.train import dataset
    from eagle.train.doc_attention import layout

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 300, (400,), generator=g).tolist()
    for budget, multiple in ((256, 1), (512, 8), (1024, 256)):
        for pack in dataset.pack_batches(list(range(len(lengths))), lengths, budget, seed=1):
            shifted = [min(lengths[i] - 1, budget) for i in pack]
            assert dataset.grid_shape(pack, lengths, budget, multiple) == tuple(layout(shifted, multiple)["doc_index"].shape)


def test_first_of_each_shape_keeps_the_first_pack_per_shape_in_order() -> None:
    from eagle.train import dataset

    lengths = [5, 5, 9, 3, 5, 9]  # shifted: 4 4 8 2 4 8
    packs = [[0, 1], [2], [4, 3], [5], [1, 0]]
    assert dataset.first_of_each_shape(packs, lengths, budget=16, multiple=1) == {(2, 4): [0, 1], (1, 8): [2]}
    assert dataset.first_of_each_shape(packs, lengths, budget=16, multiple=8) == {(2, 8): [0, 1], (1, 8): [2]}


def _train_recording(target: Path, data: Path, out: Path, monkeypatch: pytest.MonkeyPatch,
                     **kw: Any) -> tuple[Any, list[tuple[int, tuple[int, int], bool]]]:
    """Train, recording (optimizer steps so far, grid shape, gradients on) at every per-document attention call."""
    from eagle.train import doc_attention
    from eagle.train.hooks import StepHooks
    from eagle.train.trainer import train

    met: list[tuple[int, tuple[int, int], bool]] = []
    steps = [0]
    original_sdpa = doc_attention.doc_sdpa

    def sdpa(*a: Any, doc_index: Any = None, **k: Any) -> Any:
        if doc_index is not None:
            met.append((steps[0], tuple(doc_index.shape), torch.is_grad_enabled()))
        return original_sdpa(*a, doc_index=doc_index, **k)

    class Counted(StepHooks):
        def after_optimizer(self) -> None:
            steps[0] += 1

    monkeypatch.setattr(doc_attention, "doc_sdpa", sdpa)  # register() hands transformers the module's doc_sdpa
    try:
        log = train(td.train_args(target, data, out, **{**SETTINGS, **kw}), echo=False, hooks=Counted())
    finally:
        monkeypatch.undo()
        doc_attention.register()  # transformers' registry holds the original again
    return log, met


def test_warm_up_meets_every_shape_before_step_1_and_changes_nothing(varied: tuple[Path, Path], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file

    from eagle.distributed import Topology
    from eagle.train import dataset
    from eagle.train.config import TrainConfig
    from eagle.train.trainer import epoch_batches, val_batches

    target, data = varied
    args = TrainConfig.model_validate(td.train_args(target, data, tmp_path, **SETTINGS).model_dump())
    train_idx, val_idx = dataset.split_indices(len(LENGTHS), args.val_fraction, args.seed)
    one = Topology()
    by_epoch = [set(dataset.first_of_each_shape(epoch_batches(train_idx, LENGTHS, args, one, e), LENGTHS, 64, 8))
                for e in (1, 2)]
    val_shapes = set(dataset.first_of_each_shape(val_batches(val_idx, LENGTHS, args, one), LENGTHS, 64, 8))
    assert by_epoch[1] - by_epoch[0], "the data must give epoch 2 a shape epoch 1 lacks (what the warm-up is for)"

    cold, cold_met = _train_recording(target, data, tmp_path / "cold", monkeypatch, warm_shapes=False)
    warm, warm_met = _train_recording(target, data, tmp_path / "warm", monkeypatch, warm_shapes=True)

    # the warm-up: before step 1, every training shape of both epochs with gradients, every validation
    # shape without, and nothing after step 1 that it did not meet
    before = {(shape, grad) for n, shape, grad in warm_met if n == 0}
    after = {(shape, grad) for n, shape, grad in warm_met if n > 0}
    assert before == {(s, True) for s in by_epoch[0] | by_epoch[1]} | {(s, False) for s in val_shapes}
    assert after <= before
    assert warm.warmup is not None and cold.warmup is None
    assert (warm.warmup.train_shapes, warm.warmup.val_shapes) == (len(by_epoch[0] | by_epoch[1]), len(val_shapes))
    assert json.loads((tmp_path / "warm" / "train_log.json").read_text())["warmup"]["train_shapes"] == warm.warmup.train_shapes
    # without it, later shapes are met for the first time after training began (what compiles mid-run on CUDA)
    cold_before = {(shape, grad) for n, shape, grad in cold_met if n == 0}
    assert {(shape, grad) for n, shape, grad in cold_met if n > 0} - cold_before

    # and nothing else changed: the same steps, losses and weights
    assert [(r.steps, r.train_loss, r.val_loss, r.val_acc) for r in warm.epochs] == \
           [(r.steps, r.train_loss, r.val_loss, r.val_acc) for r in cold.epochs]
    a, b = load_file(str(tmp_path / "cold" / "model.safetensors")), load_file(str(tmp_path / "warm" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_warm_shapes_without_shape_buckets_is_refused(varied: tuple[Path, Path], tmp_path: Path) -> None:
    from eagle.commands.train import command

    target, data = varied
    res = CliRunner().invoke(command, ["--model", str(target), "--data", str(data), "--out", str(tmp_path / "d"),
                                       "--device", "cpu", "--warm-shapes", "--no-shape-buckets", "--batch-tokens", "64"])
    assert res.exit_code == 2, res.output
    assert "--warm-shapes needs shape buckets" in res.output and "--shape-buckets" in res.output
    assert not (tmp_path / "d").exists()


def test_compile_settings_drop_the_value_range_warning_flood() -> None:
    """torch's value-range analysis warns `failed while executing pow_by_natural(...)` whenever an
    exponent's range is negative (hundreds of lines per `eagle train` on the H200). Here torch's own
    analysis raises it; after compile_settings (what the trainer runs) it is gone from the log, once
    filtered however often the settings run, and the logger's other warnings still show."""
    import logging

    import sympy
    from torch.utils._sympy.functions import PowByNatural
    from torch.utils._sympy.interp import sympy_interp
    from torch.utils._sympy.value_ranges import SymPyValueRangeAnalysis, ValueRanges

    from eagle.train import steps

    log = logging.getLogger(steps.VALUE_RANGE_LOGGER)
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    x, y = sympy.Symbol("x", integer=True, nonnegative=True), sympy.Symbol("y", integer=True)

    def analyse() -> None:
        with pytest.raises(ValueError, match="non-negative"):
            sympy_interp(SymPyValueRangeAnalysis, {x: ValueRanges(0, 100), y: ValueRanges(-1, -1)}, PowByNatural(x, y))

    handler = Keep()
    log.addHandler(handler)
    try:
        log.removeFilter(steps._not_value_range_noise)  # as in a fresh process (a test before may have trained)
        analyse()
        assert [m for m in seen if m.startswith("failed while executing pow_by_natural([VR[0, 100], VR[-1, -1]])")]
        seen.clear()
        steps.compile_settings()
        steps.compile_settings()
        analyse()
        assert seen == []
        assert log.filters.count(steps._not_value_range_noise) == 1
        log.warning("failed while executing %s(%s)", "mod", [1, 0])
        assert seen == ["failed while executing mod([1, 0])"]
    finally:
        log.removeHandler(handler)
