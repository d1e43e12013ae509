"""`eagle train`'s settings and records: the typed config the command line builds once
(`TrainConfig`), the rules that fill and check it, and what a run writes down (`TrainLog`, one
`EpochRecord` per epoch, the `Warmup`). Pure: pydantic only, no torch, so `eagle train --help`
and the command line's parsing stay light."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, Field

from eagle.common import EagleError
from eagle.target import DraftShape

# Settings a resumed run must share with the run it continues (epochs may grow).
RESUME_FIELDS = ("model", "data", "ttt_steps", "batch_tokens", "val_fraction", "seed", "lr", "init_from", "world_size",
                 "online", "hidden_states", "layer_ids", "draft_shape", "loss_decay", "grad_accum", "norm_before_residual",
                 "norm_before_fc", "norm_output", "freeze_lm_head")
# The drafter's norm flags `eagle train` sets (None: off for a new drafter, the checkpoint's with --init-from).
TRAIN_NORM_FLAGS = ("norm_before_residual", "norm_before_fc", "norm_output")
MAX_TTT_STEPS = 7
BUCKET_MULTIPLE = 256  # shape buckets' per-document width (measured on the H200: docs/benchmarks.md)


class TrainConfig(BaseModel):
    model: str
    data: str
    out: str
    epochs: int = 12
    lr: float | None = None  # None: default_lr(the target's hidden size)
    ttt_steps: int = 3
    loss_decay: float = 0.8  # step i of the draft weighs loss_decay**i in the loss (EAGLE-3's 0.8)
    batch_tokens: int = 256
    grad_accum: int = 1  # batches per optimizer step
    val_fraction: float = 0.1
    val_every: int = 0  # optimizer steps between validations (0: once per epoch, at its end)
    save_every: int = 0  # optimizer steps between servable checkpoints OUT/checkpoints/step-N (0: none)
    save_every_steps: int = 0  # optimizer steps between resumable states OUT/checkpoints/step-state.pt (0: none)
    tensorboard: bool = True  # OUT/tensorboard: per-step losses and accuracies
    seed: int = 0
    init_from: str | None = None
    freeze_lm_head: bool = False  # --init-from: keep the published drafter's lm_head as it is
    device: str = "auto"
    resume: bool = False
    warmup_fraction: float = 0.05
    world_size: int = 1
    shape_buckets: bool | None = None  # None: on for CUDA (pad packs to batch_tokens, widths to 256)
    layout_multiple: int | None = None  # per-document attention width rounded up to this (None: by buckets)
    warm_shapes: bool | None = None  # run every pack shape of the run once before step 1 (None: with shape buckets)
    cuda_graphs: bool | None = None  # the step as one CUDA graph per pack shape (opt-in: see resolve_config)
    online: bool = False  # hidden states from the target on the fly (eagle/train/online.py), not from files
    hidden_states: str = "files"  # "files" (eagle extract's) or "vllm": fetched from a server (eagle/train/server_fed.py)
    server: str | None = None  # --hidden-states vllm: a running extraction server's URL (None: eagle starts one)
    server_storage: str | None = None  # --hidden-states vllm: eagle's own server writes its state files here
    in_flight: int = 8  # --hidden-states vllm: samples requested and not yet read (bounds the storage folder)
    vllm_args: list[str] = []  # --hidden-states vllm: engine flags of eagle's own server (KEY[=VALUE])
    layer_ids: list[int] | None = None  # --online / --hidden-states vllm: aux layers (None: eagle extract's default)
    draft_shape: DraftShape = DraftShape()  # the drafter layer's shape where it differs from the target's
    trust_remote_code: bool = False  # --online with a custom-code target
    norm_before_residual: bool | None = None  # None: False for a new drafter, the checkpoint's with --init-from
    norm_before_fc: bool | None = None
    norm_output: bool | None = None
    keep_float32: bool = False  # save float32 weights instead of bf16
    partial_data: bool = False  # train on the samples with hidden states when the extraction did not finish


class EpochRecord(BaseModel):
    epoch: int
    train_loss: float
    val_loss: float | None
    val_acc: list[float]
    # 1 + sum_k prod_{j<=k} val_acc_j: the accept length the validation split's step accuracies give
    # (teacher-forced), not held-out acceptance; called est_accept_len before issue 50 (old logs read)
    val_accept_len: float | None = Field(validation_alias=AliasChoices("val_accept_len", "est_accept_len"))
    train_tok_s: float
    step_ms: float
    steps: int
    seconds: float
    data_wait_s: float = 0.0  # of `seconds`: the loop waiting for its next batch (loader-bound when large)
    target_s: float | None = None  # --online: the target's forwards (GPU time on CUDA), part of `seconds`

    def score(self) -> float:
        """What the best epoch minimises: the validation loss, else the training loss."""
        return self.val_loss if self.val_loss is not None else self.train_loss


class Warmup(BaseModel):
    """What the warm-up before step 1 ran (warm_shapes): one pack of each attention shape this process
    meets in its epochs (forward + backward, no optimizer step) and in validation (forward)."""
    train_shapes: int
    val_shapes: int
    seconds: float  # on CUDA mostly compilation, which the epochs' tok/s then no longer carry
    cuda_graphs: int = 0  # of train_shapes: captured as a CUDA graph of the whole step (--cuda-graphs)


class TrainLog(BaseModel):
    args: TrainConfig  # named `args` in every train_log.json and epoch state written so far
    epochs: list[EpochRecord] = []
    best_epoch: int | None = None
    warmup: Warmup | None = None  # of the last process that trained (a resumed run warms up again)


def default_lr(hidden_size: int) -> float:
    """The peak learning rate when --lr is not given: 1e-4 x 4096 / hidden size, at most 3e-3.

    Adam's stable step size shrinks about as 1 / width for hidden matrices, so the rule scales
    from SpecForge's 1e-4 for 4096-wide targets (Llama-3.1-8B; EAGLE's own recipe for the same 8B
    width is 5e-5, half of it): 5e-5 at 8192, 5.7e-5 for Kimi-K2's 7168 (near SpecForge's
    DeepSeek-V3 recipe), 2e-4 for the 1.1B shape's 2048 (where 3e-3 diverged), and the cap 3e-3 for
    the toy's 128, the setting it was tuned with."""
    return min(3e-3, 1e-4 * 4096 / max(1, hidden_size))


