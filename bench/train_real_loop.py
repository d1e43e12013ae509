"""`eagle train` on real-shaped, variable-length data against its fixed-shape step and against
speculators' own training on the SAME data, side by side in one run.

    python -m bench.train_real_loop --out $OUT        # on a GPU: 1.1B Llama shape (random bf16 weights)
    python -m bench.train_real_loop --smoke           # tiny shapes on the CPU (a check of the code)
    python -m bench.train_real_loop --workdir W ...   # keep the target and data in W (reused when there;
                                                      # bench/multi_gpu_scaling.py trains on W/data-v)

What it does (every mode in its own process with its own warm-up; the on-disk inductor cache is shared, so
a later mode may find kernels compiled: steady figures leave epoch 1 out):
  data     a random 1.1B-shape target; V = rows of 1024-2048 tokens (variable), F = rows of exactly
           2048 tokens (fixed); `eagle extract` writes both to files, `eagle vocab` a draft vocab of 8000
  real     `eagle train` on V as a user runs it (defaults: shape buckets on CUDA)     [eagle.train.trainer.train]
  nobuckets  the same with --no-shape-buckets (the loop before shape buckets)
  nowarm   the real loop with --no-warm-shapes (shapes first met in a later epoch compile there)
  dynb     nowarm with the attention grid's dimensions [documents, width] marked dynamic for dynamo
           (torch._dynamo.maybe_mark_dynamic): one graph for every grid instead of one per shape, the
           alternative to warming each shape (an experiment of this bench, not an eagle option)
  fixed    `eagle train` on F: every pack 4 x 2047 tokens, one shape (the fixed-shape step's figure)
  speculators  speculators' own training CLI (`python -m speculators.train`, its data loader, packing and
           Trainer; sdpa attention and the eager loss, as on torch 2.11) on V's files
Figures: tok/s of real (unpadded) tokens in the epochs after the first (the first carries compilation),
the first epoch's too, dynamo's graph count after each optimizer step (no recompiles after warm-up:
constant after epoch 1), MFU against the measured bf16 matmul rate. Writes OUT/train_real_loop.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import ratios, run_group, steady, write_json
from bench.shapes import (
    BATCH_TOKENS,
    LR,
    SMOKE_CLI,
    TARGET_1B,
    TTT,
    VAL_FRACTION,
    drafter_flops_per_token,
    prepare,
)

MODES = ("real", "fixed", "speculators", "nobuckets", "nowarm", "dynb")


# ---------------------------------------------------------------- children
def child_eagle(mode: str, target: str, data: str, out: str, epochs: int, batch_tokens: int, lr: float) -> dict:
    import torch
    from torch._dynamo.utils import counters

    from bench.harness import StepTimes, summarise
    from eagle.train.config import TrainConfig
    from eagle.train.trainer import train

    graphs: list[int] = []

    class Hooks(StepTimes):  # the step times, dynamo's graph count after each optimizer step, dynb's marks
        def after_optimizer(self) -> None:
            super().after_optimizer()
            graphs.append(int(counters["stats"]["unique_graphs"]))

        def model_input(self, batch: dict[str, Any]) -> None:  # training, warm-up and validation batches
            if mode == "dynb":
                for key in ("doc_index", "doc_mask"):
                    for dim in (0, 1):
                        torch._dynamo.maybe_mark_dynamic(batch[key], dim)

    times = Hooks()
    t0 = time.perf_counter()
    log = train(TrainConfig(
        model=target, data=data, out=out, epochs=epochs, batch_tokens=batch_tokens, lr=lr, val_fraction=VAL_FRACTION,
        ttt_steps=TTT, shape_buckets=False if mode == "nobuckets" else None,
        warm_shapes=False if mode in ("nobuckets", "nowarm", "dynb") else None,
        device="cuda" if torch.cuda.is_available() else "cpu"), echo=True, hooks=times)
    steps = [r.steps for r in log.epochs]
    return {"mode": mode, "epoch_tok_s": [r.train_tok_s for r in log.epochs], "steps": steps,
            "epoch_s": [r.seconds for r in log.epochs], "train_loss": [r.train_loss for r in log.epochs],
            "val_loss": [r.val_loss for r in log.epochs],
            "val_acc": log.epochs[-1].val_acc, "graphs": graphs, "graphs_after_epoch1": graphs[steps[0]:],
            "shape_buckets": log.args.shape_buckets, "layout_multiple": log.args.layout_multiple,
            "warmup": log.warmup.model_dump() if log.warmup else None,
            "step_times": summarise([times.rows()]),
            "process_s": time.perf_counter() - t0, "peak_gib": (torch.cuda.max_memory_allocated() / 2**30
                                                                 if torch.cuda.is_available() else 0.0)}


def child_speculators(target: str, data: str, out: str, batch_tokens: int, lr: float, layer_ids: list[int],
                      warmup: int) -> dict:
    """speculators' training CLI in this process (so its per-step metric records can be read)."""
    import numpy as np
    import torch

    from eagle.train import dataset

    d2t, t2d = dataset.read_vocab(Path(data))
    np.save(Path(out) / "d2t.npy", d2t.numpy())
    np.save(Path(out) / "t2d.npy", t2d.numpy())
    records: list[tuple[float, dict]] = []

    # Its Trainer logs one dict per step to this logger (with a "profile" of step_ms, tokens_per_s, ...).
    # Its CLI sets the logger's handlers up itself (a handler added here is dropped), so the logger's
    # own info() is wrapped.
    mlog = logging.getLogger("speculators.metrics")
    log_info = mlog.info

    def grab(msg: object, *args: Any, **kwargs: Any) -> None:
        if isinstance(msg, dict) and "train" in msg:
            records.append((time.perf_counter(), msg.get("profile") or {}))
        log_info(msg, *args, **kwargs)

    mlog.info = grab  # type: ignore[method-assign]
    sys.argv = ["speculators.train", "--verifier-name-or-path", target, "--data-path", data,
                "--save-path", str(Path(out) / "save"), "--d2t-path", str(Path(out) / "d2t.npy"),
                "--t2d-path", str(Path(out) / "t2d.npy"), "--target-layer-ids", *map(str, layer_ids),
                "--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--ttt-steps", str(TTT),
                "--total-seq-len", str(batch_tokens), "--epochs", "1", "--lr", str(lr), "--on-missing", "raise",
                "--train-data-ratio", str(1 - VAL_FRACTION), "--no-resume-from-checkpoint", "--mask-token-id", "0",
                "--num-workers", str(min(12, os.cpu_count() or 1)), "--checkpoint-freq", "1000000"]
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    from eagle.train.steps import compile_settings

    compile_settings()  # the same inductor workaround as eagle train (else its compile can assert alike)

    t0 = time.perf_counter()
    main(TrainConfig.resolve())
    steps = len(records)
    timed = records[warmup:]
    tokens = sum(p.get("tokens_per_s", 0) * p.get("step_ms", 0) / 1000 for _, p in timed[1:])
    seconds = timed[-1][0] - timed[0][0] if len(timed) > 1 else float("nan")
    first = records[:warmup]
    first_tokens = sum(p.get("tokens_per_s", 0) * p.get("step_ms", 0) / 1000 for _, p in records)
    return {"mode": "speculators", "steps": [steps], "warmup_steps": warmup, "steady_tok_s": tokens / seconds,
            "epoch_tok_s": [first_tokens / (records[-1][0] - t0)] if records else [],
            "median_step_ms": statistics.median(p.get("step_ms", 0) for _, p in timed) if timed else None,
            "median_fetch_ms": statistics.median(p.get("fetch_ms", 0) for _, p in timed) if timed else None,
            "warmup_s": first[-1][0] - t0 if first else None, "process_s": time.perf_counter() - t0,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0}


