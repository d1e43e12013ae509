"""The drafter's whole training step (forward, backward, clip, AdamW) replayed as one CUDA graph per
batch shape.

The step launches ~500 kernels from Python, autograd and the optimizer; on the H200 its device time
is 26 ms but the host needs 29-37 ms to launch it (docs/benchmarks.md), so the GPU waits. Captured
once per batch shape (with shape buckets a run has a few: every pack padded to --batch-tokens, only
the per-document grid varies), a step is then one copy of the batch into the graph's input buffers
and one replay.

What capture needs, and how it is met here:
- fixed addresses: the batch is copied into static input buffers (shared by every graph whose
  tensor of that name has that shape); the parameters and the optimizer state live outside the
  graphs' memory pool (`init_optimizer_state` creates AdamW's state before the first capture
  without changing a parameter); the gradients are allocated by the captured backward itself
  (they are None when capture starts) and the captured clip and AdamW read them there;
- no host syncs in the step: speculators' accuracy counts are made sync-free
  (drafter.use_sync_free_metrics), the optimizer is `capturable` (its step counter on the device),
  and the learning rate is a device tensor the host fills before each replay from the float the
  scheduler keeps in the optimizer's param group (so checkpoints hold plain floats, as without
  graphs);
- no copies from pageable host memory (capture refuses them): speculators' forward runs partly
  outside its compiled graphs (a graph break inside its draft-step loop) and there makes scalars
  with `torch.tensor(0.0, device=...)`, a host-to-device copy; `device_scalars` builds those on the
  device instead while a step is warmed and captured;
- a compiled step for the shape: the step runs once on a side stream before its capture.

All graphs share one memory pool. That is safe because they are replayed one at a time on one
stream and nothing they allocate outlives a replay: the step's outputs are copied out of the graph
(`__call__` returns a fresh tensor), so a later replay of another graph may reuse that memory.

CUDA only, one process (no DDP), one batch per optimizer step (no --grad-accum), shape buckets on:
`eagle train` checks this (eagle.train.config.resolve_config) and otherwise runs the step eagerly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from eagle.common import warn

Batch = dict[str, torch.Tensor]


@contextlib.contextmanager
def device_scalars() -> Iterator[None]:
    """Within: `torch.tensor(x, device=<cuda>)` for a Python scalar x (bool, int, float) or an empty
    list builds the tensor on the device (torch.full / torch.empty: same value, same dtype) instead
    of copying it from host memory, which CUDA graph capture refuses. Any other call is torch's own."""
    original = torch.tensor

    def tensor(data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device")
        if (args or device is None or set(kwargs) - {"device", "dtype"} or torch.device(device).type != "cuda"
                or not (isinstance(data, (bool, int, float)) or (isinstance(data, (list, tuple)) and not data))):
            return original(data, *args, **kwargs)
        dtype = kwargs.get("dtype") or (torch.bool if isinstance(data, bool) else torch.int64 if isinstance(data, int)
                                        else torch.get_default_dtype())
        if isinstance(data, (list, tuple)):
            return torch.empty((0,), dtype=dtype, device=device)
        return torch.full((), data, dtype=dtype, device=device)

    torch.tensor = tensor
    try:
        yield
    finally:
        torch.tensor = original


def batch_key(batch: Batch) -> tuple[tuple[str, tuple[int, ...], torch.dtype], ...]:
    """The shape of a batch as a graph sees it: each tensor's name, shape and dtype."""
    return tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(batch.items()))


def set_capturable(opt: torch.optim.Optimizer, on: bool) -> None:
    """Make the optimizer capturable (its step counters on the parameters' device, so a step makes no
    host sync and can be captured) or not (counters on the host: a state saved by a graphed run
    resumes on the CPU too). Idempotent; the optimizer's math is the same either way."""
    for group in opt.param_groups:
        if "capturable" in group:
            group["capturable"] = on
        for p in group["params"]:
            state = opt.state.get(p, {})
            step = state.get("step")
            if torch.is_tensor(step):
                state["step"] = (step.to(p.device, torch.float32) if on
                                 else step.detach().to("cpu", torch.float32))


def init_optimizer_state(opt: torch.optim.Optimizer) -> int:
    """Create the per-parameter state of every parameter that has none yet (AdamW: step, exp_avg,
    exp_avg_sq), as the optimizer's first step would, without changing any parameter: one step on
    zero gradients, then the parameters put back and the new state zeroed (AdamW's initial state).
    A graph captured afterwards updates this state in place. Returns how many parameters got state."""
    fresh = [p for g in opt.param_groups for p in g["params"] if p not in opt.state or not opt.state[p]]
    if not fresh:
        return 0
    every = [p for g in opt.param_groups for p in g["params"]]
    grads = {id(p): p.grad for p in every}
    saved = [p.detach().clone() for p in fresh]
    for p in every:
        p.grad = None
    for p in fresh:
        p.grad = torch.zeros_like(p)
    opt.step()
    with torch.no_grad():
        for p, value in zip(fresh, saved, strict=True):
            p.copy_(value)
            for v in opt.state[p].values():
                if torch.is_tensor(v):
                    v.zero_()
    for p in every:
        p.grad = grads[id(p)]
    return len(fresh)