def global_batch_text(batch_tokens: int, grad_accum: int, world: int) -> str:
    """The tokens one optimizer step sees: --batch-tokens per pack x --grad-accum x processes.

    The learning rate is not scaled with it (default_lr depends on the width only), so N processes
    take N times fewer, N times larger steps than one: to train as one GPU does, divide
    --batch-tokens (or --grad-accum) by N."""
    parts = [f"{batch_tokens:,}"] + [f"{grad_accum}"] * (grad_accum > 1) + [f"{world} processes"] * (world > 1)
    return f"{' x '.join(parts)} = {batch_tokens * grad_accum * world:,} tokens" if len(parts) > 1 else f"{batch_tokens:,} tokens"


def check_config(config: TrainConfig) -> None:
    """Every setting out of its range, named in one EagleError (exit 1), before any work."""
    problems = []
    if config.epochs < 1:
        problems.append(f"--epochs must be >= 1 (got {config.epochs})")
    if not 1 <= config.ttt_steps <= MAX_TTT_STEPS:
        problems.append(f"--ttt-steps must be in 1..{MAX_TTT_STEPS} (got {config.ttt_steps})")
    if config.lr is not None and config.lr <= 0:
        problems.append(f"--lr must be > 0 (got {config.lr:g})")
    if not 0 < config.loss_decay <= 1:
        problems.append(f"--loss-decay must be in (0, 1] (got {config.loss_decay:g})")
    if config.freeze_lm_head and not config.init_from:
        problems.append("--freeze-lm-head goes with --init-from (a new drafter's lm_head is the target's rows, "
                        "never trained)")
    for name in ("grad_accum", "layout_multiple"):
        if getattr(config, name) is not None and getattr(config, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(config, name)})")
    if config.hidden_states not in ("files", "vllm"):
        problems.append(f"--hidden-states must be files or vllm (got {config.hidden_states})")
    if config.hidden_states == "vllm" and config.online:
        problems.append("--online (the target beside the drafter) and --hidden-states vllm (the target in a vLLM "
                        "server) are two sources of the states: pass one")
    if config.hidden_states != "vllm" and (config.server or config.server_storage):
        problems.append("--server and --server-storage go with --hidden-states vllm")
    if config.vllm_args and (config.hidden_states != "vllm" or config.server):
        problems.append("--vllm-arg sets eagle's own extraction server's flags: it goes with --hidden-states vllm "
                        "and no --server")
    if config.server and config.server_storage:
        problems.append("--server-storage is where eagle's own server writes; a --server writes where it was "
                        "started to: drop one")
    if config.in_flight < 1:
        problems.append(f"--in-flight must be >= 1 (got {config.in_flight})")
    for name in ("val_every", "save_every", "save_every_steps"):
        if getattr(config, name) < 0:
            problems.append(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(config, name)})")
    if problems:
        raise EagleError("; ".join(problems))


