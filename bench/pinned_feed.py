"""Whether a host running ahead of the GPU makes eagle train's loader allocate pinned memory (issue
27): fed fixed packs, the drafter's CUDA-graph step was slower than on the device while torch's host
allocator made a new pinned block for nearly every batch (bench/train_step_kernels.py). A graph
replay returns at once, so the main thread can queue many steps ahead of the GPU; the eager step
keeps it close. This bench has no drafter to compile (~1 minute on the H200):

    python -m bench.pinned_feed --out $OUT         # on a GPU
    python -m bench.pinned_feed --smoke            # tiny shapes on the CPU (a check of the code)

The "step" is a CUDA graph of bf16 matrix products lasting about --step-ms, after a copy of the
batch's hidden states into its static input (as eagle.train.step_graph's replay starts). Batches are
eagle train's: packs of 4 x 2047 tokens of the 1.1B shape's random states (3 aux layers), built on
--workers loader threads (dataset.collate into pinned memory, dataset.to_device on a copy stream,
dataset.prefetched). Each feed runs twice (a first and a second pass) with the host allowed to run
ahead of the GPU by, in this order:

  in step   none: the host waits for each step (as an eager step with host syncs)
  2 ahead   two steps: after queueing step k the host waits for step k-2 to finish
  free      any number of steps (as eagle train's loop with --cuda-graphs); last, so a warm cache
            cannot explain new blocks here

and prints, per pass, ms a step, the main thread's wait for batches, the pinned blocks created
(count, cudaHostAlloc ms, MB), the blocks given back to CUDA (freed: something emptied the cache)
and the most blocks torch's allocator counted as in use at once (busy: handed out, or freed with
their copy's event not yet seen complete). Writes OUT/pinned_feed.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from bench.harness import bench_device, host_pool, timed, timed_feed, write_json
from bench.shapes import SMOKE, TARGET_1B, samples

Batch = dict[str, torch.Tensor]
AHEAD = {"in step": 0, "2 ahead": 2, "free": None}  # free last: its passes find the cache warm


def busy_step(dev: torch.device, like: torch.Tensor, step_ms: float, n: int) -> Callable[[Batch], None]:
    """A step of about `step_ms` of n x n bf16 products (fp32 on the CPU) after copying the batch's
    hidden states into a static buffer shaped `like`: a CUDA graph replay on a GPU, eager on the CPU."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=dev, dtype=dtype)
    static = torch.empty_like(like, device=dev)
    # a product's median time after warm-up (a process's first product also sets up cuBLAS)
    products = max(1, round(step_ms / 1000 / timed(lambda: a @ a, dev, 5)))

    def work() -> None:
        for _ in range(products):
            torch.matmul(a, a)

    if dev.type != "cuda":
        def eager(batch: Batch) -> None:
            static.copy_(batch["hidden_states"])
            work()
        return eager
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work()  # warm-up before capture, as torch asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()

    def replay(batch: Batch) -> None:
        static.copy_(batch["hidden_states"], non_blocking=True)
        graph.replay()
    return replay


def bounded(step: Callable[[Batch], None], ahead: int | None, dev: torch.device) -> Callable[[Batch], None]:
    """`step`, the host then waiting until at most `ahead` steps (this one included) are still
    queued on the GPU: 0 waits for each step, 2 for the one before last (None: no wait)."""
    if ahead is None or dev.type != "cuda":
        return step
    queued: deque[torch.cuda.Event] = deque()

    def run(batch: Batch) -> None:
        step(batch)
        event = torch.cuda.Event()
        event.record()
        queued.append(event)
        while len(queued) > ahead:
            queued.popleft().synchronize()
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the code, measures nothing")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write pinned_feed.json here [$OUT]")
    p.add_argument("--steps", type=int, default=40, help="steps of each pass")
    p.add_argument("--workers", type=int, default=4, help="loader threads (eagle train has 4 on 16 cores)")
    p.add_argument("--step-ms", type=float, default=27.0, help="GPU time of a step (the 1.1B drafter's graph: 27 ms)")
    a = p.parse_args(argv)
    dev = bench_device(a.smoke)
    if dev is None:
        return 1
    from eagle.train import dataset

    cuda = dev.type == "cuda"
    shape = SMOKE if a.smoke else TARGET_1B
    seq, per_pack, steps = (64, 2, 3) if a.smoke else (2048, 4, a.steps)
    raw = samples(shape, [seq] * (2 * per_pack), 3)
    shifted = [dataset.shift_sample(s, per_pack * (seq - 1)) for s in raw]
    order = [[(k * per_pack + j) % len(shifted) for j in range(per_pack)] for k in range(steps)]
    hdt = torch.bfloat16 if cuda else torch.float32

    def build(idx: list[int]) -> Batch:  # HiddenStates.batch: collate into pinned memory, copy stream
        return dataset.to_device(dataset.collate([shifted[i] for i in idx], dtype=hdt, layout=True, pin=cuda), dev)

    like = build(order[0])["hidden_states"]
    step = busy_step(dev, like, a.step_ms if cuda else 2.0, 8192 if cuda else 64)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                              "device": torch.cuda.get_device_name(dev) if cuda else "cpu (smoke)",
                              "pack": f"{per_pack} x {seq - 1}", "workers": a.workers, "steps": steps,
                              "step_ms_asked": a.step_ms, "passes": []}
    step_alone = timed_feed([{"hidden_states": like}] * steps, step, dev)
    result["step_alone_ms"] = step_alone["step_ms"]
    print(f"step alone {result['step_alone_ms']:.2f} ms; {a.workers} loader threads; pins: new pinned blocks / "
          "their cudaHostAlloc ms / their MB", flush=True)
    print(f"{'host ahead by':14s} {'pass':5s} {'step ms':>8s} {'wait ms':>8s} {'pins':>16s} {'freed':>6s} "
          f"{'busy':>6s}", flush=True)
    for name, ahead in AHEAD.items():
        for pass_name in ("1st", "2nd"):
            if cuda and hasattr(torch.cuda, "reset_peak_host_memory_stats"):
                torch.cuda.reset_peak_host_memory_stats()
            freed = host_pool(dev)[0]
            r = timed_feed(dataset.prefetched(build, order, a.workers), bounded(step, ahead, dev), dev)
            frees, busy = host_pool(dev)
            row = {"ahead": name, "pass": pass_name, "step_ms": r["step_ms"], "wait_ms": r["wait_ms"],
                   "pin_allocs": r["pin_allocs"], "pin_alloc_ms": r["pin_alloc_ms"], "pin_alloc_mb": r["pin_alloc_mb"],
                   "pin_frees": frees - freed, "pin_busy_peak": busy}
            result["passes"].append(row)
            pins = f"{row['pin_allocs']}/{row['pin_alloc_ms']:.0f}/{row['pin_alloc_mb']:.0f}"
            print(f"{name:14s} {pass_name:5s} {row['step_ms']:8.2f} {row['wait_ms']:8.2f} {pins:>16s} "
                  f"{row['pin_frees']:6d} {busy:6d}", flush=True)
            write_json(a.out, "pinned_feed.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
