"""Per-step training curves as TensorBoard event files (OUT/tensorboard), written by
torch.utils.tensorboard's SummaryWriter (the `tensorboard` package; imported only when a run logs).

The loop hands each optimizer step's scalars over as one device tensor (eagle.train.steps.step_scalars:
loss, per-draft-step losses, accuracy counts); they are stacked on the device and read back once per
`every` steps, so logging adds no host sync per step. Tags:

    train/loss                 the weighted loss the optimizer minimised
    train/loss_step{i}         draft step i's own loss (before its weight loss_decay**i)
    train/acc_step{i}          draft step i's accuracy given steps < i were right (as val_acc)
    train/lr                   the learning rate of that step
    val/loss, val/acc_step{i}, val/accept_len     at each validation
    speed/train_tok_s          per epoch

Under runbook (`$RUNBOOK_SERIES` set) the same values also go to the run's metric series, one JSON
line per logged step, named as the summary metrics are (`train_loss`, `train_acc_0`, `val_loss`,
`val_acc_0`, `val_accept_len`, `lr`, ...: eagle.metrics.series_name), with or without TensorBoard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle.common import EagleError


class StepLog:
    def __init__(self, log_dir: Path | None, ttt_steps: int, loss_decay: float, every: int = 25,
                 series: bool = False) -> None:
        from eagle.metrics import SeriesWriter

        self.k, self.decay, self.every = ttt_steps, loss_decay, max(1, every)
        self._pending: list[tuple[int, Any, int, float]] = []  # (step, summed scalars, batches, lr)
        self._writer: Any = None
        self._series = SeriesWriter.from_env(series)  # None unless `series` and run by runbook
        if log_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise EagleError(f"TensorBoard logging needs the `tensorboard` package ({exc}); run `make setup`, "
                                 "or pass --no-tensorboard") from None
            self._writer = SummaryWriter(log_dir=str(log_dir))

    def step(self, step: int, scalars: Any, batches: int, lr: float) -> None:
        """One optimizer step: `scalars` summed over its `batches` accumulated batches."""
        if self._writer is None and self._series is None:
            return
        self._pending.append((step, scalars, batches, lr))
        if len(self._pending) >= self.every:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        import torch

        from eagle.train.steps import step_accuracies

        rows = torch.stack([p[1] for p in self._pending]).tolist()  # the one read-back
        k = self.k
        for (step, _, n, lr), row in zip(self._pending, rows, strict=True):
            values = {"train/loss": row[0] / n}
            values.update({f"train/loss_step{i}": row[1 + i] / n / (self.decay ** i or 1.0) for i in range(k)})
            values.update({f"train/acc_step{i}": a
                           for i, a in enumerate(step_accuracies(row[1 + k:1 + 2 * k], row[1 + 2 * k:1 + 3 * k]))})
            values["train/lr"] = lr
            self._emit(values, step)
        self._pending = []
        self._flush_sinks()

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self._writer is None and self._series is None:
            return
        self.flush()  # the steps before it first: each series stays in step order
        self._emit(values, step)
        self._flush_sinks()

    def _emit(self, values: dict[str, float], step: int) -> None:
        if self._writer is not None:
            for tag, v in values.items():
                self._writer.add_scalar(tag, v, step)
        if self._series is not None:
            from eagle.metrics import series_name

            self._series.write(step, {series_name(tag): v for tag, v in values.items()})

    def _flush_sinks(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        if self._series is not None:
            self._series.flush()

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._series is not None:
            self._series.close()
            self._series = None