def why_no_cuda_graphs(config: TrainConfig, device: Any, buckets: bool) -> str | None:
    """Why the step cannot run as CUDA graphs (eagle/train/step_graph.py) in this run, or None."""
    if device.type != "cuda":
        return f"they need a CUDA device (this run trains on {device.type})"
    if not buckets:
        return "they need shape buckets (--shape-buckets): without them every pack is a new shape to capture"
    if config.world_size > 1:
        return (f"they run in one process; under DDP ({config.world_size} processes) the gradient all-reduce sits "
                "inside the step")
    if config.grad_accum > 1:
        return "they capture one batch per optimizer step; --grad-accum accumulates several"
    return None


def resolve_config(config: TrainConfig, hidden_size: int, device: Any) -> TrainConfig:
    """Fill the settings left to the run: the learning rate (default_lr), the shape buckets (on for
    CUDA: every pack padded to --batch-tokens and per-document widths rounded up to BUCKET_MULTIPLE,
    so the compiled step sees a few shapes instead of one per batch) and the CUDA graphs (asked for
    only: faster in the real loop on the H200, but slower than the eager step in one fixed-pack
    feed, cause open, docs/benchmarks.md session 10; refused where they cannot run)."""
    buckets = device.type == "cuda" if config.shape_buckets is None else config.shape_buckets
    multiple = config.layout_multiple or (BUCKET_MULTIPLE if buckets else 1)
    warm = buckets if config.warm_shapes is None else config.warm_shapes
    if warm and not buckets:
        raise EagleError("--warm-shapes needs shape buckets (--shape-buckets): without them every pack has its own "
                         "length, so warming each shape would run the whole data once more", code=2)
    why = why_no_cuda_graphs(config, device, buckets)
    if config.cuda_graphs and why:
        raise EagleError(f"--cuda-graphs: {why}; leave the flag out (the step then runs without graphs)", code=2)
    graphs = bool(config.cuda_graphs)
    return config.model_copy(update={"lr": config.lr or default_lr(hidden_size), "shape_buckets": buckets,
                                     "layout_multiple": multiple, "warm_shapes": warm, "cuda_graphs": graphs})


def check_resume(saved: TrainConfig, now: TrainConfig, where: Path) -> None:
    """--resume continues a run with the same settings (RESUME_FIELDS), or refuses naming each change."""
    diffs = [f"{f}: saved {getattr(saved, f)!r}, now {getattr(now, f)!r}"
             for f in RESUME_FIELDS if getattr(saved, f) != getattr(now, f)]
    if diffs:
        raise EagleError(f"--resume: {where} was trained with other settings ({'; '.join(diffs)}); "
                         "pass the same ones, or drop --resume to start again")


def summary_metrics(log: TrainLog) -> dict[str, float]:
    """The metrics `eagle train` reports: the best epoch's validation numbers, the last train loss."""
    if not log.epochs:
        return {}
    last = log.epochs[-1]
    best = next((r for r in log.epochs if r.epoch == log.best_epoch), last)
    metrics: dict[str, float] = {
        "train_loss": last.train_loss,
        "train_tok_s": sum(r.train_tok_s * r.seconds for r in log.epochs) / max(sum(r.seconds for r in log.epochs), 1e-9),
        "train_step_ms": last.step_ms,
    }
    if best.val_loss is not None:
        metrics["val_loss"] = best.val_loss
        metrics.update({f"val_acc_{i}": a for i, a in enumerate(best.val_acc)})
        metrics["val_accept_len"] = best.val_accept_len or 1.0
    return metrics


def out_of_memory(detail: str, config: TrainConfig) -> EagleError:
    """The error `eagle train` ends with when the device runs out of memory: what ran out, and the
    flags that trade memory for steps (torch's own first sentence kept, as `detail`)."""
    b, accum = config.batch_tokens, config.grad_accum
    first = detail.strip().split(". ")[0] if detail.strip() else "out of memory"
    return EagleError(
        f"out of device memory training at --batch-tokens {b}" + (f" --grad-accum {accum}" if accum > 1 else "")
        + f" ({first}). A step's memory grows with --batch-tokens: try --batch-tokens {max(1, b // 2)} "
        f"--grad-accum {2 * accum}, the same global batch in two halves. Measured on an H200: the Kimi-K2 "
        "drafter shape peaks at 98 GiB at --batch-tokens 32768 and does not fit at 98304 (docs/benchmarks.md).")
