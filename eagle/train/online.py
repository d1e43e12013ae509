"""Hidden states computed on the fly: the data source behind `eagle train --online`.

Offline training reads `eagle extract`'s files (eagle/train/dataset.py HiddenStates). Online training
keeps the target beside the drafter and runs it on each training batch instead, so nothing touches
the disk and a new dataset trains with no extraction step. `OnlineStates` and HiddenStates
both declare eagle/train/dataset.py's `DataSource` Protocol, so the training loop is the same.

Sameness with the offline path, by construction:
- the forward is eagle/data/capture.py's HiddenCapture (the engine `eagle extract` uses): same
  hooks (inputs of the aux layers, the last layer's output before the final norm), right padding
  without an attention mask (causal: real tokens never see the pads), compiled layers on CUDA;
- the states are rounded to bfloat16, as the files store them, before the usual shift and packing
  (dataset.shift_sample / dataset.collate), so a CPU run in float32 matches the offline run on the
  same rows up to matmul summation order;
- a sample is cut to `budget + 1` tokens before the forward: the shifted sample uses only those.

The cost is one target forward per training step (and per validation batch, every epoch): online
pays it each epoch, offline pays it once in `eagle extract` plus a file read per sample per epoch.
docs/benchmarks.md has the H200 figures for both.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from eagle.common import EagleError
from eagle.train.dataset import DataSource

# Widths of the target's forward are rounded up to this on CUDA, so torch.compile sees few shapes.
CUDA_PAD_MULTIPLE = 64


class OnlineStates(DataSource):
    """Every row of a prepared dataset, its hidden states computed by `target` when a batch is made."""

    prefetch = False  # the target runs on the caller's thread (compiled graphs, one CUDA stream)
    runs_target = True

    def __init__(self, data_dir: str | os.PathLike[str], target: Any, layer_ids: list[int], budget: int,
                 compile: bool | None = None) -> None:
        from eagle.data import capture as hidden_capture
        from eagle.data import hidden_io
        from eagle.target import input_device

        self.data_dir = Path(data_dir)
        self.input_ids, self.loss_mask = hidden_io.prepared_rows(self.data_dir)
        self.lengths = [len(r) for r in self.input_ids]
        self.rows = list(range(len(self.input_ids)))
        self.budget = budget
        self.device = input_device(target)
        cuda = self.device.type == "cuda"
        self.pad_multiple = CUDA_PAD_MULTIPLE if cuda else 1
        self.capture = hidden_capture.HiddenCapture(target, layer_ids, compile=cuda if compile is None else compile)
        self._events: list[tuple[Any, Any]] = []
        self._host_seconds = 0.0
        self.num_aux = len(layer_ids)
        text = target.config.get_text_config()  # the text model's, also under a multimodal wrapper
        self.hidden_size = int(text.hidden_size)
        vocab = int(text.vocab_size)
        bad = next((i for i, r in enumerate(self.input_ids) if r and max(r) >= vocab), None)
        if bad is not None:
            raise EagleError(f"row {bad} of {self.data_dir} has token ids >= the target's vocab size {vocab}: "
                             "was it prepared with another model?")

    def __len__(self) -> int:
        return len(self.lengths)

    def raw_batch(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        """Each sample's {hidden_states [T', L+1, H] bf16 on the target's device, input_ids, loss_mask}
        for its first T' = min(T, budget + 1) tokens: what load_raw gives the offline path."""
        from eagle.data import capture as hidden_capture

        keep = [min(self.lengths[i], self.budget + 1) for i in indices]
        cut = [self.input_ids[i][:n] for i, n in zip(indices, keep, strict=True)]
        x = hidden_capture.padded_input(cut, range(len(cut)), self.pad_multiple)
        if self.device.type == "cuda":
            x = x.pin_memory()  # a pageable copy would wait for the GPU's queue (the previous step) to drain
        with self._timed():
            hs = self.capture.run(x.to(self.device, non_blocking=True)).to(torch.bfloat16)
        return [{"hidden_states": hs[r, :n], "input_ids": torch.as_tensor(cut[r], dtype=torch.long),
                 "loss_mask": torch.as_tensor(self.loss_mask[i][:n], dtype=torch.long)}
                for r, (i, n) in enumerate(zip(indices, keep, strict=True))]

    def batch(self, indices: list[int], device: torch.device, dtype: torch.dtype = torch.float32,
              layout: bool = False, layout_multiple: int = 1, pad_to: int | None = None) -> dict[str, torch.Tensor]:
        from eagle.train import dataset

        samples = [dataset.shift_sample(raw, self.budget) for raw in self.raw_batch(indices)]
        b = dataset.collate(samples, dtype=dtype, layout=layout, layout_multiple=layout_multiple, pad_to=pad_to)
        return {k: v.to(device, non_blocking=True) for k, v in b.items()}

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._host_seconds += time.perf_counter() - t0

    def take_target_seconds(self) -> float:
        """Seconds the target's forwards took since the last call (GPU time on CUDA: waits for them)."""
        if self._events:
            self._events[-1][1].synchronize()
        total = self._host_seconds + sum(s.elapsed_time(e) for s, e in self._events) / 1000
        self._events, self._host_seconds = [], 0.0
        return total

    def tokens(self, indices: list[int]) -> int:
        return sum(min(max(self.lengths[i] - 1, 0), self.budget) for i in indices)

    def close(self) -> None:
        self.capture.close()


def load_target(model_dir: Path, device: torch.device, trust_remote_code: bool = False) -> Any:
    """The target beside the drafter, on the training device (bf16 on GPU, fp32 on CPU), with a clear
    error when it does not fit there."""
    from eagle.target import load_model

    try:
        return load_model(model_dir, str(device), "auto", trust_remote_code)
    except torch.cuda.OutOfMemoryError:
        raise EagleError(f"--online: the target {model_dir} does not fit on {device}; drop --online and run "
                         "`eagle extract` first (offline training keeps only the drafter on the GPU)") from None
