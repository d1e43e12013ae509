"""`eagle train`: train (or fine-tune) the EAGLE-3 drafter on the target's hidden states.

Our own loop around speculators' Eagle3DraftModel (eagle/drafter/model.py): AdamW, linear warm-up then
cosine decay, bf16 autocast on GPU, DDP under torchrun (gloo on CPU, nccl on GPU; rank 0 writes).
The hidden states come from `eagle extract`'s files (eagle/train/dataset.py) or, with --online, from the
target itself, run beside the drafter on each batch (eagle/train/online.py).

OUT/
    config.json, model.safetensors   the servable checkpoint of the best epoch (lowest val loss)
    train_log.json                   per-epoch losses, accuracies, speed
    checkpoints/epoch-N/state.pt     trained weights + optimizer + scheduler + RNG (for --resume)
"""

from __future__ import annotations

import contextlib
import math
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from pydantic import BaseModel

from eagle import distributed
from eagle.command import device_option, finish, json_option, refusals, trust_remote_code_option
from eagle.common import EagleError, fail, print_table, progress, split_layer_ids, warn
from eagle.fsutil import atomic_dir, atomic_write_text, fsync_file
from eagle.target import DraftShape, Target, merge_shape, open_target, read_draft_shape

if TYPE_CHECKING:
    from eagle.train.dataset import DataSource

STATE_FILE = "state.pt"
LOG_FILE = "train_log.json"
# Arguments a resumed run must share with the run it continues (epochs may grow).
RESUME_FIELDS = ("model", "data", "ttt_steps", "batch_tokens", "val_fraction", "seed", "lr", "init_from", "world_size",
                 "online", "layer_ids", "draft_shape", "loss_decay", "grad_accum", "norm_before_residual",
                 "norm_before_fc", "norm_output")
# The drafter's norm flags `eagle train` sets (None: off for a new drafter, the checkpoint's with --init-from).
TRAIN_NORM_FLAGS = ("norm_before_residual", "norm_before_fc", "norm_output")
MAX_TTT_STEPS = 7
BUCKET_MULTIPLE = 256  # shape buckets' per-document width (measured on the H200: docs/benchmarks.md)


class TrainArgs(BaseModel):
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
    tensorboard: bool = True  # OUT/tensorboard: per-step losses and accuracies
    seed: int = 0
    init_from: str | None = None
    device: str = "auto"
    resume: bool = False
    warmup_fraction: float = 0.05
    world_size: int = 1
    shape_buckets: bool | None = None  # None: on for CUDA (pad packs to batch_tokens, widths to 256)
    layout_multiple: int | None = None  # per-document attention width rounded up to this (None: by buckets)
    warm_shapes: bool | None = None  # run every pack shape of the run once before step 1 (None: with shape buckets)
    cuda_graphs: bool | None = None  # the step as one CUDA graph per pack shape (opt-in: see resolve_args)
    online: bool = False  # hidden states from the target on the fly (eagle/train/online.py), not from files
    layer_ids: list[int] | None = None  # --online: aux layers (None: eagle extract's default)
    draft_shape: DraftShape = DraftShape()  # the drafter layer's shape where it differs from the target's
    trust_remote_code: bool = False  # --online with a custom-code target
    norm_before_residual: bool | None = None  # None: False for a new drafter, the checkpoint's with --init-from
    norm_before_fc: bool | None = None
    norm_output: bool | None = None
    keep_float32: bool = False  # save float32 weights instead of bf16


class EpochRecord(BaseModel):
    epoch: int
    train_loss: float
    val_loss: float | None
    val_acc: list[float]
    est_accept_len: float | None
    train_tok_s: float
    step_ms: float
    steps: int
    seconds: float
    data_wait_s: float = 0.0  # of `seconds`: the loop waiting for its next batch (loader-bound when large)
    target_s: float | None = None  # --online: the target's forwards (GPU time on CUDA), part of `seconds`


class Warmup(BaseModel):
    """What the warm-up before step 1 ran (warm_shapes): one pack of each attention shape this process
    meets in its epochs (forward + backward, no optimizer step) and in validation (forward)."""
    train_shapes: int
    val_shapes: int
    seconds: float  # on CUDA mostly compilation, which the epochs' tok/s then no longer carry
    cuda_graphs: int = 0  # of train_shapes: captured as a CUDA graph of the whole step (--cuda-graphs)


class TrainLog(BaseModel):
    args: TrainArgs
    epochs: list[EpochRecord] = []
    best_epoch: int | None = None
    warmup: Warmup | None = None  # of the last process that trained (a resumed run warms up again)


def default_lr(hidden_size: int) -> float:
    """The peak learning rate when --lr is not given: 1e-4 x 4096 / hidden size, at most 3e-3.

    Adam's stable step size shrinks about as 1 / width for hidden matrices, so the rule scales
    from SpecForge's 1e-4 for 4096-wide targets (Llama-3.1-8B): 5e-5 at 8192 (EAGLE's 70B recipe),
    5.7e-5 for Kimi-K2's 7168, 2e-4 for the 1.1B shape's 2048 (where 3e-3 diverged), and the cap
    3e-3 for the toy's 128, the setting it was tuned with."""
    return min(3e-3, 1e-4 * 4096 / max(1, hidden_size))


def global_batch_text(batch_tokens: int, grad_accum: int, world: int) -> str:
    """The tokens one optimizer step sees: --batch-tokens per pack x --grad-accum x processes.

    The learning rate is not scaled with it (default_lr depends on the width only), so N processes
    take N times fewer, N times larger steps than one: to train as one GPU does, divide
    --batch-tokens (or --grad-accum) by N."""
    parts = [f"{batch_tokens:,}"] + [f"{grad_accum}"] * (grad_accum > 1) + [f"{world} processes"] * (world > 1)
    return f"{' x '.join(parts)} = {batch_tokens * grad_accum * world:,} tokens" if len(parts) > 1 else f"{batch_tokens:,} tokens"


