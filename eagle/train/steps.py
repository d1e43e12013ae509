"""One training step of the drafter and its parts, as `eagle train` runs them (and the benches time
them): forward, backward, the optimizer step, the step as CUDA graphs, the step's scalars and how
its accuracy counts read, the schedule, the autocast, torch.compile's settings and the switch to
per-document attention. Nothing here waits for the GPU unless it says so."""

from __future__ import annotations

import logging
import math
from typing import Any


def forward(model: Any, batch: dict[str, Any], ttt_steps: int, losses: Any,
            loss_decay: float = 1.0) -> tuple[Any, dict[str, Any]]:
    """(loss, metrics) of one packed batch; per-document attention when the batch carries its
    layout (dataset.collate(layout=True)) and the model uses eagle/train/doc_attention.py's backend.
    Draft step i's loss weighs loss_decay**i."""
    from eagle.train.doc_attention import LAYOUT_KEYS

    _, loss, metrics = model(
        hidden_states=batch["hidden_states"], input_ids=batch["input_ids"], document_ids=batch["document_ids"],
        loss_mask=batch["loss_mask"], position_ids=batch["position_ids"],
        verifier_last_hidden_states=batch["verifier_last_hidden_states"], ttt_steps=ttt_steps,
        ttt_step_loss_decay=loss_decay, loss_config=losses, **{k: batch[k] for k in LAYOUT_KEYS if k in batch})
    return loss, metrics


def backward_step(model: Any, batch: dict[str, Any], ttt_steps: int, losses: Any, autocast: Any,
                  loss_decay: float = 1.0, scale: float = 1.0) -> tuple[Any, dict[str, Any]]:
    """Forward and backward of one batch, its gradient scaled by `scale` (1 / accumulated batches)
    and added to .grad. Returns the detached loss and the metrics as device tensors."""
    with autocast:
        loss, metrics = forward(model, batch, ttt_steps, losses, loss_decay)
    (loss * scale if scale != 1.0 else loss).backward()
    return loss.detach(), metrics


def apply_gradients(opt: Any, params: list[Any]) -> None:
    """Clip to 1.0, AdamW (no host sync: this is the end of the step a CUDA graph captures)."""
    import torch

    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def optimizer_step(opt: Any, sched: Any, params: list[Any]) -> None:
    """Clip to 1.0, AdamW, schedule, clear the gradients."""
    apply_gradients(opt, params)
    if sched is not None:
        sched.step()
    opt.zero_grad(set_to_none=True)


def train_step(model: Any, batch: dict[str, Any], opt: Any, sched: Any, params: list[Any], ttt_steps: int,
               losses: Any, autocast: Any, loss_decay: float = 1.0) -> tuple[Any, dict[str, Any]]:
    """One optimisation step on one batch (forward, backward, clip 1.0, AdamW, schedule).

    Returns the detached loss and the metrics as device tensors: nothing here waits for the GPU."""
    opt.zero_grad(set_to_none=True)
    loss, metrics = backward_step(model, batch, ttt_steps, losses, autocast, loss_decay)
    optimizer_step(opt, sched, params)
    return loss, metrics


