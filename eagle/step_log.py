"""Per-step training curves as TensorBoard event files (OUT/tensorboard), written by
torch.utils.tensorboard's SummaryWriter (the `tensorboard` package; imported only when a run logs).

The loop hands each optimizer step's scalars over as one device tensor (eagle.train.step_scalars:
loss, per-draft-step losses, accuracy counts); they are stacked on the device and read back once per
`every` steps, so logging adds no host sync per step. Tags:

    train/loss                 the weighted loss the optimizer minimised
    train/loss_step{i}         draft step i's own loss (before its weight loss_decay**i)
    train/acc_step{i}          draft step i's accuracy given steps < i were right (as val_acc)
    train/lr                   the learning rate of that step
    val/loss, val/acc_step{i}, val/est_accept_len     at each validation
    speed/train_tok_s          per epoch
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle.common import EagleError


class StepLog:
    def __init__(self, log_dir: Path | None, ttt_steps: int, loss_decay: float, every: int = 25) -> None:
        self.k, self.decay, self.every = ttt_steps, loss_decay, max(1, every)
        self._pending: list[tuple[int, Any, int, float]] = []  # (step, summed scalars, batches, lr)
        self._writer: Any = None
        if log_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise EagleError(f"TensorBoard logging needs the `tensorboard` package ({exc}); run `make setup`, "
                                 "or pass --no-tensorboard") from None
            self._writer = SummaryWriter(log_dir=str(log_dir))

    def step(self, step: int, scalars: Any, batches: int, lr: float) -> None:
        """One optimizer step: `scalars` summed over its `batches` accumulated batches."""
        if self._writer is None:
            return
        self._pending.append((step, scalars, batches, lr))
        if len(self._pending) >= self.every:
            self.flush()

    def flush(self) -> None:
        if self._writer is None or not self._pending:
            return
        import torch

        from eagle.train import step_accuracies

        rows = torch.stack([p[1] for p in self._pending]).tolist()  # the one read-back
        k = self.k
        for (step, _, n, lr), row in zip(self._pending, rows, strict=True):
            self._writer.add_scalar("train/loss", row[0] / n, step)
            for i in range(k):
                self._writer.add_scalar(f"train/loss_step{i}", row[1 + i] / n / (self.decay ** i or 1.0), step)
            for i, a in enumerate(step_accuracies(row[1 + k:1 + 2 * k], row[1 + 2 * k:1 + 3 * k])):
                self._writer.add_scalar(f"train/acc_step{i}", a, step)
            self._writer.add_scalar("train/lr", lr, step)
        self._pending = []
        self._writer.flush()

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self._writer is None:
            return
        for tag, v in values.items():
            self._writer.add_scalar(tag, v, step)
        self._writer.flush()

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