def est_accept_len(step_acc: list[float]) -> float:
    """1 + sum over k of prod_{j<=k} acc_j: expected tokens per target step when a draft is
    accepted up to its first miss (acc_j = accuracy at step j given steps < j were right)."""
    total, run = 1.0, 1.0
    for a in step_acc:
        run *= a
        total += run
    return total


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


def lr_lambda(total_steps: int, warmup_steps: int):
    def f(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress_ = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress_)))
    return f


# ---------------------------------------------------------------- one step
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
      as that issue's workaround (a tiling heuristic; the kernels stay correct)."""
    import torch._dynamo
    import torch._inductor.config as inductor

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), recompile_limit))
    if hasattr(inductor.triton, "coalesce_tiling_analysis"):
        inductor.triton.coalesce_tiling_analysis = False
    if hasattr(inductor, "loop_reindexing_after_fusion"):
        inductor.loop_reindexing_after_fusion = False


def epoch_batches(train_idx: list[int], lengths: list[int], args: TrainArgs, dist: distributed.Topology,
                  epoch: int) -> list[list[int]]:
    """This process's packs of one epoch (seeded by --seed and the epoch: a resumed run sees the same)."""
    from eagle.train import dataset

    return dataset.shard(dataset.pack_batches(train_idx, lengths, args.batch_tokens, args.seed, epoch), dist.rank, dist.world)


def val_batches(val_idx: list[int], lengths: list[int], args: TrainArgs, dist: distributed.Topology) -> list[list[int]]:
    """This process's validation packs (unshuffled: the same at every validation)."""
    from eagle.train import dataset

    return dataset.pack_batches(val_idx, lengths, args.batch_tokens, seed=None)[dist.rank::dist.world]


def warm_up(model: Any, make: Any, train_packs: list[list[int]], val_packs: list[list[int]], lengths: list[int],
            args: TrainArgs, losses: Any, autocast: Any, show: bool = True, graphed: Any = None) -> Warmup:
    """Run one pack of each attention-grid shape before step 1 (--warm-shapes): forward and backward in
    training mode for the training packs (with `graphed`, a GraphedStep: its capture of the shape,
    which runs the forward and backward once and records the step without running it), forward
    without gradients for validation's.

    With shape buckets every pack has --batch-tokens tokens and only its grid [documents, width]
    varies, so on CUDA this is where the step is compiled for every shape the run will meet (all its
    epochs' packs are known from the seed); a shape first met in a later epoch otherwise compiles
    mid-training (an 8-epoch H200 run lost 21 s in epoch 4, docs/benchmarks.md). Gradients are
    cleared and the random state restored: weights, optimizer and data order are untouched, so the
    losses are those of a run without it."""
    import torch

    from eagle.train import dataset

    t0 = time.perf_counter()
    multiple = args.layout_multiple or 1
    train_first = dataset.first_of_each_shape(train_packs, lengths, args.batch_tokens, multiple)
    val_first = dataset.first_of_each_shape(val_packs, lengths, args.batch_tokens, multiple)
    rng = torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    bar = progress(total=len(train_first) + len(val_first), desc="warm-up", unit="shape", disable=None if show else True)
    model.train()
    captured = 0
    for idx in train_first.values():
        if graphed is not None:
            captured += graphed.capture(make(idx))
        else:
            backward_step(model, make(idx), args.ttt_steps, losses, autocast, args.loss_decay)
        for p in model.parameters():
            p.grad = None
        bar.update(1)
    model.eval()
    with torch.no_grad(), autocast:
        for idx in val_first.values():
            forward(model, make(idx), args.ttt_steps, losses, args.loss_decay)
            bar.update(1)
    model.train()
    bar.close()
    torch.set_rng_state(rng[0])
    if rng[1] is not None:
        torch.cuda.set_rng_state_all(rng[1])
        torch.cuda.synchronize()
    return Warmup(train_shapes=len(train_first), val_shapes=len(val_first), seconds=time.perf_counter() - t0,
                  cuda_graphs=captured)


def use_doc_attention(model: Any) -> None:
    """Switch the drafter to per-document attention (same results, attention cost per document)."""
    from eagle.drafter import model as drafter
    from eagle.train import doc_attention

    drafter.set_attn_impl(model, doc_attention.register())
    model._create_mask_fn = doc_attention.no_mask  # the batch's layout replaces speculators' dense mask


# ---------------------------------------------------------------- states
def epoch_dirs(out: Path) -> list[tuple[int, Path]]:
    root = out / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.name.startswith("epoch-") and (p / STATE_FILE).exists():
            try:
                found.append((int(p.name.split("-", 1)[1]), p))
            except ValueError:
                continue
    return sorted(found)


def save_epoch_state(out: Path, epoch: int, payload: dict[str, Any]) -> Path:
    """Write OUT/checkpoints/epoch-N/state.pt via a temp dir + rename (never half-written)."""
    import torch

    final = out / "checkpoints" / f"epoch-{epoch}"
    with atomic_dir(final) as tmp:
        torch.save(payload, tmp / STATE_FILE)
        fsync_file(tmp / STATE_FILE)
    return final


def write_log(out: Path, log: TrainLog) -> None:
    atomic_write_text(out / LOG_FILE, log.model_dump_json(indent=1) + "\n")