def step_autocast(device: Any, cache: bool = True) -> Any:
    """The step's autocast: bf16 on CUDA, off on the CPU. `cache=False` drops autocast's cache of
    cast weights, as CUDA graph capture requires (the compiled step does not use it anyway)."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=cache)
    return torch.autocast("cpu", enabled=False)


def graphed_train_step(model: Any, opt: Any, params: list[Any], ttt_steps: int, losses: Any, autocast: Any,
                       loss_decay: float = 1.0) -> Any:
    """train_step as eagle/train/step_graph.py's GraphedStep: call it with a batch for the step_scalars of a
    whole step (forward, backward, clip, AdamW; the scheduler stays the caller's), one CUDA graph
    per batch shape. `autocast` must not cache (step_autocast(device, cache=False))."""
    from eagle.train.step_graph import GraphedStep

    def warm(batch: dict[str, Any]) -> None:
        backward_step(model, batch, ttt_steps, losses, autocast, loss_decay)

    def step(batch: dict[str, Any]) -> Any:
        loss, metrics = backward_step(model, batch, ttt_steps, losses, autocast, loss_decay)
        apply_gradients(opt, params)
        return step_scalars(loss, metrics, ttt_steps)

    return GraphedStep(step, warm, opt, params)


def step_scalars(loss: Any, metrics: dict[str, Any], ttt_steps: int) -> Any:
    """One device tensor [1 + 3k] of a batch's loss, per-step losses and accuracy counts (for the
    per-step log: stacked on the device, read once per log interval, so no host sync per step)."""
    import torch

    parts = [loss] + [metrics[f"loss_{i}_sum"] for i in range(ttt_steps)]
    parts += [metrics[f"full_acc_{i}_sum"] for i in range(ttt_steps)]
    parts += [metrics[f"full_acc_{i}_total"] for i in range(ttt_steps)]
    return torch.stack([p.detach().float().reshape(()) for p in parts])


def step_accuracies(correct: list[float], total: list[float]) -> list[float]:
    """Per-step conditional accuracies from speculators' cumulative counts.

    speculators' `full_acc_k` counts positions whose steps 0..k were ALL right, so the rate at
    step k divided by the rate at step k-1 is the accuracy at step k given the earlier ones.
    """
    rates = [c / t if t else 0.0 for c, t in zip(correct, total, strict=True)]
    out = []
    for k, r in enumerate(rates):
        prev = 1.0 if k == 0 else rates[k - 1]
        out.append(r / prev if prev > 0 else 0.0)
    return out


def val_accept_len(step_acc: list[float]) -> float:
    """1 + sum over k of prod_{j<=k} acc_j: expected tokens per target step when a draft is
    accepted up to its first miss (acc_j = accuracy at step j given steps < j were right)."""
    total, run = 1.0, 1.0
    for a in step_acc:
        run *= a
        total += run
    return total


def lr_lambda(total_steps: int, warmup_steps: int) -> Any:
    """The schedule's factor of the peak learning rate at each optimizer step: linear warm-up over
    `warmup_steps`, then cosine decay to 10% at `total_steps`."""
    def f(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress_ = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress_)))
    return f


def compile_settings(recompile_limit: int = 64) -> None:
    """torch.compile settings for the drafter's step (speculators compiles its forward on CUDA).

    - dynamo specialises some frames per draft step (the KV cache grows each step, `ttt_step` is a
      Python int) and per grad mode (validation): up to 2 x 7 variants of a frame before any shape
      changes, past dynamo's default limit of 8, after which the frame silently runs eagerly. With
      shape buckets the variants are bounded, so a higher limit compiles them all once and nothing
      recompiles after warm-up.
    - inductor's memory-coalescing tiling analysis asserts ("get_pw_red_splits") when a fused
      reduction's pointwise size happens to equal its reduction size (pytorch issue 197077), which
      the 1.1B shape's backward hit on the H200 with packs of 8192 tokens (torch 2.11): turned off,
      as that issue's workaround (a tiling heuristic; the kernels stay correct).
    - torch's value-range analysis logs a warning each time it cannot bound `pow_by_natural` with a
      negative exponent (torch/utils/_sympy/interp.py): dozens per compiled shape, hundreds per run on
      the H200, each harmless (the range is left unbounded). They are dropped from a user's log
      (quiet_value_range_warnings); every other warning of that logger still shows."""
    import torch._dynamo
    import torch._inductor.config as inductor

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), recompile_limit))
    if hasattr(inductor.triton, "coalesce_tiling_analysis"):
        inductor.triton.coalesce_tiling_analysis = False
    if hasattr(inductor, "loop_reindexing_after_fusion"):
        inductor.loop_reindexing_after_fusion = False
    quiet_value_range_warnings()


VALUE_RANGE_LOGGER = "torch.utils._sympy.interp"
_VALUE_RANGE_NOISE = "failed while executing pow_by_natural"


def _not_value_range_noise(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(_VALUE_RANGE_NOISE)


def quiet_value_range_warnings() -> None:
    """Drop torch's `failed while executing pow_by_natural(...)` warnings (compile_settings says why);
    once per process, whoever calls it again."""
    log = logging.getLogger(VALUE_RANGE_LOGGER)
    if _not_value_range_noise not in log.filters:
        log.addFilter(_not_value_range_noise)


def use_doc_attention(model: Any) -> None:
    """Switch the drafter to per-document attention (same results, attention cost per document)."""
    from eagle.drafter import model as drafter
    from eagle.train import doc_attention

    drafter.set_attn_impl(model, doc_attention.register())
    model._create_mask_fn = doc_attention.no_mask  # the batch's layout replaces speculators' dense mask
