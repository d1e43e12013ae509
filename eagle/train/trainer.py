"""`eagle train`'s loop: train (or fine-tune) the EAGLE-3 drafter on the target's hidden states.

Our own loop around speculators' Eagle3DraftModel (eagle/drafter/model.py): AdamW, linear warm-up then
cosine decay, bf16 autocast on GPU, DDP under torchrun (gloo on CPU, nccl on GPU; rank 0 writes).
The hidden states come from `eagle extract`'s files (eagle/train/dataset.py) or, with --online, from the
target itself, run beside the drafter on each batch (eagle/train/online.py), or, with --hidden-states
vllm, from a vLLM extraction server per batch (eagle/train/server_fed.py). The settings are one
TrainConfig (eagle/train/config.py), the step's parts live in eagle/train/steps.py, and what the loop
tells an observer goes through eagle/train/hooks.py's StepHooks.

    log = Trainer(config).run()     # setup, resume, ready (warm-up, step log, DDP), then per epoch:
                                    # epoch -> validate -> save; train(config) is the same in one call

OUT/
    config.json, model.safetensors   the servable checkpoint of the best epoch (lowest val loss)
    train_log.json                   per-epoch losses, accuracies, speed
    checkpoints/epoch-N/state.pt     trained weights + optimizer + scheduler + RNG (for --resume)
    checkpoints/step-state.pt        --save-every-steps N: the same plus the data position (epoch, packs
                                     done, the epoch's pack order) and the epoch's running sums, every
                                     N optimizer steps (temp file + fsync + rename): --resume continues
                                     mid-epoch with the losses of a run never stopped
"""

from __future__ import annotations

import contextlib
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle import distributed
from eagle.common import EagleError, check_file, progress, warn
from eagle.fsutil import atomic_dir, atomic_path, atomic_write_text, fsync_file
from eagle.target import Target, open_target
from eagle.train import dataset, steps
from eagle.train.config import (
    TRAIN_NORM_FLAGS,
    EpochRecord,
    TrainConfig,
    TrainLog,
    Warmup,
    check_config,
    check_resume,
    global_batch_text,
    resolve_config,
)
from eagle.train.dataset import DataSource
from eagle.train.hooks import StepHooks, current
from eagle.train.steps import (
    backward_step,
    compile_settings,
    forward,
    graphed_train_step,
    lr_lambda,
    step_accuracies,
    step_autocast,
    step_scalars,
    use_doc_attention,
    val_accept_len,
)

__all__ = ["LOG_FILE", "STATE_FILE", "Trainer", "epoch_batches", "train", "val_batches"]

STATE_FILE = "state.pt"
STEP_STATE = "step-state.pt"  # under OUT/checkpoints: the latest --save-every-steps state
LOG_FILE = "train_log.json"


def train(config: TrainConfig, echo: bool = True, hooks: StepHooks | None = None) -> TrainLog:
    """Train as `eagle train` does (Trainer(config, ...).run()); `echo`: print progress lines to stderr."""
    return Trainer(config, hooks=hooks, echo=echo).run()


def epoch_batches(train_idx: list[int], lengths: list[int], config: TrainConfig, dist: distributed.Topology,
                  epoch: int) -> list[list[int]]:
    """This process's packs of one epoch (seeded by --seed and the epoch: a resumed run sees the same)."""
    packs = dataset.pack_batches(train_idx, lengths, config.batch_tokens, config.seed, epoch)
    return dataset.shard(packs, dist.rank, dist.world)


def val_batches(val_idx: list[int], lengths: list[int], config: TrainConfig,
                dist: distributed.Topology) -> list[list[int]]:
    """This process's validation packs (unshuffled: the same at every validation)."""
    return dataset.pack_batches(val_idx, lengths, config.batch_tokens, seed=None)[dist.rank::dist.world]


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
    final = out / "checkpoints" / f"epoch-{epoch}"
    with atomic_dir(final) as tmp:
        torch.save(payload, tmp / STATE_FILE)
        fsync_file(tmp / STATE_FILE)
    return final


def read_epoch_state(where: Path) -> dict[str, Any]:
    """An epoch state as save_epoch_state wrote it, or an EagleError naming the file and the way out."""
    return read_state(where / STATE_FILE, where, "from the epoch before")


def read_state(path: Path, remove: Path, before: str, also: tuple[str, ...] = ()) -> dict[str, Any]:
    """A training state file (epoch or step state), or an EagleError naming it and the way out
    (delete `remove` to resume `before`)."""
    check_file(path, "training state", fix=f"delete {remove} to resume {before}, or train "
               "without --resume")  # torch.load of a FIFO blocks in its open
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file: zip, pickle or EOF errors
        raise EagleError(f"{path}: unreadable training state ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'damaged'}); delete {remove} to resume "
                         f"{before}, or train without --resume") from None
    wanted = ("log", "model", "optimizer", "scheduler", "rng", *also)
    if not isinstance(payload, dict) or any(key not in payload for key in wanted):
        raise EagleError(f"{path}: not a training state written by `eagle train` (it needs "
                         f"{', '.join(wanted)}); delete {remove} to resume {before}")
    return payload


