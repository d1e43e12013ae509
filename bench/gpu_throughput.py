"""GPU throughput of hidden-state extraction and drafter training (issue 8): one call, one table.

    python -m bench.gpu_throughput            # on the H200: 1.1B Llama shape, random bf16 weights
    python -m bench.gpu_throughput --smoke    # tiny shapes on the CPU (a check of the code, not a number)

Measures, in this order, and prints one table at the end (also $OUT/gpu_throughput.{json,md}):
1. ceilings: bf16 matmul TFLOP/s (8192^3, random data), device-to-device copy (bytes read + written),
   disk write with fsync (64 MiB writes, one fsync per 256 MiB file).
2. extraction on the target (2k-token sequences, 16k tokens per batch): a naive transformers forward
   with output_hidden_states (logits and all layers); eagle/data/capture.py eager and compiled,
   compute only; compiled plus device-to-host copies; compiled plus files written with fsync
   (<= --write-gib), against the disk bound (disk bytes/s / bytes per token).
3. drafter training (speculators' Eagle3DraftModel, 1 layer, draft vocab 8000, ttt 3, sdpa, eager
   kl_div loss, bf16 autocast) on the same packed batches (hidden states captured from the target,
   4 x 2047 tokens a step, the same shape every step): speculators' own Trainer (its defaults:
   log_freq 1, linear warm-up), then eagle.train.trainer's step as written with speculators' packed-mask sdpa
   and with eagle/train/doc_attention.py's per-document attention (what `eagle train` uses), batches
   prefetched on a side thread. Tokens/s after warm-up, model FLOP utilisation against the measured
   matmul rate, per-step accuracies (rate of "steps 0..k all right", as conditional per-step
   accuracy) averaged over the last 10 steps. Fixed shapes: the real loop on variable-length packs
   is slower (bench/train_step_profile.py, docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.harness import Table, bench_device, timed
from bench.shapes import SMOKE, TARGET_1B, drafter_training, random_target, target_flops_per_token

TABLE = Table("gpu_throughput")  # written to --out / $OUT after every row
ROWS, META, row, failed, save = TABLE.rows, TABLE.meta, TABLE.row, TABLE.failed, TABLE.save


# ---------------------------------------------------------------- 1. ceilings
def ceilings(dev: torch.device, smoke: bool, scratch: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    n = 512 if smoke else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    s = timed(lambda: a @ b, dev, 3 if smoke else 10, 3)
    out["matmul"] = 2 * n**3 / s
    row("bf16 matmul (8192^3, random)", out["matmul"] / 1e12, "TFLOP/s")
    nbytes = (64 << 20) if smoke else (2 << 30)
    src = torch.randn(nbytes // 2, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    s = timed(lambda: dst.copy_(src), dev, 3 if smoke else 10)
    out["copy"] = 2 * nbytes / s
    row("device copy (read + write)", out["copy"] / 1e9, "GB/s")
    chunk = torch.randint(0, 255, ((64 << 20),), dtype=torch.uint8).numpy().tobytes()
    files, per_file = (2, 1) if smoke else (12, 4)  # 12 x 256 MiB = 3 GiB
    scratch.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for f in range(files):
        with open(scratch / f"disk-{f}", "wb") as fh:
            for _ in range(per_file):
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    out["disk"] = files * per_file * len(chunk) / (time.perf_counter() - t0)
    for f in range(files):
        (scratch / f"disk-{f}").unlink()
    row("disk write + fsync (256 MiB files)", out["disk"] / 1e9, "GB/s")
    return out


# ---------------------------------------------------------------- 2. extraction


def extraction(shape: dict[str, int], dev: torch.device, dtype: torch.dtype, ceil: dict[str, float], smoke: bool,
               scratch: Path, write_gib: float, layer_ids: list[int], writers: int = 4) -> tuple[Any, Any]:
    from eagle.data import capture as hc

    seq, bsz = (64, 4) if smoke else (2048, 8)
    model = random_target(shape, dev, dtype)
    g = torch.Generator().manual_seed(1)
    n_rows = 32 if smoke else 96  # 96 x 2048 = 196k tokens for the in-memory runs
    rows = torch.randint(0, shape["vocab_size"], (n_rows, seq), generator=g).tolist()
    flops = target_flops_per_token(shape, seq)
    roof = ceil["matmul"] / flops
    row("target roofline (decoder FLOPs / matmul rate)", roof, "tok/s", note=f"{flops / 1e9:.2f} GFLOP/token")

    ids = torch.tensor(rows[:bsz], device=dev)

    def naive() -> None:
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
            del out

    iters = 3 if smoke else 10
    naive_tok_s = bsz * seq / timed(naive, dev, iters)
    row("naive forward (output_hidden_states, logits)", naive_tok_s, "tok/s", limit=("roofline", roof))

    batches = hc.plan_buckets([seq] * n_rows, range(n_rows), bsz * seq, 64)
    results: dict[str, float] = {}
    for label, comp in (("eager", False), ("compiled", True)):
        name = f"capture {label}, compute only"
        cap = None
        try:
            cap = hc.HiddenCapture(model, layer_ids, compile=comp and not smoke)
            pipe = hc.CapturePipeline(cap, dev, pad_multiple=64)
            t0 = time.perf_counter()
            pipe.run(rows, batches[:2])  # warm-up (and the compile)
            warm = time.perf_counter() - t0
            st = pipe.run(rows, batches)
            row(name, st.tok_s, "tok/s", limit=("roofline", roof), peer=("naive", naive_tok_s),
                note=f"warm-up {warm:.0f} s" if comp else "")
            results[label] = st.tok_s
            if comp and dev.type == "cuda":  # where the compiled capture's time goes (issue 27: the gap to the roofline)
                TABLE.kernel_rows(lambda pipe=pipe: pipe.run(rows, batches[:1]), dev, top=12)
        except Exception as e:  # noqa: BLE001 - keep measuring the rest
            failed(name, e)
            if cap is not None:
                cap.uncompile()
        finally:
            if cap is not None:
                cap.close()
    if not results:
        return model, rows
    best = max(results, key=results.get)
    per_token = (len(layer_ids) + 1) * shape["hidden_size"] * 2 + 8
    for n_writers in (writers, 2 * writers):
        cap = hc.HiddenCapture(model, layer_ids)  # compiled layers stay compiled
        pipe = hc.CapturePipeline(cap, dev, pad_multiple=64, depth=n_writers + 2, writers=n_writers)
        if n_writers == writers:
            try:
                pipe.run(rows, batches[:writers + 2], sink=lambda i, hs: 0)  # warm-up: the pinned buffers
                st = pipe.run(rows, batches, sink=lambda i, hs: 0)
                row(f"capture {best} + copy to pinned host", st.tok_s, "tok/s", limit=("roofline", roof),
                    peer=("naive", naive_tok_s), note=f"main thread waited {st.main_wait_s:.2f} s")
            except Exception as e:  # noqa: BLE001
                failed(f"capture {best} + copy to pinned host", e)
        try:
            sample_disk = file_ceiling(scratch / "ceil", seq, len(layer_ids) + 1, shape["hidden_size"], n_writers,
                                       min(write_gib, 3.0), smoke)
            disk_bound = sample_disk / per_token
            row(f"disk write + fsync, {per_token * seq / 1e6:.1f} MB sample files, {n_writers} threads",
                sample_disk / 1e9, "GB/s", limit=("disk (256 MiB files)", ceil["disk"] / 1e9),
                note=f"bound {disk_bound:,.0f} tok/s")
            n_write = max(2 * bsz, min(int(write_gib * (1 << 30) / (per_token * seq)), 64 if smoke else 10_000))
            wrows = torch.randint(0, shape["vocab_size"], (n_write, seq), generator=g).tolist()
            out = scratch / "hs"
            sink = hc.sample_writer(out, wrows, fsync=True)
            wb = hc.plan_buckets([seq] * n_write, range(n_write), bsz * seq, 64)
            pipe.run(wrows, wb[:1], sink=sink)  # warm-up: pinned buffers, first files
            st = pipe.run(wrows, wb[1:], sink=sink)
            row(f"capture {best} + files (fsync, {n_writers} writer threads, {st.bytes_written / 2**30:.1f} GiB)",
                st.tok_s, "tok/s", limit=("same-size-file disk bound", disk_bound), peer=("naive", naive_tok_s),
                note=f"{st.bytes_written / st.seconds / 1e9:.2f} GB/s; {st.tok_s * per_token / ceil['disk']:.0%} of the "
                     f"256 MiB-file bound; main thread waited {st.main_wait_s:.1f} s of {st.seconds:.1f} s")
            shutil.rmtree(out, ignore_errors=True)
        except Exception as e:  # noqa: BLE001
            failed(f"capture + files, {n_writers} writers", e)
        cap.close()
    return model, rows


def file_ceiling(d: Path, seq: int, layers: int, hidden: int, threads: int, gib: float, smoke: bool) -> float:
    """Bytes/s of `threads` threads writing sample-sized files exactly as the extraction does
    (hidden_capture.write_safetensors: temp file, write, fsync, rename), from memory, no GPU."""
    from concurrent.futures import ThreadPoolExecutor

    from eagle.data import capture as hc

    d.mkdir(parents=True, exist_ok=True)
    hs = torch.randn(seq, layers, hidden).to(torch.bfloat16)
    tid = torch.zeros(seq, dtype=torch.int64)
    per = hs.numel() * 2 + seq * 8
    n = max(2 * threads, int(gib * (1 << 30) / per)) if not smoke else 2 * threads
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(lambda i: hc.write_safetensors(d / f"hs_{i}.safetensors",
                                                             {"hidden_states": hs, "token_ids": tid}) or per, range(n)))
    rate = total / (time.perf_counter() - t0)
    shutil.rmtree(d, ignore_errors=True)
    return rate


# ---------------------------------------------------------------- 3. training


# ---------------------------------------------------------------- output
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the code, measures nothing")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write gpu_throughput.json/.md here [$OUT]")
    p.add_argument("--scratch", default=None, help="where files are written (default: a temp dir on local disk)")
    p.add_argument("--write-gib", type=float, default=6.0, help="hidden-state files written in the files run (<= 16)")
    p.add_argument("--steps", type=int, default=30, help="measured training steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=4, help="training steps before timing (the first compiles)")
    p.add_argument("--skip", default="", help="comma list of parts to skip: ceilings,extract,train")
    a = p.parse_args(argv)
    if a.write_gib > 16:
        p.error("--write-gib: at most 16 (the machine's disk is 64 GiB)")
    dev = bench_device(a.smoke)
    if dev is None:
        return 1
    shape = SMOKE if a.smoke else TARGET_1B
    dtype = torch.float32 if a.smoke else torch.bfloat16
    n = shape["num_hidden_layers"]
    layer_ids = [2, n // 2, n - 3]
    scratch = Path(a.scratch or tempfile.mkdtemp(prefix="gpu_throughput-"))
    skip = set(a.skip.split(","))
    if a.out:
        TABLE.out = Path(a.out)
    meta = META
    TABLE.stamp(dev, shape=shape, layer_ids=layer_ids)
    print(f"# gpu_throughput {meta}", flush=True)
    t_all = time.perf_counter()
    ceil = {"matmul": 1.0, "copy": 1.0, "disk": 1.0}
    if "ceilings" not in skip:
        try:
            ceil = ceilings(dev, a.smoke, scratch)
        except Exception as e:  # noqa: BLE001
            failed("ceilings", e)
    model, rows = None, None
    if "extract" not in skip or "train" not in skip:
        try:
            model, rows = extraction(shape, dev, dtype, ceil, a.smoke, scratch, a.write_gib, layer_ids)
        except Exception as e:  # noqa: BLE001
            failed("extraction", e)
    if "train" not in skip and model is not None:
        try:
            steps, warmup = (3, 1) if a.smoke else (a.steps, a.warmup)
            drafter_training(TABLE, model, rows, shape, dev, ceil, a.smoke, scratch, layer_ids, steps, warmup)
        except Exception as e:  # noqa: BLE001
            failed("training", e)
    meta["seconds"] = round(time.perf_counter() - t_all, 1)
    meta["ceilings"] = ceil
    save()
    print("\n" + TABLE.markdown())
    shutil.rmtree(scratch, ignore_errors=True)
    return 0 if all(r["value"] is not None for r in ROWS) else 2


if __name__ == "__main__":
    sys.exit(main())