class GraphedStep:
    """Call with a batch (device tensors): runs `step` on it and returns what `step` returns (one
    tensor, e.g. the loss and metric counts stacked), as a fresh tensor.

    `step(batch)` must run the whole optimisation step with the gradients None on entry: forward,
    backward, clipping and `opt.step()`, returning a device tensor, with no host sync. `warm(batch)`
    runs its forward and backward only (a shape's first run compiles it); it is run once per shape,
    on a side stream, before that shape's capture. If a capture fails, every shape runs `step`
    eagerly from then on, with a warning naming the error (`failure` keeps the traceback): a
    failed capture leaves its memory pool unusable for the next one."""

    def __init__(self, step: Callable[[Batch], torch.Tensor], warm: Callable[[Batch], Any],
                 opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
        self.step, self.warm, self.opt, self.params = step, warm, opt, params
        self.graphs: dict[Any, tuple[torch.cuda.CUDAGraph, Batch, torch.Tensor]] = {}
        self.inputs: dict[tuple[str, tuple[int, ...], torch.dtype], torch.Tensor] = {}
        self.pool: Any = None
        self.lrs: list[torch.Tensor] = []
        self.failure: str | None = None  # the traceback of the failed capture (no more are tried after one)

    @property
    def captured(self) -> int:
        """How many batch shapes run as a graph."""
        return len(self.graphs)

    def _clear_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def _prepare(self, device: torch.device) -> None:
        if self.pool is not None:
            return
        set_capturable(self.opt, True)
        init_optimizer_state(self.opt)
        self.lrs = [torch.tensor(float(g["lr"]), device=device, dtype=torch.float32) for g in self.opt.param_groups]
        self.pool = torch.cuda.graph_pool_handle()

    def _static(self, batch: Batch) -> Batch:
        """The input buffers of this batch's shape (allocated outside the graphs' pool)."""
        out = {}
        for k, v in batch.items():
            key = (k, tuple(v.shape), v.dtype)
            if key not in self.inputs:
                self.inputs[key] = torch.empty_like(v)
            out[k] = self.inputs[key]
        return out

    def _fill(self, static: Batch, batch: Batch) -> None:
        for k, v in batch.items():
            static[k].copy_(v, non_blocking=True)
        for lr, group in zip(self.lrs, self.opt.param_groups, strict=True):
            lr.fill_(float(group["lr"]))

    def capture(self, batch: Batch) -> bool:
        """Capture the step for this batch's shape (once per shape); False if it runs eagerly."""
        key = batch_key(batch)
        if key in self.graphs or self.failure:
            return self.graphs.get(key) is not None
        device = next(iter(batch.values())).device
        self._prepare(device)
        static = self._static(batch)
        self._fill(static, batch)
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), device_scalars():
            self._clear_grads()
            self.warm(static)  # compiles this shape outside the capture
            self._clear_grads()
        torch.cuda.current_stream(device).wait_stream(side)
        floats = [g["lr"] for g in self.opt.param_groups]
        graph = torch.cuda.CUDAGraph()
        try:
            for group, lr in zip(self.opt.param_groups, self.lrs, strict=True):
                group["lr"] = lr  # the captured AdamW reads the rate from this tensor
            # thread_local: the data loader's threads keep pinning and copying while this thread captures
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"), device_scalars():
                out = self.step(static)
        except Exception as e:  # noqa: BLE001 - any capture failure leaves the step eager, said once
            import traceback

            self.failure = traceback.format_exc()
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            warn(f"CUDA graph capture of the training step failed ({reason}); the step runs without graphs")
            return False
        finally:
            for group, lr in zip(self.opt.param_groups, floats, strict=True):
                group["lr"] = lr
            self._clear_grads()
        self.graphs[key] = (graph, static, out)
        return True

    def __call__(self, batch: Batch) -> torch.Tensor:
        """One training step on this batch; returns `step`'s output (a copy)."""
        key = batch_key(batch)
        if key not in self.graphs:
            self.capture(batch)
        entry = self.graphs.get(key)
        if entry is None:
            self._clear_grads()
            out = self.step(batch)
            self._clear_grads()
            return out
        graph, static, out = entry
        self._fill(static, batch)
        graph.replay()
        return out.clone()
