"""`eagle train`: the click command. It builds one TrainConfig from the options and hands it to
eagle/train/trainer.py's Trainer; the training itself (and torch) is imported only when it runs."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click

from eagle import distributed
from eagle.commands._options import device_option, finish, json_option, refusals, trust_remote_code_option
from eagle.common import fail, print_table, split_layer_ids
from eagle.target import DraftShape, merge_shape, read_draft_shape
from eagle.train.config import BUCKET_MULTIPLE, MAX_TTT_STEPS, TrainConfig, out_of_memory, summary_metrics


@click.command("train", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "model", required=True, type=click.Path(path_type=Path),
              help="Target model directory (transformers; its embeddings, lm_head and final norm are read "
                   "from its safetensors, the rest of it is never loaded).")
@click.option("--data", required=True, type=click.Path(path_type=Path),
              help="Data directory from `eagle prepare` + `eagle extract` + `eagle vocab` "
                   "(with --online: `eagle prepare` + `eagle vocab --model`, no extraction).")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Output: the servable checkpoint of the best epoch, plus checkpoints/epoch-N/ states.")
@click.option("--epochs", default=TrainConfig.model_fields["epochs"].default, show_default=True, type=int)
@click.option("--lr", default=None, type=float,
              help="Peak AdamW learning rate (linear warm-up over 5% of steps, cosine decay to 10%) "
                   "[default: 1e-4 x 4096 / the target's hidden size, at most 3e-3: 1e-4 for 8B-class "
                   "targets, 5e-5 at hidden 8192; see docs/eagle.md].")
@click.option("--ttt-steps", default=3, show_default=True, type=int,
              help=f"Draft steps trained (test-time training depth, 1..{MAX_TTT_STEPS}); also the "
                   "checkpoint's speculative_tokens.")
@click.option("--loss-decay", default=TrainConfig.model_fields["loss_decay"].default, show_default=True, type=float,
              help="Draft step i's loss weighs DECAY**i (EAGLE-3's recipe: 0.8; 1.0 weighs all steps alike).")
@click.option("--batch-tokens", default=TrainConfig.model_fields["batch_tokens"].default, show_default=True, type=int,
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
@click.option("--save-every-steps", default=0, show_default=True, type=int,
              help="Optimizer steps between resumable states OUT/checkpoints/step-state.pt (weights, AdamW, "
                   "schedule, the epoch's pack order and position, random states; written to a temp file and "
                   "renamed): a run killed mid-epoch resumes there with --resume; 0: at epoch ends only.")
@click.option("--resume", is_flag=True,
              help="Continue from the latest state: OUT/checkpoints/epoch-N or, when newer, the step state of "
                   "--save-every-steps (exactly: the same per-step losses as a run never stopped).")
@click.option("--init-from", type=click.Path(path_type=Path), default=None,
              help="Fine-tune this drafter (any published EAGLE-3 layout: speculators / vLLM, EAGLE / SpecForge) "
                   "instead of starting from scratch. Its trainable layers become float32 masters and keep their "
                   "shape; the embedding comes from --model. Its lm_head is kept and trained, as SpecForge "
                   "trains it (the target's row for a token new to DATA's draft vocabulary); --freeze-lm-head "
                   "keeps it fixed.")
@click.option("--freeze-lm-head", is_flag=True,
              help="With --init-from: do not train the drafter's lm_head (speculators and a new eagle drafter keep "
                   "the target's rows fixed; SpecForge trains its draft lm_head, so published SpecForge drafters "
                   "carry a trained one) [default: trained].")
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
@click.option("--hidden-states", "hidden_states", type=click.Choice(["files", "vllm"]), default="files",
              show_default=True,
              help="Where the target's hidden states come from. files: `eagle extract`'s, in DATA. vllm: fetched "
                   "per batch from a vLLM extraction server (the target lives in vLLM, on its own GPUs; nothing "
                   "is stored beyond --in-flight samples, each file deleted once read); eagle starts and stops "
                   "that server unless --server names one. DATA then needs only `eagle prepare` + `eagle vocab`.")
@click.option("--server", default=None, metavar="URL",
              help="With --hidden-states vllm: a running extraction server (e.g. http://gpu-node:8000; its `vllm serve` "
                   "line is in docs/eagle.md, Training, --hidden-states vllm) instead of eagle's own.")
@click.option("--server-storage", type=click.Path(path_type=Path), default=None,
              help="With --hidden-states vllm and eagle's own server: the folder its connector writes state files "
                   "to [default: a temp folder, removed afterwards].")
@click.option("--in-flight", default=TrainConfig.model_fields["in_flight"].default, show_default=True,
              type=int, help="With --hidden-states vllm: samples requested and not yet read; the storage folder "
                             "never holds more files than this.")
@click.option("--vllm-arg", "vllm_args", multiple=True, metavar="KEY[=VALUE]",
              help="With --hidden-states vllm and eagle's own server: any vLLM engine flag, repeatable "
                   "(tensor-parallel-size=2, gpu-memory-utilization=0.5, ...).")
@click.option("--partial-data", is_flag=True,
              help="Train on the samples that have hidden states when DATA's extraction did not finish (a killed "
                   "`eagle extract`, deleted files), saying which rows are left out. Without it such a DATA is "
                   "refused with the missing rows named.")
@click.option("--layer-ids", default=None, metavar="A,B,C",
              help="With --online or --hidden-states vllm: the target's aux layers, ascending [default: 2,N//2,N-3, as eagle extract].")
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
            save_every_steps: int, tensorboard: bool, resume: bool, init_from: Path | None, freeze_lm_head: bool,
            norm_before_residual: bool | None,
            norm_before_fc: bool | None, norm_output: bool | None, keep_float32: bool, online: bool,
            hidden_states: str, server: str | None, server_storage: Path | None, in_flight: int, vllm_args: tuple[str, ...],
            partial_data: bool, layer_ids: str | None,
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
      eagle train --model work/target --data work/data --out work/draft --hidden-states vllm  # states from vLLM
    \b
    Writes OUT/config.json + OUT/model.safetensors (vLLM loads OUT as the drafter; bf16 without the
    frozen embedding, verifier.name_or_path absolute), and the metrics train_loss, val_loss,
    val_acc_0..k-1, val_accept_len, train_tok_s to $RUNBOOK_METRICS.
    The drafter is one Llama decoder layer for every target (Llama, Qwen3, DeepSeek-V3 / Kimi, ...);
    its shape is the target's unless --draft-config / --draft-* set it.
    Exit codes: 0 trained, 1 bad data or environment (out of device memory too: the message names
    the --batch-tokens / --grad-accum that keep the global batch in smaller steps), 2 bad arguments (a drafter shape whose heads do
    not divide, a target without a text model, a layer id out of range, an --init-from drafter that
    cannot be read or does not fit); the message names the file and the fix, and nothing is written.
    """
    with refusals():
        shape = read_draft_shape(draft_config) if draft_config is not None else DraftShape()
        shape = merge_shape(shape, DraftShape(intermediate_size=draft_intermediate_size, num_attention_heads=draft_heads,
                                              num_key_value_heads=draft_kv_heads, head_dim=draft_head_dim))
        config = TrainConfig(model=str(model), data=str(data), out=str(out), epochs=epochs, lr=lr, ttt_steps=ttt_steps,
                         loss_decay=loss_decay, batch_tokens=batch_tokens, grad_accum=grad_accum,
                         val_fraction=val_fraction, val_every=val_every, save_every=save_every,
                         save_every_steps=save_every_steps,
                         tensorboard=tensorboard, seed=seed, init_from=str(init_from) if init_from else None,
                         freeze_lm_head=freeze_lm_head,
                         device=device, resume=resume, online=online, hidden_states=hidden_states, server=server,
                         server_storage=None if server_storage is None else str(server_storage), in_flight=in_flight,
                         vllm_args=list(vllm_args),
                         layer_ids=None if layer_ids is None else split_layer_ids(layer_ids),
                         shape_buckets=shape_buckets, layout_multiple=layout_multiple, warm_shapes=warm_shapes,
                         cuda_graphs=cuda_graphs, draft_shape=shape,
                         trust_remote_code=trust_remote_code, norm_before_residual=norm_before_residual,
                         norm_before_fc=norm_before_fc, norm_output=norm_output, keep_float32=keep_float32,
                         partial_data=partial_data)
        import torch

        from eagle.train.trainer import train

        try:
            log = train(config)
        except torch.OutOfMemoryError as exc:
            raise out_of_memory(str(exc), config) from None
    if not distributed.is_main():
        return
    metrics = summary_metrics(log)
    diverged = sorted(name for name, value in metrics.items() if not math.isfinite(value))
    if diverged:
        fail(f"training diverged: {', '.join(diverged)} not finite (see {Path(config.out) / 'train_log.json'}); "
             f"lower --lr (now {log.args.lr:g}) or check the hidden states with `eagle extract` (it validates them)")

    def show() -> None:
        print_table([(k, v) for k, v in metrics.items()], headers=["metric", "value"])
        click.echo(f"drafter (best epoch {log.best_epoch}) written to {out}")

    finish(metrics, as_json, metrics=metrics, show=show)
    sys.stdout.flush()