# ---------------------------------------------------------------- parent
def run_child(args: list[str], timeout: float, log: Path | None = None) -> dict | None:
    cmd = [sys.executable, "-m", "bench.train_real_loop", "--child", json.dumps(args)]
    t0 = time.perf_counter()
    res = run_group(cmd, {**os.environ, "PYTHONUNBUFFERED": "1"}, timeout,
                    log=None if log is None else log.with_suffix(""))
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(cmd)}\n# {time.perf_counter() - t0:.1f} s, rc {res.returncode}\n{res.stdout}\n"
                       f"--- stderr\n{res.stderr}")
    if res.returncode == 124:
        print(f"{args[0]}: TIMED OUT after {timeout:.0f} s (its process group killed)\n{res.stderr[-1500:]}",
              file=sys.stderr, flush=True)
        return None
    line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
    if res.returncode != 0 or line is None:
        print(f"{args[0]}: FAILED rc {res.returncode} after {time.perf_counter() - t0:.0f} s\n{res.stderr[-4000:]}",
              file=sys.stderr, flush=True)
        return None
    return json.loads(line[len("RESULT "):])


def matmul_rate() -> float:
    import torch

    if not torch.cuda.is_available():
        return float("nan")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    return 20 * 2 * 8192**3 / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--samples", type=int, default=None, help="variable-length rows [256; smoke 24]")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--modes", default="real,fixed,speculators", help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--workdir", type=Path, default=None, help="keep (and reuse) the target and data here")
    p.add_argument("--timeout", type=int, default=240, help="seconds per mode")
    p.add_argument("--deadline", type=float, default=None,
                   help="wall-clock time (time.time()) by which every mode must end; a mode gets at most what is "
                        "left and is skipped with under 20 s")
    p.add_argument("--prepare-fixed", action="store_true",
                   help="also prepare the fixed rows when the modes do not include fixed (a later run with "
                        "--modes fixed on the same --workdir, e.g. on another GPU, then reuses them)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        args = json.loads(a.child)
        res = child_speculators(*args[1:]) if args[0] == "speculators" else child_eagle(*args)
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    import torch

    gpu = not a.smoke and torch.cuda.is_available()
    shape = SMOKE_CLI if a.smoke else TARGET_1B
    n = a.samples or (24 if a.smoke else 256)
    seq = 48 if a.smoke else 2048
    kind = "smoke" if a.smoke else "gpu"
    batch_tokens, lr = BATCH_TOKENS[kind], LR[kind]
    out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="train-real-"))
    work.mkdir(parents=True, exist_ok=True)
    modes = a.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"unknown mode {bad[0]!r}; use {', '.join(MODES)}")
    meta: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "shape": shape,
                            "samples_variable": n, "batch_tokens": batch_tokens, "epochs": a.epochs, "ttt": TTT,
                            "lr": lr, "val_fraction": VAL_FRACTION}
    if gpu:
        meta["device"] = torch.cuda.get_device_name()
    results: dict[str, dict] = {}

    def save() -> None:
        write_json(out, "train_real_loop.json", {"meta": meta, "results": results})

    t0 = time.perf_counter()
    target, data_v, data_f, lengths_v, layer_ids = prepare(work, shape, n, seq, modes + ["fixed"] * a.prepare_fixed,
                                                           gpu, a.smoke)
    meta["prepare_s"] = time.perf_counter() - t0
    meta["tokens_variable"] = sum(lengths_v)
    meta["tokens_fixed"] = seq * max(8, n // 4) if data_f is not None else 0
    peak = matmul_rate()
    meta["matmul_flop_s"] = peak
    h = shape["hidden_size"]
    flops = {"variable": drafter_flops_per_token(h, shape["intermediate_size"], shape["num_attention_heads"],
                                                 shape["num_key_value_heads"], 64 if a.smoke else 8000, TTT,
                                                 int(statistics.mean(lengths_v))),
             "fixed": drafter_flops_per_token(h, shape["intermediate_size"], shape["num_attention_heads"],
                                              shape["num_key_value_heads"], 64 if a.smoke else 8000, TTT, seq)}
    meta["flops_per_token"] = flops
    save()
    print(f"data ready in {meta['prepare_s']:.0f} s: {n} variable rows ({meta['tokens_variable']:,} tokens), "
          f"{meta['tokens_fixed']:,} fixed tokens", file=sys.stderr, flush=True)

    for mode in modes:
        budget = float(a.timeout) if a.deadline is None else min(a.timeout, a.deadline - time.time() - 2)
        if budget < 20:
            meta.setdefault("skipped", []).append(mode)
            print(f"  {mode:<12} skipped: {budget:.0f} s left before the deadline", file=sys.stderr, flush=True)
            continue
        (work / mode).mkdir(exist_ok=True)
        if mode == "speculators":
            args = [mode, str(target), str(data_v), str(work / mode), batch_tokens, lr, layer_ids, 8 if gpu else 2]
        else:
            args = [mode, str(target), str(data_f if mode == "fixed" else data_v), str(work / mode / "draft"),
                    a.epochs, batch_tokens, lr]
        res = run_child(args, budget, work / "logs" / f"train_real_loop-{mode}.log")
        if res is None:
            meta.setdefault("failed", []).append(mode)
            save()
            continue
        res["steady_tok_s_all"] = steady(res)
        res["mfu"] = steady(res) * flops["fixed" if mode == "fixed" else "variable"] / peak if gpu else None
        results[mode] = res
        save()
        print(f"  {mode:<12} steady {res['steady_tok_s_all']:>10,.0f} tok/s   epochs {[round(x) for x in res['epoch_tok_s']]}"
              f"   graphs from step 1: {sorted(set(res.get('graphs', [])))}, after epoch 1: "
              f"{sorted(set(res.get('graphs_after_epoch1', [])))}   warm-up {(res.get('warmup') or {}).get('seconds', 0):.0f} s   "
              f"MFU {res['mfu'] or float('nan'):.1%}", file=sys.stderr, flush=True)
    meta["ratios"] = ratios(results)
    save()
    print(json.dumps(meta["ratios"]), file=sys.stderr)
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