def save_step_state(out: Path, payload: dict[str, Any]) -> Path:
    """Write OUT/checkpoints/step-state.pt: a temp file beside it, fsync, rename (never half-written)."""
    path = out / "checkpoints" / STEP_STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return path


def rng_states() -> dict[str, Any]:
    """Every random state a step may draw from: torch's (CPU, and CUDA when present), Python's,
    numpy's when numpy is loaded."""
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        states["numpy"] = np.random.get_state()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what rng_states saved (an epoch state of an older eagle holds only torch's)."""
    torch.set_rng_state(states["torch"])
    if "python" in states:
        random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        import numpy as np

        np.random.set_state(states["numpy"])


def write_log(out: Path, log: TrainLog) -> None:
    atomic_write_text(out / LOG_FILE, log.model_dump_json(indent=1) + "\n")


# ---------------------------------------------------------------- the drafter and its data
def _online_states(config: TrainConfig, target: Target, device: Any) -> tuple[DataSource, list[int]]:
    """--online: the target loaded beside the drafter and the prepared rows it runs on."""
    from eagle.train import online

    layer_ids = target.layer_ids(config.layer_ids)
    model = online.load_target(target.dir, device, config.trust_remote_code)
    return online.OnlineStates(config.data, model, layer_ids, config.batch_tokens), layer_ids


def _init_from_checkpoint(config: TrainConfig, target: Target, layer_ids: list[int]) -> Any:
    """The --init-from checkpoint (any layout), checked against the target, the data and the flags;
    a CheckpointError naming every problem in one line before anything trains or is written."""
    from eagle.drafter import checkpoint
    from eagle.drafter.model import checkpoint_shape

    src = Path(str(config.init_from))
    ck = checkpoint.read_drafter(src, target.num_layers)
    problems = checkpoint.target_fit_problems(ck.cfg, target.text)
    if ck.cfg.layer_ids != layer_ids:
        fix = ("train with --layer-ids" if config.online or config.hidden_states == "vllm"
               else "extract the data with --layer-ids")
        problems.append(f"the drafter reads target layers {ck.cfg.layer_ids}, the data holds {layer_ids}: "
                        f"{fix} {','.join(map(str, ck.cfg.layer_ids or []))}")
        doubt = ck.convention_doubt(target.num_layers)
        if doubt is not None:
            problems.append(f"its ids look like SGLang's output-of-layer convention ({doubt}): if they are, "
                            f"`eagle import-drafter {src} --out DIR --layer-convention output` writes them as "
                            f"{[i + 1 for i in ck.stored_ids or []]}; fine-tune that copy")
    if ck.cfg.aux_hidden_size != ck.cfg.hidden_size:
        problems.append(f"target_hidden_size {ck.cfg.aux_hidden_size} differs from the drafter's hidden size "
                        f"{ck.cfg.hidden_size}: speculators cannot train such a drafter (vLLM serves it as it is)")
    have_shape = checkpoint_shape(ck)
    for name in config.draft_shape.set_fields():  # the drafter's own layer shape is kept
        if getattr(config.draft_shape, name) != getattr(have_shape, name):
            problems.append(f"{name}: drafter has {getattr(have_shape, name)}, --draft-* asks for "
                            f"{getattr(config.draft_shape, name)}; a fine-tune keeps the drafter's layer shape: drop it")
    have = ck.cfg.flags()
    for flag in TRAIN_NORM_FLAGS:
        asked = getattr(config, flag)
        if asked is not None and asked != have[flag]:
            problems.append(f"--{'' if asked else 'no-'}{flag.replace('_', '-')}: the drafter was trained with "
                            f"{flag}={str(have[flag]).lower()}, and a fine-tune keeps its norms; drop the flag")
    if problems:
        raise checkpoint.CheckpointError(f"--init-from {src}: " + "; ".join(problems))
    return ck


def _vocab_change(ck: Any, d2t: Any) -> str:
    """How the data's draft vocabulary relates to the drafter's (for the log)."""
    new_ids = set((torch.arange(d2t.shape[0]) + d2t.long()).tolist())
    old_ids = set(ck.draft_token_ids())
    if old_ids == new_ids:
        return f"draft vocabulary: the drafter's own ({len(new_ids)} tokens)"
    return (f"draft vocabulary: changed to the data's ({len(new_ids)} tokens, {len(new_ids - old_ids)} not in the "
            f"drafter's {len(old_ids)}); the trainable layers carry over")


# ---------------------------------------------------------------- the run
@dataclass
class _Tally:
    """One epoch's running sums (the loss a device tensor: reading it would wait for the GPU)."""
    t0: float
    done: int = 0  # packs of the epoch run so far (a resumed epoch starts past the ones before its state)
    tokens: int = 0  # real tokens, padding not counted
    loss_sum: Any = 0.0
    side_s: float = 0.0  # mid-epoch validations and saves: not training time
    target_s: float = 0.0  # --online: the target's forwards
    wait: float = 0.0  # waiting for the next batch
    group: Any = None  # step_scalars summed over this optimizer step's batches so far
    in_group: int = 0


class Trainer:
    """`eagle train`'s run. run() is setup -> resume -> ready, then epoch -> save per epoch (each
    epoch validates at its end and every --val-every steps). `hooks` hear about every step
    (eagle/train/hooks.py; default: the observer of hooks.observing, else none)."""

    def __init__(self, config: TrainConfig, hooks: StepHooks | None = None, echo: bool = True) -> None:
        check_config(config)
        self.config = config
        self.hooks = hooks if hooks is not None else current()
        self.echo = echo

    def run(self) -> TrainLog:
        try:
            self.setup()
            self.resume()
            self.ready()
            for epoch in range(self.start_epoch, self.config.epochs + 1):
                self.save(self.epoch(epoch))
            distributed.leave()  # every rank is done (the last epoch ends on a barrier)
        finally:  # whatever was opened: --hidden-states vllm's own server stops here
            if hasattr(self, "tb"):
                self.tb.close()
            if hasattr(self, "data"):
                self.data.close()
        return self.log

    def say(self, msg: str) -> None:
        """A progress line on stderr (rank 0, with echo)."""
        if self.echo and self.dist.main:
            print(msg, file=sys.stderr, flush=True)

    # ------------------------------------------------------------ setup
    def setup(self) -> None:
        """The process group, the target, the settings resolved, the data, the drafter and its
        optimizer: every check made before anything trains or is written."""
        self.dist, self.device = distributed.init(self.config.device)
        self.config = self.config.model_copy(update={"world_size": self.dist.world})
        target = open_target(Path(self.config.model), self.config.trust_remote_code)
        target.draft_layer_config(self.config.draft_shape)  # a bad shape fails here, before any work
        self.config = resolve_config(self.config, target.hidden_size, self.device)
        layer_ids, d2t, t2d = self._open_data(target)
        self._build_drafter(target, layer_ids, d2t, t2d)
        self._plan_and_optimizer()
        self.log = TrainLog(args=self.config)

    def _open_data(self, target: Target) -> tuple[list[int], Any, Any]:
        """self.data (files, or the target run online) and its layer ids and vocabulary, checked
        against the target: (layer_ids, d2t, t2d)."""
        cfg, data_dir = self.config, Path(self.config.data)
        if cfg.online:  # cheap checks first (layer ids, dataset, vocabulary), then the target's load
            from eagle.data.hidden_io import open_prepared

            target.layer_ids(cfg.layer_ids)
            open_prepared(data_dir)
            d2t, t2d = dataset.read_vocab(data_dir)
            self.data, layer_ids = _online_states(cfg, target, self.device)
            self.config = cfg = cfg.model_copy(update={"layer_ids": layer_ids})
        elif cfg.hidden_states == "vllm":  # the same cheap checks, then the server (eagle's own, or --server's)
            from eagle.data.hidden_io import open_prepared
            from eagle.train.server_fed import open_server_states

            layer_ids = target.layer_ids(cfg.layer_ids)
            rows = open_prepared(data_dir).with_format(None)["input_ids"]
            lengths = [len(r) for r in rows]
            dataset.check_lengths(lengths, list(range(len(lengths))), cfg.batch_tokens, f"--data {data_dir}")
            d2t, t2d = dataset.read_vocab(data_dir)
            self.data = open_server_states(cfg, target, layer_ids, self.say)
            self.config = cfg = cfg.model_copy(update={"layer_ids": layer_ids})
        elif cfg.layer_ids is not None:
            raise EagleError("--layer-ids goes with --online or --hidden-states vllm; offline hidden states carry their layers in "
                             f"{data_dir}/eagle_data.json (choose them in `eagle extract --layer-ids`)")
        else:
            self.data = dataset.HiddenStates(data_dir, cfg.batch_tokens, partial=cfg.partial_data)
            layer_ids = dataset.read_layer_ids(data_dir)
            d2t, t2d = dataset.read_vocab(data_dir)
            target.layer_ids(layer_ids, where=f"layer ids of {data_dir}/eagle_data.json")
        data = self.data
        dataset.check_lengths(data.lengths, data.rows, cfg.batch_tokens, f"--data {data_dir}")
        problems = []
        if len(layer_ids) != data.num_aux:
            problems.append(f"layer ids {layer_ids} name {len(layer_ids)} aux layers but the hidden states hold {data.num_aux}")
        if data.hidden_size != target.hidden_size:
            problems.append(f"hidden states have size {data.hidden_size}, the target's hidden_size is {target.hidden_size}")
        if t2d.shape[0] != target.vocab_size:
            problems.append(f"vocab.safetensors t2d covers {t2d.shape[0]} tokens, the target's vocab_size is {target.vocab_size}")
        if problems:
            raise EagleError(f"--data {data_dir} does not fit --model {Path(cfg.model)}: " + "; ".join(problems))
        return layer_ids, d2t, t2d

    def _build_drafter(self, target: Target, layer_ids: list[int], d2t: Any, t2d: Any) -> None:
        """self.model: a new drafter, or the --init-from one, on the device with per-document attention."""
        from eagle.drafter import model as drafter

        cfg, model_dir = self.config, Path(self.config.model)
        torch.manual_seed(cfg.seed)
        if cfg.init_from:
            ck = _init_from_checkpoint(cfg, target, layer_ids)
            model = drafter.init_from(ck, model_dir, layer_ids=layer_ids, d2t=d2t, t2d=t2d, ttt_steps=cfg.ttt_steps,
                                      trust_remote_code=cfg.trust_remote_code, freeze_lm_head=cfg.freeze_lm_head)
            head = "frozen (--freeze-lm-head)" if cfg.freeze_lm_head else "trained"
            self.say(f"fine-tuning {cfg.init_from} ({ck.layout} layout); {_vocab_change(ck, d2t)}; embedding from "
                     f"{model_dir}; lm_head: the drafter's rows (the target's for tokens new to it), {head}")
        else:
            flags: dict[str, Any] = {flag: bool(getattr(cfg, flag)) for flag in TRAIN_NORM_FLAGS}
            model = drafter.build_drafter(model_dir, layer_ids=layer_ids, d2t=d2t, t2d=t2d, ttt_steps=cfg.ttt_steps,
                                          shape=cfg.draft_shape, trust_remote_code=cfg.trust_remote_code, **flags)
        # The checkpoint records the target it was trained for (the writer makes a local path absolute).
        model.config.speculators_config.verifier.name_or_path = str(model_dir)
        model.config.speculators_config.proposal_methods[0].speculative_tokens = cfg.ttt_steps  # type: ignore[attr-defined]  # speculators types the list as the base config; ours is greedy
        drafter.check_savable(model, Path(cfg.out))  # a config the writer refuses fails now, not at save
        model.to(self.device)  # type: ignore[arg-type]  # transformers' decorated .to() has a wrong signature
        use_doc_attention(model)
        compile_settings()
        self.model = model

    def _plan_and_optimizer(self) -> None:
        """The train / validation split, the steps an epoch takes, AdamW and its schedule."""
        cfg, data = self.config, self.data
        self.train_idx, self.val_idx = dataset.split_indices(len(data), cfg.val_fraction, cfg.seed)
        if not self.train_idx:
            raise EagleError(f"{Path(cfg.data)}: no training samples left after the validation split")
        batches_per_epoch = len(epoch_batches(self.train_idx, data.lengths, cfg, self.dist, 0))
        if batches_per_epoch == 0:
            raise EagleError(f"{len(self.train_idx)} training samples make fewer batches than the {self.dist.world} "
                             "processes; lower --batch-tokens or use fewer processes")
        self.steps_per_epoch = -(-batches_per_epoch // cfg.grad_accum)  # optimizer steps
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        assert cfg.lr is not None  # resolved before training (default_lr)
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._schedule())

    def _schedule(self) -> Any:
        return lr_lambda(self.total_steps, int(self.total_steps * self.config.warmup_fraction))

    # ------------------------------------------------------------ resume
    def resume(self) -> None:
        """--resume: weights, optimizer, schedule, random state and log of the last epoch state (the
        losses of a run never stopped). Without it an earlier run's states are cleared."""
        cfg, out = self.config, Path(self.config.out)
        self.start_epoch = 1
        found = epoch_dirs(out)
        if cfg.resume and found:
            last, where = found[-1]
            payload = read_epoch_state(where)
            saved = TrainLog.model_validate(payload["log"])
            check_resume(saved.args, cfg, where)
            self.model.load_state_dict(payload["model"], strict=False)
            self.opt.load_state_dict(payload["optimizer"])
            self.sched.load_state_dict(payload["scheduler"])
            if saved.args.epochs != cfg.epochs:
                self.sched.lr_lambdas[0] = self._schedule()
                warn(f"--epochs changed from {saved.args.epochs} to {cfg.epochs}: the learning-rate schedule is stretched")
            set_rng_states(payload["rng"])
            self.log = saved.model_copy(update={"args": cfg})
            self.start_epoch = last + 1
            self.say(f"resuming from {where} (epoch {last} done)")
        elif cfg.resume and not (out / "checkpoints" / STEP_STATE).exists():
            warn(f"--resume: no epoch or step states under {out}/checkpoints; starting from scratch")
        elif found and self.dist.main:
            warn(f"{out}/checkpoints holds states of an earlier run; starting again (use --resume to continue it)")
            shutil.rmtree(out / "checkpoints")
        distributed.barrier(self.dist)
        self.opt_step = (self.start_epoch - 1) * self.steps_per_epoch
        self.mid_epoch: dict[str, Any] | None = None
        if cfg.resume:
            self._resume_mid_epoch(out)

    def _resume_mid_epoch(self, out: Path) -> None:
        """--resume where a step state (--save-every-steps) is newer than the last epoch state: its
        weights, optimizer, schedule, random states and log, and its epoch's pack order, position
        and running sums (self.mid_epoch, which `epoch` takes up)."""
        path = out / "checkpoints" / STEP_STATE
        if not path.exists():
            return
        payload = read_state(path, path, "from the last epoch state", also=("position",))
        pos = payload["position"]
        if pos["epoch"] < self.start_epoch:  # an epoch state at or past it was written since
            return
        saved = TrainLog.model_validate(payload["log"])
        check_resume(saved.args, self.config, path)
        if saved.args.epochs != self.config.epochs:
            raise EagleError(f"--resume from {path} (mid-epoch {pos['epoch']}): --epochs changed from "
                             f"{saved.args.epochs} to {self.config.epochs}; pass --epochs {saved.args.epochs}, or "
                             f"delete {path} to resume from the last epoch state")
        self.model.load_state_dict(payload["model"], strict=False)
        self.opt.load_state_dict(payload["optimizer"])
        self.sched.load_state_dict(payload["scheduler"])
        set_rng_states(payload["rng"])
        self.log = saved.model_copy(update={"args": self.config})
        self.start_epoch, self.opt_step = pos["epoch"], pos["opt_step"]
        self.mid_epoch = pos
        self.say(f"resuming from {path} (epoch {pos['epoch']}, {pos['done']} of {len(pos['batches'])} packs done, "
                 f"optimizer step {pos['opt_step']})")

    # ------------------------------------------------------------ ready
    def ready(self) -> None:
        """The step as this run takes it (loss, autocast, CUDA graphs), the warm-up (--warm-shapes),
        the step log and, under torchrun, the DDP wrapper."""
        from eagle.drafter import model as drafter
        from eagle.train.step_graph import set_capturable
        from eagle.train.step_log import StepLog

        cfg, dist = self.config, self.dist
        self.losses = drafter.loss_config()
        drafter.use_sync_free_metrics()
        set_capturable(self.opt, bool(cfg.cuda_graphs))  # a resumed state may come from a run with the other setting
        self.autocast = step_autocast(self.device, cache=not cfg.cuda_graphs)
        self.graphed = graphed_train_step(self.model, self.opt, self.params, cfg.ttt_steps, self.losses,
                                          self.autocast, cfg.loss_decay) if cfg.cuda_graphs else None
        self.hdt = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.pad_to = cfg.batch_tokens if cfg.shape_buckets else None
        accum = cfg.grad_accum
        self.say(f"training {sum(p.numel() for p in self.params):,} parameters on {self.device} x{dist.world}: "
                 f"{len(self.train_idx)} train / {len(self.val_idx)} val samples, {self.steps_per_epoch} steps/epoch"
                 f"{f' of {accum} batches' if accum > 1 else ''}, epochs {self.start_epoch}..{cfg.epochs}, "
                 f"lr {cfg.lr:.3g}, global batch {global_batch_text(cfg.batch_tokens, accum, dist.world)}"
                 f"{f', shape buckets (packs of {self.pad_to}, widths x{cfg.layout_multiple})' if cfg.shape_buckets else ''}")
        if cfg.warm_shapes:
            warm = self.log.warmup = self.warm_up()
            self.data.take_target_seconds()  # --online: the warm-up's target forwards are not training time
            self.say(f"warm-up: {warm.train_shapes} training and {warm.val_shapes} validation pack shapes run once "
                     f"before step 1 in {warm.seconds:.1f} s{' (their compilation)' if self.device.type == 'cuda' else ''}"
                     + (f"; {warm.cuda_graphs} captured as CUDA graphs" if self.graphed is not None else ""))
        self.tb = StepLog(Path(cfg.out) / "tensorboard" if (cfg.tensorboard and dist.main) else None, cfg.ttt_steps,
                          cfg.loss_decay, series=dist.main)
        self.ddp_model = self._wrap_ddp()

    def make(self, idx: list[int]) -> dict[str, Any]:
        """The batch of these samples as training and validation take it (same shapes: no recompiles)."""
        assert self.config.layout_multiple is not None  # resolved before training, with the shape buckets
        return self.data.batch(idx, self.device, self.hdt, layout=True, layout_multiple=self.config.layout_multiple,
                               pad_to=self.pad_to)

    def warm_up(self) -> Warmup:
        """Run one pack of each attention-grid shape before step 1 (--warm-shapes): forward and backward
        in training mode for the training packs of the epochs still to run (with CUDA graphs: their
        capture, which runs the forward and backward once and records the step without running it),
        forward without gradients for validation's.

        With shape buckets every pack has --batch-tokens tokens and only its grid [documents, width]
        varies, so on CUDA this is where the step is compiled for every shape the run will meet (all its
        epochs' packs are known from the seed); a shape first met in a later epoch otherwise compiles
        mid-training (an 8-epoch H200 run lost 21 s in epoch 4, docs/benchmarks.md). Gradients are
        cleared and the random state restored: weights, optimizer and data order are untouched, so the
        losses are those of a run without it."""
        cfg, model, lengths = self.config, self.model, self.data.lengths
        t0 = time.perf_counter()
        train_packs = [b for e in range(self.start_epoch, cfg.epochs + 1)
                       for b in epoch_batches(self.train_idx, lengths, cfg, self.dist, e)]
        multiple = cfg.layout_multiple or 1
        train_first = dataset.first_of_each_shape(train_packs, lengths, cfg.batch_tokens, multiple)
        val_first = dataset.first_of_each_shape(val_batches(self.val_idx, lengths, cfg, self.dist), lengths,
                                                cfg.batch_tokens, multiple)
        rng = torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
        bar = progress(total=len(train_first) + len(val_first), desc="warm-up", unit="shape",
                       disable=None if self.dist.main else True)
        model.train()
        captured = 0
        for idx in train_first.values():
            batch = self.make(idx)
            self.hooks.model_input(batch)
            if self.graphed is not None:
                captured += self.graphed.capture(batch)
            else:
                backward_step(model, batch, cfg.ttt_steps, self.losses, self.autocast, cfg.loss_decay)
            for p in model.parameters():
                p.grad = None
            bar.update(1)
        model.eval()
        with torch.no_grad(), self.autocast:
            for idx in val_first.values():
                batch = self.make(idx)
                self.hooks.model_input(batch)
                forward(model, batch, cfg.ttt_steps, self.losses, cfg.loss_decay)
                bar.update(1)
        model.train()
        bar.close()
        torch.set_rng_state(rng[0])
        if rng[1] is not None:
            torch.cuda.set_rng_state_all(rng[1])
            torch.cuda.synchronize()
        return Warmup(train_shapes=len(train_first), val_shapes=len(val_first), seconds=time.perf_counter() - t0,
                      cuda_graphs=captured)

    def _wrap_ddp(self) -> Any:
        """The model the steps run: under torchrun the DistributedDataParallel wrapper (told to the hooks)."""
        if self.dist.world == 1:
            return self.model
        import torch._dynamo
        from torch.nn.parallel import DistributedDataParallel

        # dynamo's DDP optimizer splits every compiled graph at gradient-bucket boundaries so that the
        # all-reduce of early buckets overlaps the rest of the backward. The drafter gains nothing from
        # it: every trainable weight is used by every draft step (fc by step 0, whose backward runs
        # last), so all gradients are ready only at the end of the backward. Splitting would only add
        # graphs to compile and kernel launches to a step that is launch-bound already.
        torch._dynamo.config.optimize_ddp = False
        ddp = DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                                      broadcast_buffers=False)
        self.hooks.ddp(ddp)
        return ddp

    # ------------------------------------------------------------ epoch
    def epoch(self, epoch: int) -> EpochRecord:
        """One epoch's packs through the step (validations and saves every --val-every / --save-every
        optimizer steps between them), then its validation: the epoch's record."""
        cfg, dist = self.config, self.dist
        batches = epoch_batches(self.train_idx, self.data.lengths, cfg, dist, epoch)
        self.model.train()
        tally = _Tally(t0=time.perf_counter())
        mid, self.mid_epoch = self.mid_epoch, None
        if mid is not None and mid["epoch"] == epoch:  # a step state's epoch: its order, from its position on
            batches = [list(b) for b in mid["batches"]]
            tally.done, tally.tokens, tally.loss_sum = mid["done"], mid["tokens"], mid["loss_sum"]
            tally.t0 -= mid["seconds"]
        bar = progress(total=len(batches), desc=f"epoch {epoch}/{cfg.epochs}", unit="batch",
                       disable=None if dist.main else True)
        bar.update(tally.done)
        todo = batches[tally.done:]
        stream = (dataset.prefetched(self.make, todo, dataset.loader_workers(self.device))
                  if self.data.prefetch else map(self.make, todo))
        w0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        self.epoch_now = (epoch, batches)
        for step, batch in enumerate(stream, start=tally.done):
            tally.wait += time.perf_counter() - w0
            self._batch(step, batch, batches, tally)
            rate = tally.tokens * dist.world / max(time.perf_counter() - tally.t0 - tally.side_s, 1e-9)
            bar.update(1)
            if step % 25 == 24 or step == len(batches) - 1:  # reading the loss waits for the GPU
                bar.set_postfix(loss=f"{float(tally.loss_sum) / (step + 1):.4f}", tok_s=f"{rate:,.0f}")
            w0 = time.perf_counter()
        bar.close()
        return self._close_epoch(epoch, batches, tally)

    def _batch(self, step: int, batch: dict[str, Any], batches: list[list[int]], tally: _Tally) -> None:
        """One pack: forward + backward (the whole step with CUDA graphs); the optimizer step after
        the last pack of its --grad-accum group."""
        cfg, k = self.config, self.config.ttt_steps
        accum = cfg.grad_accum
        group_size = min(accum, len(batches) - (step // accum) * accum)
        last = step % accum == group_size - 1
        self.hooks.model_input(batch)
        if self.graphed is not None:  # the whole step, clip and AdamW included (one batch per step)
            self.hooks.before_backward(batch)
            scalars = self.graphed(batch)
            self.hooks.after_backward(batch)
            loss = scalars[0]
        else:
            sync = contextlib.nullcontext() if last or self.dist.world == 1 else self.ddp_model.no_sync()
            with sync:
                self.hooks.before_backward(batch)
                loss, metrics = backward_step(self.ddp_model, batch, k, self.losses, self.autocast, cfg.loss_decay,
                                              1.0 / group_size)
                self.hooks.after_backward(batch)
            scalars = step_scalars(loss, metrics, k)
        tally.group, tally.in_group = (scalars if tally.group is None else tally.group + scalars), tally.in_group + 1
        tally.loss_sum += loss  # a device tensor: no host sync per step
        tally.tokens += self.data.tokens(batches[step])  # real tokens, padding not counted
        tally.done = step + 1
        if last:
            self._optimizer_step(tally)

    def _optimizer_step(self, tally: _Tally) -> None:
        """Clip, AdamW, schedule (with CUDA graphs the schedule only), the step log; then a validation
        or a servable checkpoint when one is due."""
        cfg = self.config
        lr_now = float(self.sched.get_last_lr()[0])
        self.hooks.before_optimizer()
        if self.graphed is None:
            steps.optimizer_step(self.opt, self.sched, self.params)  # through the module: tests count its calls
        else:
            self.sched.step()
        self.hooks.after_optimizer()
        self.opt_step += 1
        self.tb.step(self.opt_step, tally.group, tally.in_group, lr_now)
        tally.group, tally.in_group = None, 0
        validate = bool(cfg.val_every) and self.opt_step % cfg.val_every == 0
        save = bool(cfg.save_every) and self.opt_step % cfg.save_every == 0
        if validate or save:
            self._between_steps(tally, validate, save)
        if cfg.save_every_steps and self.opt_step % cfg.save_every_steps == 0 and tally.done < len(self.epoch_now[1]):
            self._save_step_state(tally)  # (at an epoch's end its epoch state follows)

    def _save_step_state(self, tally: _Tally) -> None:
        """OUT/checkpoints/step-state.pt on rank 0 (--save-every-steps): what `_resume_mid_epoch`
        needs to go on from this optimizer step exactly; the step log's pending steps are written
        first, so a curve read after a kill holds every step up to the state."""
        from eagle.drafter import model as drafter

        v0 = time.perf_counter()
        self.tb.flush()
        if self.dist.main:
            epoch, batches = self.epoch_now
            position = {"epoch": epoch, "done": tally.done, "opt_step": self.opt_step, "batches": batches,
                        "tokens": tally.tokens, "loss_sum": float(tally.loss_sum),
                        "seconds": time.perf_counter() - tally.t0 - tally.side_s}
            save_step_state(Path(self.config.out), {
                "model": drafter.trainable_state(self.model), "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(), "rng": rng_states(), "log": self.log.model_dump(),
                "position": position})
        distributed.barrier(self.dist)
        tally.side_s += time.perf_counter() - v0

    def _between_steps(self, tally: _Tally, validate: bool, save: bool) -> None:
        """A validation (--val-every) and/or a servable checkpoint OUT/checkpoints/step-N (--save-every)
        mid-epoch; their time is not training time."""
        from eagle.drafter import model as drafter

        v0 = time.perf_counter()
        tally.target_s += self.data.take_target_seconds()
        if validate:
            val_loss, val_acc = self.validate()
            acc = " ".join(f"{a:.3f}" for a in val_acc)
            self.say(f"step {self.opt_step}: val_loss {val_loss if val_loss is not None else float('nan'):.4f}  "
                     f"val_acc [{acc}]")
            self.model.train()
        if save and self.dist.main:
            drafter.save(self.model, Path(self.config.out) / "checkpoints" / f"step-{self.opt_step}",
                         keep_float32=self.config.keep_float32)
        self.data.take_target_seconds()  # validation's forwards are not training time
        distributed.barrier(self.dist)
        tally.side_s += time.perf_counter() - v0

    def _close_epoch(self, epoch: int, batches: list[list[int]], tally: _Tally) -> EpochRecord:
        """The epoch's sums over all processes and its validation, as its record."""
        dist, device = self.dist, self.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - tally.t0 - tally.side_s
        tally.target_s += self.data.take_target_seconds()
        n_batches, loss_total, tok_total = distributed.all_sum([len(batches), float(tally.loss_sum), tally.tokens],
                                                               dist, device)
        val_loss, val_acc = self.validate()
        self.data.take_target_seconds()  # validation's forwards are not training time
        return EpochRecord(
            epoch=epoch, train_loss=loss_total / max(n_batches, 1), val_loss=val_loss, val_acc=val_acc,
            val_accept_len=val_accept_len(val_acc) if val_acc else None,
            train_tok_s=tok_total / max(seconds, 1e-9), step_ms=1000 * seconds / max(len(batches), 1),
            steps=int(n_batches), seconds=seconds, data_wait_s=tally.wait,
            target_s=tally.target_s if self.data.runs_target else None)

    # ------------------------------------------------------------ validate
    def validate(self) -> tuple[float | None, list[float]]:
        """(mean val loss per batch, per-step conditional accuracies), summed over all processes and
        logged at the current optimizer step; (None, []) without validation samples."""
        val_loss, val_acc = self._evaluate()
        if val_loss is not None:
            self.tb.scalars({"val/loss": val_loss, "val/accept_len": val_accept_len(val_acc),
                             **{f"val/acc_step{i}": a for i, a in enumerate(val_acc)}}, self.opt_step)
        return val_loss, val_acc

    def _evaluate(self) -> tuple[float | None, list[float]]:
        if not self.val_idx:
            return None, []
        cfg, model = self.config, self.model
        k = cfg.ttt_steps
        sums = [0.0] * (2 + 2 * k)  # batches, loss, correct_0..k-1, total_0..k-1
        model.eval()
        with torch.no_grad(), self.autocast:
            for idx in val_batches(self.val_idx, self.data.lengths, cfg, self.dist):
                batch = self.make(idx)
                self.hooks.model_input(batch)
                loss, metrics = forward(model, batch, k, self.losses, cfg.loss_decay)
                sums[0] += 1
                sums[1] += float(loss)
                for s in range(k):
                    sums[2 + s] += float(metrics[f"full_acc_{s}_sum"])
                    sums[2 + k + s] += float(metrics[f"full_acc_{s}_total"])
        model.train()
        sums = distributed.all_sum(sums, self.dist, self.device)
        if sums[0] == 0:
            return None, []
        return sums[1] / sums[0], step_accuracies(sums[2:2 + k], sums[2 + k:])

    # ------------------------------------------------------------ save
    def save(self, record: EpochRecord) -> None:
        """An epoch done: into the log and TensorBoard; on rank 0 the servable checkpoint OUT/ when it is
        the best so far, the epoch state (for --resume), train_log.json and the epoch's line."""
        from eagle.drafter import model as drafter

        log, out = self.log, Path(self.config.out)
        log.epochs.append(record)
        self.tb.scalars({"speed/train_tok_s": record.train_tok_s}, self.opt_step)
        prev = next((r for r in log.epochs if r.epoch == log.best_epoch), None)
        best = prev is None or record.score() < prev.score()
        if best:
            log.best_epoch = record.epoch
        if self.dist.main:
            out.mkdir(parents=True, exist_ok=True)
            if best:
                drafter.save(self.model, out, keep_float32=self.config.keep_float32)
            save_epoch_state(out, record.epoch, {
                "model": drafter.trainable_state(self.model), "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(), "rng": rng_states(), "log": log.model_dump()})
            write_log(out, log)
            self.say(_epoch_line(record, best))
        distributed.barrier(self.dist)


def _epoch_line(record: EpochRecord, best: bool) -> str:
    seconds = max(record.seconds, 1e-9)
    acc = " ".join(f"{a:.3f}" for a in record.val_acc)
    return (f"epoch {record.epoch}: train_loss {record.train_loss:.4f}  val_loss "
            f"{record.val_loss if record.val_loss is not None else float('nan'):.4f}  val_acc [{acc}]  "
            f"val_accept_len {record.val_accept_len or float('nan'):.2f}  {record.train_tok_s:,.0f} tok/s  "
            f"{record.step_ms:.0f} ms/batch  (data wait {record.data_wait_s / seconds:.0%}"
            + (f", target {record.target_s / seconds:.0%}" if record.target_s is not None else "")
            + f"){'  *best' if best else ''}")