def _check_resume_args(saved: TrainArgs, now: TrainArgs, where: Path) -> None:
    diffs = [f"{f}: saved {getattr(saved, f)!r}, now {getattr(now, f)!r}"
             for f in RESUME_FIELDS if getattr(saved, f) != getattr(now, f)]
    if diffs:
        raise EagleError(f"--resume: {where} was trained with other settings ({'; '.join(diffs)}); "
                         "pass the same ones, or drop --resume to start again")


# ---------------------------------------------------------------- the run
def _online_states(args: TrainArgs, target: Target, device: Any) -> tuple[DataSource, list[int]]:
    """--online: the target loaded beside the drafter and the prepared rows it runs on."""
    from eagle.train import online

    layer_ids = target.layer_ids(args.layer_ids)
    model = online.load_target(target.dir, device, args.trust_remote_code)
    return online.OnlineStates(args.data, model, layer_ids, args.batch_tokens), layer_ids


def _init_from_checkpoint(args: TrainArgs, target: Target, layer_ids: list[int]) -> Any:
    """The --init-from checkpoint (any layout), checked against the target, the data and the flags;
    a CheckpointError naming every problem in one line before anything trains or is written."""
    from eagle.drafter import checkpoint
    from eagle.drafter.model import checkpoint_shape

    src = Path(str(args.init_from))
    ck = checkpoint.read_drafter(src, target.num_layers)
    problems = checkpoint.target_fit_problems(ck.cfg, target.text)
    if ck.cfg.layer_ids != layer_ids:
        fix = "train with --layer-ids" if args.online else "extract the data with --layer-ids"
        problems.append(f"the drafter reads target layers {ck.cfg.layer_ids}, the data holds {layer_ids}: "
                        f"{fix} {','.join(map(str, ck.cfg.layer_ids or []))}")
    if ck.cfg.aux_hidden_size != ck.cfg.hidden_size:
        problems.append(f"target_hidden_size {ck.cfg.aux_hidden_size} differs from the drafter's hidden size "
                        f"{ck.cfg.hidden_size}: speculators cannot train such a drafter (vLLM serves it as it is)")
    have_shape = checkpoint_shape(ck)
    for name in args.draft_shape.set_fields():  # the drafter's own layer shape is kept
        if getattr(args.draft_shape, name) != getattr(have_shape, name):
            problems.append(f"{name}: drafter has {getattr(have_shape, name)}, --draft-* asks for "
                            f"{getattr(args.draft_shape, name)}; a fine-tune keeps the drafter's layer shape: drop it")
    have = ck.cfg.flags()
    for flag in TRAIN_NORM_FLAGS:
        asked = getattr(args, flag)
        if asked is not None and asked != have[flag]:
            problems.append(f"--{'' if asked else 'no-'}{flag.replace('_', '-')}: the drafter was trained with "
                            f"{flag}={str(have[flag]).lower()}, and a fine-tune keeps its norms; drop the flag")
    if problems:
        raise checkpoint.CheckpointError(f"--init-from {src}: " + "; ".join(problems))
    return ck


def _vocab_change(ck: Any, d2t: Any) -> str:
    """How the data's draft vocabulary relates to the drafter's (for the log)."""
    import torch

    new_ids = set((torch.arange(d2t.shape[0]) + d2t.long()).tolist())
    old_ids = set(ck.draft_token_ids())
    if old_ids == new_ids:
        return f"draft vocabulary: the drafter's own ({len(new_ids)} tokens)"
    return (f"draft vocabulary: changed to the data's ({len(new_ids)} tokens, {len(new_ids - old_ids)} not in the "
            f"drafter's {len(old_ids)}); the trainable layers carry over")


def why_no_cuda_graphs(args: TrainArgs, device: Any, buckets: bool) -> str | None:
    """Why the step cannot run as CUDA graphs (eagle/train/step_graph.py) in this run, or None."""
    if device.type != "cuda":
        return f"they need a CUDA device (this run trains on {device.type})"
    if not buckets:
        return "they need shape buckets (--shape-buckets): without them every pack is a new shape to capture"
    if args.world_size > 1:
        return (f"they run in one process; under DDP ({args.world_size} processes) the gradient all-reduce sits "
                "inside the step")
    if args.grad_accum > 1:
        return "they capture one batch per optimizer step; --grad-accum accumulates several"
    return None


def resolve_args(args: TrainArgs, hidden_size: int, device: Any) -> TrainArgs:
    """Fill the settings left to the run: the learning rate (default_lr), the shape buckets (on for
    CUDA: every pack padded to --batch-tokens and per-document widths rounded up to BUCKET_MULTIPLE,
    so the compiled step sees a few shapes instead of one per batch) and the CUDA graphs (asked for
    only: faster in the real loop on the H200, but slower than the eager step in one fixed-pack
    feed, cause open, docs/benchmarks.md session 10; refused where they cannot run)."""
    buckets = device.type == "cuda" if args.shape_buckets is None else args.shape_buckets
    multiple = args.layout_multiple or (BUCKET_MULTIPLE if buckets else 1)
    warm = buckets if args.warm_shapes is None else args.warm_shapes
    if warm and not buckets:
        raise EagleError("--warm-shapes needs shape buckets (--shape-buckets): without them every pack has its own "
                         "length, so warming each shape would run the whole data once more", code=2)
    why = why_no_cuda_graphs(args, device, buckets)
    if args.cuda_graphs and why:
        raise EagleError(f"--cuda-graphs: {why}; leave the flag out (the step then runs without graphs)", code=2)
    graphs = bool(args.cuda_graphs)
    return args.model_copy(update={"lr": args.lr or default_lr(hidden_size), "shape_buckets": buckets,
                                   "layout_multiple": multiple, "warm_shapes": warm, "cuda_graphs": graphs})


