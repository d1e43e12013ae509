"""What a Trainer tells an observer about its steps: the hook benches and tests time or count the
training loop with (bench/step_times.py, bench/train_real_loop.py, bench/train_step_profile.py),
instead of replacing the trainer's functions. Light: no torch.

    Trainer(config, hooks=MyHooks()).run()      # a Trainer of one's own
    with observing(MyHooks()):                  # every Trainer made inside, e.g. eagle's CLI run in
        eagle.cli.main()                        # this process (bench/step_times.py)

Subclass StepHooks and override what you need; every method does nothing here. The hooks run on
the main thread, in the loop's order; timing them on CUDA needs events or a sync (the loop itself
never waits for the GPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class StepHooks:
    def model_input(self, batch: dict[str, Any]) -> None:
        """A batch about to meet the drafter: every training batch, each warm-up pack, every
        validation batch (before its forward)."""

    def before_backward(self, batch: dict[str, Any]) -> None:
        """A training batch's forward + backward begins (with --cuda-graphs: the whole graphed
        step, clip and AdamW included)."""

    def after_backward(self, batch: dict[str, Any]) -> None:
        """That forward + backward has been launched (its gradients accumulated)."""

    def before_optimizer(self) -> None:
        """An optimizer step begins: clip, AdamW, schedule (with --cuda-graphs: the schedule only,
        the rest ran in the graph)."""

    def after_optimizer(self) -> None:
        """That optimizer step has been launched; the trainer's step count is one more."""

    def ddp(self, model: Any) -> None:
        """Under torchrun: the DistributedDataParallel wrapper made, before its first step (a comm
        hook goes on here)."""


_observer: StepHooks | None = None


@contextlib.contextmanager
def observing(hooks: StepHooks) -> Iterator[StepHooks]:
    """Every Trainer made inside without hooks of its own reports to `hooks`."""
    global _observer
    before, _observer = _observer, hooks
    try:
        yield hooks
    finally:
        _observer = before


def current() -> StepHooks:
    """The hooks a Trainer made now without its own gets: the observer, or none (StepHooks())."""
    return _observer if _observer is not None else StepHooks()
