"""Per-step times of `eagle train`'s drafter step on packed variable-length batches, under torch.compile
settings: why the real loop runs slower than bench/gpu_throughput.py's fixed-shape step.

    python -m bench.train_step_profile              # on the H200: 1.1B Llama shape (random bf16), --online data
    python -m bench.train_step_profile --smoke      # tiny shapes on the CPU (a check of the code)

Each mode runs `eagle.train.trainer.train` in its own process (fresh torch.compile caches) with --online
hidden states (no extraction needed), timing every `train_step` with a device sync before and
after it (the target's forward is outside the timed region). Modes:
  compiled        as `eagle train` runs by default (speculators compiles the drafter's forward on CUDA;
                  shape buckets: packs padded to --batch-tokens, widths rounded up to 256)
  nobuckets       --no-shape-buckets: every pack its own length and width (the loop before buckets)
  bucket256       no padding of packs, only the per-document attention's width rounded up to 256
                  (cuDNN builds an SDPA plan per new shape)
  nocudnn         cuDNN's SDPA backend disabled (PyTorch picks another kernel; no per-shape plans)
  limit256        torch._dynamo's recompile limit raised from 8 to 256
  eager           torch._dynamo disabled: the drafter runs eagerly (no compile, no recompiles)
A step on variable-length packs was either fast or about ten times slower; a cuDNN plan build per
new shape is the suspect that bucket256 and nocudnn test (the figures:
bench/results/2026-11-29-h200/README.md). Default modes: compiled, nobuckets, bucket256 (about 8 minutes on the H200).
Prints per epoch: median / max step ms, steps over 2x the median, and real tokens per second of
the median step. Writes OUT/train_step_profile.json (OUT: --out, else $OUT) after each mode, with
every step's time, tokens and document layout [B, Lmax] (to correlate slow steps with shapes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import write_json
from bench.shapes import SMOKE_CLI, TARGET_1B, make_data, make_target

MODES = ("compiled", "nobuckets", "bucket256", "nocudnn", "limit256", "eager")
DEFAULT_MODES = ("compiled", "nobuckets", "bucket256")


def child(mode: str, target: str, data: str, out: str, epochs: int, batch_tokens: int) -> None:
    """One mode in this process; prints one JSON line with the step times."""
    import torch

    from eagle.train.config import TrainConfig
    from eagle.train.hooks import StepHooks
    from eagle.train.trainer import train

    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}; use {', '.join(MODES)}")
    if mode == "limit256":
        torch._dynamo.config.recompile_limit = 256
    elif mode == "eager":
        torch._dynamo.config.disable = True
    elif mode == "nocudnn":
        torch.backends.cuda.enable_cudnn_sdp(False)
    cuda = torch.cuda.is_available()
    times: list[tuple[int, float, int, list[int]]] = []  # (step, seconds, tokens, doc layout [B, Lmax])
    started: list[tuple[float, int, list[int]]] = []

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    class Timed(StepHooks):  # one batch per optimizer step (no --grad-accum here)
        def before_backward(self, batch: dict[str, Any]) -> None:
            sync()
            layout = list(batch["doc_index"].shape) if "doc_index" in batch else []
            tokens = int(batch["doc_mask"].sum()) if "doc_mask" in batch else int(batch["input_ids"].shape[1])
            started.append((time.perf_counter(), tokens, layout))

        def after_optimizer(self) -> None:
            sync()
            t0, tokens, layout = started.pop()
            times.append((len(times), time.perf_counter() - t0, tokens, layout))

    log = train(TrainConfig(model=target, data=data, out=out, epochs=epochs, batch_tokens=batch_tokens,
                            lr=3e-4, val_fraction=0.05, online=True, device="cuda" if cuda else "cpu",
                            shape_buckets=False if mode in ("nobuckets", "bucket256") else None,
                            layout_multiple=256 if mode == "bucket256" else None),
                echo=False, hooks=Timed())
    steps = [r.steps for r in log.epochs]
    print("RESULT " + json.dumps({"mode": mode, "steps_per_epoch": steps, "times": times,
                                  "epoch_tok_s": [r.train_tok_s for r in log.epochs],
                                  "train_loss": [r.train_loss for r in log.epochs]}), flush=True)


def summarize(res: dict[str, Any]) -> list[dict[str, Any]]:
    rows, k = [], 0
    for e, n in enumerate(res["steps_per_epoch"], start=1):
        chunk = res["times"][k:k + n]
        k += n
        secs = [t[1] for t in chunk]
        med = statistics.median(secs)
        toks = statistics.median([t[2] for t in chunk])
        rows.append({"mode": res["mode"], "epoch": e, "steps": n, "median_ms": 1000 * med, "max_ms": 1000 * max(secs),
                     "slow_steps": sum(t > 2 * med for t in secs), "median_tok_s": toks / med,
                     "epoch_tok_s": res["epoch_tok_s"][e - 1], "train_loss": res["train_loss"][e - 1],
                     "per_step": [{"ms": 1000 * t[1], "tokens": t[2], "docs_x_lmax": t[3]} for t in chunk]})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--samples", type=int, default=None, help="[128; smoke 16]")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-tokens", type=int, default=None, help="[8192; smoke 96]")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--child", nargs=6, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        mode, target, data, out, epochs, batch_tokens = a.child
        child(mode, target, data, out, int(epochs), int(batch_tokens))
        return 0

    import torch

    from eagle.data.vocab import build_vocab

    gpu = not a.smoke and torch.cuda.is_available()
    samples = a.samples or (16 if a.smoke else 128)
    batch_tokens = a.batch_tokens or (96 if a.smoke else 8192)
    shape = SMOKE_CLI if a.smoke else TARGET_1B
    out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    work = Path(tempfile.mkdtemp(prefix="step-profile-"))
    target = make_target(shape, work / "target", gpu)
    data = make_data(shape["vocab_size"], samples, 48 if a.smoke else 2048, work / "data")
    build_vocab(data=data, draft_vocab=64 if a.smoke else 8000, model=target)
    if gpu:
        torch.cuda.empty_cache()
    rows: list[dict[str, Any]] = []
    for mode in a.modes.split(","):
        cmd = [sys.executable, "-m", "bench.train_step_profile", "--child", mode, str(target), str(data), str(work / f"draft-{mode}"),
               str(a.epochs), str(batch_tokens)]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             cwd=Path(__file__).resolve().parents[1])
        line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
        if res.returncode != 0 or line is None:
            print(f"{mode}: FAILED rc {res.returncode}\n{res.stderr[-2000:]}", file=sys.stderr)
            continue
        for r in summarize(json.loads(line[len("RESULT "):])):
            r["process_s"] = time.perf_counter() - t0
            rows.append(r)
            print(f"  {r['mode']:<9} epoch {r['epoch']}: median {r['median_ms']:7.1f} ms  max {r['max_ms']:8.1f} ms  "
                  f"slow {r['slow_steps']:>2}/{r['steps']}  median-step {r['median_tok_s']:>9,.0f} tok/s  "
                  f"epoch {r['epoch_tok_s']:>9,.0f} tok/s  loss {r['train_loss']:.4f}", file=sys.stderr, flush=True)
        write_json(out, "train_step_profile.json", rows)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