def _check_args(args: TrainArgs) -> None:
    problems = []
    if args.epochs < 1:
        problems.append(f"--epochs must be >= 1 (got {args.epochs})")
    if not 1 <= args.ttt_steps <= MAX_TTT_STEPS:
        problems.append(f"--ttt-steps must be in 1..{MAX_TTT_STEPS} (got {args.ttt_steps})")
    if args.lr is not None and args.lr <= 0:
        problems.append(f"--lr must be > 0 (got {args.lr:g})")
    if not 0 < args.loss_decay <= 1:
        problems.append(f"--loss-decay must be in (0, 1] (got {args.loss_decay:g})")
    for name in ("grad_accum", "layout_multiple"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    for name in ("val_every", "save_every"):
        if getattr(args, name) < 0:
            problems.append(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(args, name)})")
    if problems:
        raise EagleError("; ".join(problems))


def train(args: TrainArgs, echo: bool = True) -> TrainLog:  # noqa: C901 - one readable loop
    import torch

    from eagle.drafter import model as drafter
    from eagle.train import dataset
    from eagle.train.step_graph import set_capturable
    from eagle.train.step_log import StepLog

    _check_args(args)
    dist, device = distributed.init(args.device)
    args = args.model_copy(update={"world_size": dist.world})
    out, data_dir, model_dir = Path(args.out), Path(args.data), Path(args.model)
    say = (lambda msg: click.echo(msg, err=True)) if (echo and dist.main) else (lambda msg: None)

    target = open_target(model_dir, args.trust_remote_code)
    target.draft_layer_config(args.draft_shape)  # a bad shape fails here, before any work
    args = resolve_args(args, target.hidden_size, device)
    data: DataSource
    if args.online:  # cheap checks first (layer ids, dataset, vocabulary), then the target's load
        from eagle.data.hidden_io import open_prepared

        target.layer_ids(args.layer_ids)
        open_prepared(data_dir)
        d2t, t2d = dataset.read_vocab(data_dir)
        data, layer_ids = _online_states(args, target, device)
        args = args.model_copy(update={"layer_ids": layer_ids})
    elif args.layer_ids is not None:
        raise EagleError("--layer-ids goes with --online; offline hidden states carry their layers in "
                         f"{data_dir}/eagle_data.json (choose them in `eagle extract --layer-ids`)")
    else:
        data = dataset.HiddenStates(data_dir, args.batch_tokens)
        layer_ids = dataset.read_layer_ids(data_dir)
        d2t, t2d = dataset.read_vocab(data_dir)
        target.layer_ids(layer_ids, where=f"layer ids of {data_dir}/eagle_data.json")
    dataset.check_lengths(data.lengths, data.rows, args.batch_tokens, f"--data {data_dir}")
    problems = []
    if len(layer_ids) != data.num_aux:
        problems.append(f"layer ids {layer_ids} name {len(layer_ids)} aux layers but the hidden states hold {data.num_aux}")
    if data.hidden_size != target.hidden_size:
        problems.append(f"hidden states have size {data.hidden_size}, the target's hidden_size is {target.hidden_size}")
    if t2d.shape[0] != target.vocab_size:
        problems.append(f"vocab.safetensors t2d covers {t2d.shape[0]} tokens, the target's vocab_size is {target.vocab_size}")
    if problems:
        raise EagleError(f"--data {data_dir} does not fit --model {model_dir}: " + "; ".join(problems))

    torch.manual_seed(args.seed)
    if args.init_from:
        ck = _init_from_checkpoint(args, target, layer_ids)
        model = drafter.init_from(ck, model_dir, layer_ids=layer_ids, d2t=d2t, t2d=t2d, ttt_steps=args.ttt_steps,
                                  trust_remote_code=args.trust_remote_code)
        say(f"fine-tuning {args.init_from} ({ck.layout} layout); {_vocab_change(ck, d2t)}; embedding and "
            f"lm_head rows from {model_dir}")
    else:
        flags: dict[str, Any] = {flag: bool(getattr(args, flag)) for flag in TRAIN_NORM_FLAGS}
        model = drafter.build_drafter(model_dir, layer_ids=layer_ids, d2t=d2t, t2d=t2d, ttt_steps=args.ttt_steps,
                                      shape=args.draft_shape, trust_remote_code=args.trust_remote_code, **flags)
    # The checkpoint records the target it was trained for (the writer makes a local path absolute).
    model.config.speculators_config.verifier.name_or_path = str(model_dir)
    model.config.speculators_config.proposal_methods[0].speculative_tokens = args.ttt_steps  # type: ignore[attr-defined]  # speculators types the list as the base config; ours is greedy
    drafter.check_savable(model, out)  # a config the writer refuses fails now, not at save
    model.to(device)  # type: ignore[arg-type]  # transformers' decorated .to() has a wrong signature
    use_doc_attention(model)
    compile_settings()

    train_idx, val_idx = dataset.split_indices(len(data), args.val_fraction, args.seed)
    if not train_idx:
        raise EagleError(f"{data_dir}: no training samples left after the validation split")
    accum = args.grad_accum
    batches_per_epoch = len(epoch_batches(train_idx, data.lengths, args, dist, 0))
    if batches_per_epoch == 0:
        raise EagleError(f"{len(train_idx)} training samples make fewer batches than the {dist.world} processes; "
                         "lower --batch-tokens or use fewer processes")
    steps_per_epoch = -(-batches_per_epoch // accum)  # optimizer steps
    params = [p for p in model.parameters() if p.requires_grad]
    assert args.lr is not None  # resolved before training (default_lr)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    total = steps_per_epoch * args.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total, int(total * args.warmup_fraction)))

    log = TrainLog(args=args)
    start_epoch = 1
    found = epoch_dirs(out)
    if args.resume and found:
        last, where = found[-1]
        try:
            payload = torch.load(where / STATE_FILE, map_location="cpu", weights_only=False)
        except Exception as e:  # a truncated or foreign file: zip, pickle or EOF errors
            raise EagleError(f"{where / STATE_FILE}: unreadable training state ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else 'damaged'}); delete {where} to resume "
                             "from the epoch before, or train without --resume") from None
        wanted = ("log", "model", "optimizer", "scheduler", "rng")
        if not isinstance(payload, dict) or any(key not in payload for key in wanted):
            raise EagleError(f"{where / STATE_FILE}: not a training state written by `eagle train` (it needs "
                             f"{', '.join(wanted)}); delete {where} to resume from the epoch before")
        saved = TrainLog.model_validate(payload["log"])
        _check_resume_args(saved.args, args, where)
        model.load_state_dict(payload["model"], strict=False)
        opt.load_state_dict(payload["optimizer"])
        sched.load_state_dict(payload["scheduler"])
        if saved.args.epochs != args.epochs:
            sched.lr_lambdas[0] = lr_lambda(total, int(total * args.warmup_fraction))
            warn(f"--epochs changed from {saved.args.epochs} to {args.epochs}: the learning-rate schedule is stretched")
        torch.set_rng_state(payload["rng"]["torch"])
        log = saved.model_copy(update={"args": args})
        start_epoch = last + 1
        say(f"resuming from {where} (epoch {last} done)")
    elif args.resume:
        warn(f"--resume: no epoch states under {out}/checkpoints; starting from scratch")
    elif found and dist.main:
        warn(f"{out}/checkpoints holds states of an earlier run; starting again (use --resume to continue it)")
        shutil.rmtree(out / "checkpoints")
    distributed.barrier(dist)

    losses = drafter.loss_config()
    drafter.use_sync_free_metrics()
    set_capturable(opt, bool(args.cuda_graphs))  # a resumed state may come from a run with the other setting
    autocast = step_autocast(device, cache=not args.cuda_graphs)
    graphed = graphed_train_step(model, opt, params, args.ttt_steps, losses, autocast, args.loss_decay) \
        if args.cuda_graphs else None
    hdt = torch.bfloat16 if device.type == "cuda" else torch.float32
    pad_to = args.batch_tokens if args.shape_buckets else None

    layout_multiple = args.layout_multiple
    assert layout_multiple is not None  # resolved before training, with the shape buckets

    def make(idx: list[int]) -> dict[str, Any]:
        return data.batch(idx, device, hdt, layout=True, layout_multiple=layout_multiple, pad_to=pad_to)

    k, decay = args.ttt_steps, args.loss_decay
    say(f"training {sum(p.numel() for p in params):,} parameters on {device} x{dist.world}: "
        f"{len(train_idx)} train / {len(val_idx)} val samples, {steps_per_epoch} steps/epoch"
        f"{f' of {accum} batches' if accum > 1 else ''}, epochs {start_epoch}..{args.epochs}, lr {args.lr:.3g}, "
        f"global batch {global_batch_text(args.batch_tokens, accum, dist.world)}"
        f"{f', shape buckets (packs of {pad_to}, widths x{args.layout_multiple})' if args.shape_buckets else ''}")

    if args.warm_shapes:
        log.warmup = warm_up(model, make, [b for e in range(start_epoch, args.epochs + 1)
                                           for b in epoch_batches(train_idx, data.lengths, args, dist, e)],
                             val_batches(val_idx, data.lengths, args, dist), data.lengths, args, losses, autocast,
                             show=dist.main, graphed=graphed)
        data.take_target_seconds()  # --online: the warm-up's target forwards are not training time
        say(f"warm-up: {log.warmup.train_shapes} training and {log.warmup.val_shapes} validation pack shapes run once "
            f"before step 1 in {log.warmup.seconds:.1f} s{' (their compilation)' if device.type == 'cuda' else ''}"
            + (f"; {log.warmup.cuda_graphs} captured as CUDA graphs" if graphed is not None else ""))

    tb = StepLog(out / "tensorboard" if (args.tensorboard and dist.main) else None, k, decay, series=dist.main)
    ddp_model: Any = model
    if dist.world > 1:
        import torch._dynamo
        from torch.nn.parallel import DistributedDataParallel

        # dynamo's DDP optimizer splits every compiled graph at gradient-bucket boundaries so that the
        # all-reduce of early buckets overlaps the rest of the backward. The drafter gains nothing from
        # it: every trainable weight is used by every draft step (fc by step 0, whose backward runs
        # last), so all gradients are ready only at the end of the backward. Splitting would only add
        # graphs to compile and kernel launches to a step that is launch-bound already.
        torch._dynamo.config.optimize_ddp = False
        ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                            broadcast_buffers=False)

    def validate(opt_step: int) -> tuple[float | None, list[float]]:
        val_loss, val_acc = evaluate(model, data, val_idx, args, dist, device, losses, autocast, make)
        if val_loss is not None:
            tb.scalars({"val/loss": val_loss, "val/est_accept_len": est_accept_len(val_acc),
                        **{f"val/acc_step{i}": a for i, a in enumerate(val_acc)}}, opt_step)
        return val_loss, val_acc

    opt_step = (start_epoch - 1) * steps_per_epoch
    try:
        for epoch in range(start_epoch, args.epochs + 1):
            batches = epoch_batches(train_idx, data.lengths, args, dist, epoch)
            model.train()
            t0, tokens, loss_sum, side_s, target_s = time.perf_counter(), 0, 0.0, 0.0, 0.0
            bar = progress(total=len(batches), desc=f"epoch {epoch}/{args.epochs}", unit="batch",
                           disable=None if dist.main else True)
            stream = (dataset.prefetched(make, batches, dataset.loader_workers(device))
                      if data.prefetch else map(make, batches))
            wait, w0 = 0.0, time.perf_counter()
            group, in_group = None, 0
            opt.zero_grad(set_to_none=True)
            for step, batch in enumerate(stream):
                wait += time.perf_counter() - w0
                group_size = min(accum, len(batches) - (step // accum) * accum)
                last = step % accum == group_size - 1
                sync = contextlib.nullcontext() if last or dist.world == 1 else ddp_model.no_sync()
                if graphed is not None:  # the whole step, clip and AdamW included (one batch per step)
                    scalars = graphed(batch)
                    loss = scalars[0]
                else:
                    with sync:
                        loss, metrics = backward_step(ddp_model, batch, k, losses, autocast, decay, 1.0 / group_size)
                    scalars = step_scalars(loss, metrics, k)
                group, in_group = (scalars if group is None else group + scalars), in_group + 1
                loss_sum += loss  # a device tensor: no host sync per step
                tokens += data.tokens(batches[step])  # real tokens, padding not counted
                if last:
                    lr_now = float(sched.get_last_lr()[0])
                    if graphed is None:
                        optimizer_step(opt, sched, params)
                    else:
                        sched.step()
                    opt_step += 1
                    tb.step(opt_step, group, in_group, lr_now)
                    group, in_group = None, 0
                    if (args.val_every and opt_step % args.val_every == 0) or (args.save_every and opt_step % args.save_every == 0):
                        v0 = time.perf_counter()
                        target_s += data.take_target_seconds()
                        if args.val_every and opt_step % args.val_every == 0:
                            val_loss, val_acc = validate(opt_step)
                            acc = " ".join(f"{a:.3f}" for a in val_acc)
                            say(f"step {opt_step}: val_loss {val_loss if val_loss is not None else float('nan'):.4f}  "
                                f"val_acc [{acc}]")
                            model.train()
                        if args.save_every and opt_step % args.save_every == 0 and dist.main:
                            drafter.save(model, out / "checkpoints" / f"step-{opt_step}", keep_float32=args.keep_float32)
                        data.take_target_seconds()  # validation's forwards are not training time
                        distributed.barrier(dist)
                        side_s += time.perf_counter() - v0
                rate = tokens * dist.world / max(time.perf_counter() - t0 - side_s, 1e-9)
                bar.update(1)
                if step % 25 == 24 or step == len(batches) - 1:  # reading the loss waits for the GPU
                    bar.set_postfix(loss=f"{float(loss_sum) / (step + 1):.4f}", tok_s=f"{rate:,.0f}")
                w0 = time.perf_counter()
            bar.close()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0 - side_s
            target_s += data.take_target_seconds()
            n_batches, loss_total, tok_total = distributed.all_sum([len(batches), float(loss_sum), tokens], dist, device)
            val_loss, val_acc = validate(opt_step)
            data.take_target_seconds()  # validation's forwards are not training time
            record = EpochRecord(
                epoch=epoch, train_loss=loss_total / max(n_batches, 1), val_loss=val_loss, val_acc=val_acc,
                est_accept_len=est_accept_len(val_acc) if val_acc else None,
                train_tok_s=tok_total / max(seconds, 1e-9), step_ms=1000 * seconds / max(len(batches), 1),
                steps=int(n_batches), seconds=seconds, data_wait_s=wait,
                target_s=target_s if data.runs_target else None)
            log.epochs.append(record)
            tb.scalars({"speed/train_tok_s": record.train_tok_s}, opt_step)
            score = record.val_loss if record.val_loss is not None else record.train_loss
            prev = next((r for r in log.epochs if r.epoch == log.best_epoch), None)
            best = prev is None or score < _score(prev)
            if best:
                log.best_epoch = epoch
            if dist.main:
                out.mkdir(parents=True, exist_ok=True)
                if best:
                    drafter.save(model, out, keep_float32=args.keep_float32)
                save_epoch_state(out, epoch, {
                    "model": drafter.trainable_state(model), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "rng": {"torch": torch.get_rng_state()},
                    "log": log.model_dump()})
                write_log(out, log)
                acc = " ".join(f"{a:.3f}" for a in record.val_acc)
                say(f"epoch {epoch}: train_loss {record.train_loss:.4f}  val_loss "
                    f"{record.val_loss if record.val_loss is not None else float('nan'):.4f}  val_acc [{acc}]  "
                    f"est_accept_len {record.est_accept_len or float('nan'):.2f}  {record.train_tok_s:,.0f} tok/s  "
                    f"{record.step_ms:.0f} ms/batch  (data wait {record.data_wait_s / max(seconds, 1e-9):.0%}"
                    + (f", target {record.target_s / max(seconds, 1e-9):.0%}" if record.target_s is not None else "")
                    + f"){'  *best' if best else ''}")
            distributed.barrier(dist)
    finally:
        tb.close()
        data.close()
    return log


def _score(r: EpochRecord) -> float:
    return r.val_loss if r.val_loss is not None else r.train_loss


def evaluate(model: Any, data: DataSource, val_idx: list[int], args: TrainArgs, dist: distributed.Topology, device: Any,
             losses: Any, autocast: Any, make: Any = None) -> tuple[float | None, list[float]]:
    """(mean val loss per batch, per-step conditional accuracies), summed over all processes.
    `make(indices) -> batch` builds batches as training does (same shapes: no recompiles)."""
    import torch

    if not val_idx:
        return None, []
    make = make or (lambda idx: data.batch(idx, device))
    batches = val_batches(val_idx, data.lengths, args, dist)
    k = args.ttt_steps
    sums = [0.0] * (2 + 2 * k)  # batches, loss, correct_0..k-1, total_0..k-1
    model.eval()
    with torch.no_grad(), autocast:
        for idx in batches:
            loss, metrics = forward(model, make(idx), k, losses, args.loss_decay)
            sums[0] += 1
            sums[1] += float(loss)
            for s in range(k):
                sums[2 + s] += float(metrics[f"full_acc_{s}_sum"])
                sums[2 + k + s] += float(metrics[f"full_acc_{s}_total"])
    model.train()
    sums = distributed.all_sum(sums, dist, device)
    if sums[0] == 0:
        return None, []
    return sums[1] / sums[0], step_accuracies(sums[2:2 + k], sums[2 + k:])


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
        metrics["est_accept_len"] = best.est_accept_len or 1.0
    return metrics


@click.command("train", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "model", required=True, type=click.Path(path_type=Path),
              help="Target model directory (transformers; its embeddings, lm_head and final norm are read "
                   "from its safetensors, the rest of it is never loaded).")
@click.option("--data", required=True, type=click.Path(path_type=Path),
              help="Data directory from `eagle prepare` + `eagle extract` + `eagle vocab` "
                   "(with --online: `eagle prepare` + `eagle vocab --model`, no extraction).")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Output: the servable checkpoint of the best epoch, plus checkpoints/epoch-N/ states.")
@click.option("--epochs", default=TrainArgs.model_fields["epochs"].default, show_default=True, type=int)
@click.option("--lr", default=None, type=float,
              help="Peak AdamW learning rate (linear warm-up over 5% of steps, cosine decay to 10%) "
                   "[default: 1e-4 x 4096 / the target's hidden size, at most 3e-3: 1e-4 for 8B-class "
                   "targets, 5e-5 at hidden 8192; see docs/eagle.md].")
@click.option("--ttt-steps", default=3, show_default=True, type=int,
              help=f"Draft steps trained (test-time training depth, 1..{MAX_TTT_STEPS}); also the "
                   "checkpoint's speculative_tokens.")
@click.option("--loss-decay", default=TrainArgs.model_fields["loss_decay"].default, show_default=True, type=float,
              help="Draft step i's loss weighs DECAY**i (EAGLE-3's recipe: 0.8; 1.0 weighs all steps alike).")
@click.option("--batch-tokens", default=TrainArgs.model_fields["batch_tokens"].default, show_default=True, type=int,
              help="Tokens per packed batch (per process). A sample longer than this is refused, never cut. "
                   "The default suits the toy target on a CPU; on GPUs use 4096-16384.")
@click.option("--grad-accum", default=1, show_default=True, type=int,
              help="Batches per optimizer step (gradient accumulation; the schedule counts optimizer steps).")
@click.option("--val-fraction", default=0.1, show_default=True, type=float, help="Samples held out for validation.")
@click.option("--val-every", default=0, show_default=True, type=int,
              help="Optimizer steps between validations (printed and in TensorBoard); 0: at each epoch's end only.")
@click.option("--save-every", default=0, show_default=True, type=int,
              help="Optimizer steps between servable checkpoints OUT/checkpoints/step-N; 0: the best epoch only.")
@click.option("--tensorboard/--no-tensorboard", default=True, show_default=True,
              help="Write per-step losses, accuracies and the learning rate to OUT/tensorboard "
                   "(`tensorboard --logdir OUT/tensorboard`).")
@click.option("--resume", is_flag=True, help="Continue from the last OUT/checkpoints/epoch-N (exactly: same losses).")
@click.option("--init-from", type=click.Path(path_type=Path), default=None,
              help="Fine-tune this drafter (any published EAGLE-3 layout: speculators / vLLM, EAGLE / SpecForge) "
                   "instead of starting from scratch. Its trainable layers become float32 masters and keep their "
                   "shape; the embedding and the lm_head rows of DATA's draft vocabulary (old or new) come from "
                   "--model.")
@click.option("--norm-before-residual/--no-norm-before-residual", default=None,
              help="New drafter: the first layer's residual is hidden_norm(h) instead of h [default: off; "
                   "with --init-from: the drafter's].")
@click.option("--norm-before-fc/--no-norm-before-fc", default=None,
              help="New drafter: RMSNorm over the concatenated aux hidden states before fc (input_norm) "
                   "[default: off; with --init-from: the drafter's].")
@click.option("--norm-output/--no-norm-output", default=None,
              help="New drafter: feed the post-norm output to the next draft step (EAGLE 3.1) "
                   "[default: off; with --init-from: the drafter's].")
@click.option("--keep-float32", is_flag=True,
              help="Save float32 weights (default: bf16, as published drafters are; training is float32 either way).")
@click.option("--online", is_flag=True,
              help="Compute the target's hidden states in the training loop (the target sits beside the "
                   "drafter on the device) instead of reading `eagle extract`'s files: no disk, no extraction "
                   "step, one target forward per step.")
@click.option("--layer-ids", default=None, metavar="A,B,C",
              help="With --online: the target's aux layers, ascending [default: 2,N//2,N-3, as eagle extract].")
@click.option("--shape-buckets/--no-shape-buckets", default=None,
              help="Pad every pack to --batch-tokens and round each pack's longest document up to a "
                   f"multiple of {BUCKET_MULTIPLE} (same losses): variable-length data then runs in a few "
                   "compiled shapes, at the fixed-shape step's speed [default: on with CUDA, off on CPU].")
@click.option("--layout-multiple", default=None, type=int,
              help=f"The per-document attention width's multiple [default: {BUCKET_MULTIPLE} with shape "
                   "buckets, else 1].")
@click.option("--warm-shapes/--no-warm-shapes", default=None,
              help="Before step 1, run one pack of each attention shape the run's epochs and validation will meet "
                   "(known from --seed): on CUDA every shape compiles there, not mid-epoch, and the epochs' tok/s "
                   "is the step's own. Same losses [default: on with shape buckets].")
@click.option("--cuda-graphs/--no-cuda-graphs", default=None,
              help="Run the whole step (forward, backward, clip, AdamW) as one CUDA graph per pack shape, "
                   "captured in the warm-up: the host no longer launches its ~500 kernels one by one. Same "
                   "losses. Needs CUDA, shape buckets, one process and no --grad-accum [default: off; on the "
                   "H200 eagle train's loop ran 1.14x as fast with it (1,000 rows, 1.1B shape), but a fixed-pack "
                   "feed measured slower with it than without, for a reason not yet found].")
@click.option("--draft-config", type=click.Path(path_type=Path), default=None,
              help="JSON file with the drafter layer's shape (any of intermediate_size, num_attention_heads, "
                   "num_key_value_heads, head_dim; a published drafter's config.json works too). Flags below "
                   "override it; unset fields are the target's.")
@click.option("--draft-intermediate-size", type=click.IntRange(1), default=None,
              help="The drafter layer's MLP size [default: the target's].")
@click.option("--draft-heads", type=click.IntRange(1), default=None,
              help="The drafter layer's attention heads [default: the target's].")
@click.option("--draft-kv-heads", type=click.IntRange(1), default=None,
              help="The drafter layer's key/value heads; must divide --draft-heads [default: the target's].")
@click.option("--draft-head-dim", type=click.IntRange(2), default=None,
              help="The drafter layer's head size (heads x head dim may differ from the hidden size) "
                   "[default: the target's, else hidden // heads].")
@click.option("--seed", default=0, show_default=True, type=int)
@device_option("auto, cpu, cuda or cuda:N.")
@trust_remote_code_option
@json_option("Print the summary metrics as JSON.")
def command(model: Path, data: Path, out: Path, epochs: int, lr: float | None, ttt_steps: int, loss_decay: float,
            batch_tokens: int, grad_accum: int, val_fraction: float, val_every: int, save_every: int,
            tensorboard: bool, resume: bool, init_from: Path | None, norm_before_residual: bool | None,
            norm_before_fc: bool | None, norm_output: bool | None, keep_float32: bool, online: bool,
            layer_ids: str | None,
            shape_buckets: bool | None, layout_multiple: int | None, warm_shapes: bool | None,
            cuda_graphs: bool | None, draft_config: Path | None,
            draft_intermediate_size: int | None, draft_heads: int | None, draft_kv_heads: int | None,
            draft_head_dim: int | None, seed: int, device: str, trust_remote_code: bool, as_json: bool) -> None:
    """Train the EAGLE-3 drafter (speculators' Eagle3 draft model, our own loop).

    \b
    Example:
      eagle train --model work/target --data work/data --out work/draft
      torchrun --nproc-per-node 2 -m eagle.cli train --model ... --data ... --out ...   # DDP
      eagle train --model work/target --data work/data --out work/draft --online  # no eagle extract
    \b
    Writes OUT/config.json + OUT/model.safetensors (vLLM loads OUT as the drafter; bf16 without the
    frozen embedding, verifier.name_or_path absolute), and the metrics train_loss, val_loss,
    val_acc_0..k-1, est_accept_len, train_tok_s to $RUNBOOK_METRICS.
    The drafter is one Llama decoder layer for every target (Llama, Qwen3, DeepSeek-V3 / Kimi, ...);
    its shape is the target's unless --draft-config / --draft-* set it.
    Exit codes: 0 trained, 1 bad data or environment, 2 bad arguments (a drafter shape whose heads do
    not divide, a target without a text model, a layer id out of range, an --init-from drafter that
    cannot be read or does not fit); the message names the file and the fix, and nothing is written.
    """
    with refusals():
        shape = read_draft_shape(draft_config) if draft_config is not None else DraftShape()
        shape = merge_shape(shape, DraftShape(intermediate_size=draft_intermediate_size, num_attention_heads=draft_heads,
                                              num_key_value_heads=draft_kv_heads, head_dim=draft_head_dim))
        args = TrainArgs(model=str(model), data=str(data), out=str(out), epochs=epochs, lr=lr, ttt_steps=ttt_steps,
                         loss_decay=loss_decay, batch_tokens=batch_tokens, grad_accum=grad_accum,
                         val_fraction=val_fraction, val_every=val_every, save_every=save_every,
                         tensorboard=tensorboard, seed=seed, init_from=str(init_from) if init_from else None,
                         device=device, resume=resume, online=online,
                         layer_ids=None if layer_ids is None else split_layer_ids(layer_ids),
                         shape_buckets=shape_buckets, layout_multiple=layout_multiple, warm_shapes=warm_shapes,
                         cuda_graphs=cuda_graphs, draft_shape=shape,
                         trust_remote_code=trust_remote_code, norm_before_residual=norm_before_residual,
                         norm_before_fc=norm_before_fc, norm_output=norm_output, keep_float32=keep_float32)
        log = train(args)
    if not distributed.is_main():
        return
    metrics = summary_metrics(log)
    diverged = sorted(name for name, value in metrics.items() if not math.isfinite(value))
    if diverged:
        fail(f"training diverged: {', '.join(diverged)} not finite (see {Path(args.out) / 'train_log.json'}); "
             f"lower --lr (now {log.args.lr:g}) or check the hidden states with `eagle extract` (it validates them)")

    def show() -> None:
        print_table([(k, v) for k, v in metrics.items()], headers=["metric", "value"])
        click.echo(f"drafter (best epoch {log.best_epoch}) written to {out}")

    finish(metrics, as_json, metrics=metrics, show=show)
    sys.stdout.flush()
