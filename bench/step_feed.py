"""Which part of feeding the drafter's step from the loader threads costs the CUDA-graph step its
speed (issue 27): the graphed step is slower fed by loader threads that build its batches than with
its batches on the device, and only in the feeds where torch's host allocator makes new pinned
blocks (the pins column); the figures: bench/results/2026-12-01-h200-session10/README.md.

    python -m bench.step_feed --out $OUT      # on the H200: the 1.1B shape's drafter, ~2 min
    python -m bench.step_feed --smoke         # tiny shapes on the CPU, the eager step only (a check)

One drafter (eagle.train.trainer's step, sync-free accuracy counts, fixed packs of 4 x 2047 tokens, random
bf16 states), compiled once and captured once (eagle.train.step_graph), then timed over the same packs
under each feed, in this order, as the graph and as the eager step:

  device              batches already on the device
  handed              loader threads hand over batches already on the device (threads alone)
  copied              loader threads copy pre-built pinned batches (dataset.to_device)
  built               loader threads build (dataset.collate, pinned) and copy: eagle train's feed
  built, 1 op thread  the same with one torch intra-op thread per loader thread (dataset.prefetched's
                      op_threads=1; collate's copies otherwise start a thread team per loader thread)
  built, 2N threads   `built` with twice the loader threads (eagle train has 4 on 16 cores)
  built, GIL 0.5 ms   `built` with Python's GIL switch interval at 0.5 ms, not 5: whether the main
                      thread, which launches the step, waits for the GIL a loader thread holds
  built, again        `built` once more: what the order alone changes

and the loader alone (built, no step) and collate alone on the main thread. Prints a table of ms a
step, with where the time goes: the main thread's wait for each batch, (the `built` feeds) each
batch's collate and copy on its loader thread, and the pinned blocks torch's host allocator
created during the feed with their cudaHostAlloc ms and MB; writes OUT/step_feed.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from bench.harness import bench_device, timed_feed, write_json
from bench.shapes import SMOKE, TARGET_1B, bench_drafter, random_target, samples, save_verifier

Batch = dict[str, torch.Tensor]


def pins(d: dict[str, float]) -> str:
    """A feed's pinned allocations as `count/ms/MB`."""
    return f"{int(d['pin_allocs'])}/{d['pin_alloc_ms']:.0f}/{d['pin_alloc_mb']:.0f}"


def switching(interval: float, batches: Iterable[Batch]) -> Iterator[Batch]:
    """`batches` with Python's GIL switch interval set to `interval` seconds while they are drawn
    (the default 5 ms is how long a thread may wait for the GIL held by another)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield from batches
    finally:
        sys.setswitchinterval(before)


def feeds(host: Callable[[list[int], bool], Batch], order: list[list[int]], resident: list[Batch],
          pre: list[Batch], dev: torch.device, workers: int,
          spans: list[tuple[float, float]]) -> dict[str, Callable[[], Iterable[Batch]]]:
    """Each feed: a function making a fresh iterator of batches on `dev` over the timed packs. The
    `built` feeds append each batch's (collate, copy) seconds on its loader thread to `spans`."""
    from eagle.train import dataset

    items = list(range(len(order)))

    def built(i: int) -> Batch:
        t0 = time.perf_counter()
        b = host(order[i], True)
        t1 = time.perf_counter()
        out = dataset.to_device(b, dev)
        spans.append((t1 - t0, time.perf_counter() - t1))  # list.append is atomic under the GIL
        return out

    return {
        "device": lambda: iter(resident),
        "handed": lambda: dataset.prefetched(lambda i: resident[i], items, workers),
        "copied": lambda: dataset.prefetched(lambda i: dataset.to_device(pre[i], dev), items, workers),
        "built": lambda: dataset.prefetched(built, items, workers),
        "built, 1 op thread": lambda: dataset.prefetched(built, items, workers, op_threads=1),
        f"built, {2 * workers} threads": lambda: dataset.prefetched(built, items, 2 * workers),
        "built, GIL 0.5 ms": lambda: switching(0.0005, dataset.prefetched(built, items, workers)),
        "built, again": lambda: dataset.prefetched(built, items, workers),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, eager step only: checks the code")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write step_feed.json here [$OUT]")
    p.add_argument("--steps", type=int, default=30, help="timed steps of each feed")
    p.add_argument("--workers", type=int, default=2, help="loader threads")
    a = p.parse_args(argv)
    dev = bench_device(a.smoke)
    if dev is None:
        return 1
    from eagle.drafter import model as drafter
    from eagle.train import dataset
    from eagle.train.steps import compile_settings, graphed_train_step, lr_lambda, step_autocast, train_step

    cuda = dev.type == "cuda"
    shape = SMOKE if a.smoke else TARGET_1B
    seq, dv, per_pack, ttt = (64, 64, 2, 3) if a.smoke else (2048, 8000, 4, 3)
    steps = 2 if a.smoke else a.steps
    compile_settings()
    drafter.use_sync_free_metrics()
    scratch = Path(tempfile.mkdtemp(prefix="step_feed-"))
    target = random_target(shape, dev, torch.bfloat16 if cuda else torch.float32)
    save_verifier(target, scratch / "verifier")
    del target
    n = shape["num_hidden_layers"]
    raw = samples(shape, [seq] * (2 * per_pack), 3)
    budget = per_pack * (seq - 1)
    shifted = [dataset.shift_sample(s, budget) for s in raw]
    order = [[(k * per_pack + j) % len(shifted) for j in range(per_pack)] for k in range(steps)]
    hdt = torch.bfloat16 if cuda else torch.float32

    def host(idx: list[int], pin: bool) -> Batch:
        return dataset.collate([shifted[i] for i in idx], dtype=hdt, layout=True, pin=pin and cuda)

    pre = [host(idx, True) for idx in order]
    resident = [{k: v.to(dev) for k, v in b.items()} for b in pre]
    model, params, opt = bench_drafter(scratch / "verifier", shape["vocab_size"], dv, [2, n // 2, n - 3], ttt, dev)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(10_000, 10))
    losses = drafter.loss_config()
    autocast = step_autocast(dev, cache=False)
    t0 = time.perf_counter()
    for b in resident[:3]:  # compiles
        train_step(model, b, opt, sched, params, ttt, losses, autocast)
    graphed = graphed_train_step(model, opt, params, ttt, losses, autocast) if cuda else None
    if graphed is not None:
        graphed.capture(resident[0])
        if graphed.failure:
            print(graphed.failure, file=sys.stderr)
            return 2
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                              "device": torch.cuda.get_device_name(dev) if cuda else "cpu (smoke)",
                              "pack": f"{per_pack} x {seq - 1}", "workers": a.workers, "steps": steps,
                              "setup_s": round(time.perf_counter() - t0, 1), "ms_per_step": {}}

    spans: list[tuple[float, float]] = []

    def timed(batches: Iterable[Batch], graph: bool) -> dict[str, float]:
        """ms a step, ms a step the main thread waited for its batch, the loader's ms a batch
        collating and copying (the `built` feeds), and the pinned blocks torch's host allocator
        had to create during the feed (each a cudaHostAlloc: page-locking 64-128 MB takes
        milliseconds; a warm cache creates none) with the ms they took (bench.timed_feed)."""
        def step(b: Batch) -> None:
            if graph:
                graphed(b)  # type: ignore[misc]
                sched.step()
            else:
                train_step(model, b, opt, sched, params, ttt, losses, autocast)

        spans.clear()
        r = timed_feed(batches, step, dev)
        k = max(len(spans), 1)
        return {"step": r["step_ms"], "wait": r["wait_ms"],
                "collate": sum(c for c, _ in spans) / k * 1000, "copy": sum(c for _, c in spans) / k * 1000,
                "pin_allocs": r["pin_allocs"], "pin_alloc_ms": r["pin_alloc_ms"], "pin_alloc_mb": r["pin_alloc_mb"]}

    print(f"{'feed':20s} {'graph':>7s} {'eager':>7s} | graph: {'wait':>6s} {'collate':>7s} {'copy':>6s} {'pins':>13s} | "
          f"eager: {'wait':>6s} {'collate':>7s} {'copy':>6s} {'pins':>13s}   (ms; {a.workers} loader threads; pins: "
          "pinned blocks allocated / their ms / their MB in all)", flush=True)
    by_name = feeds(host, order, resident, pre, dev, a.workers, spans)
    for name, feed in by_name.items():
        g = timed(feed(), True) if cuda else None
        e = timed(feed(), False)
        result["ms_per_step"][name] = {"graph": g and g["step"], "eager": e["step"], "graph_detail": g, "eager_detail": e}
        cols = (f"{g['step']:7.2f} {e['step']:7.2f} | graph: {g['wait']:6.2f} {g['collate']:7.2f} {g['copy']:6.2f} "
                f"{pins(g):>13s}" if g else f"{'-':>7s} {e['step']:7.2f} | graph: {'-':>6s} {'-':>7s} {'-':>6s} {'-':>13s}")
        print(f"{name:20s} {cols} | eager: {e['wait']:6.2f} {e['collate']:7.2f} {e['copy']:6.2f} {pins(e):>13s}",
              flush=True)
    start = time.perf_counter()
    for _ in by_name["built"]():
        pass
    result["loader_alone_ms"] = (time.perf_counter() - start) / steps * 1000
    start = time.perf_counter()
    for idx in order:
        host(idx, True)
    result["collate_alone_ms"] = (time.perf_counter() - start) / steps * 1000
    print(f"loader alone {result['loader_alone_ms']:.2f} ms a batch; collate alone (main thread) "
          f"{result['collate_alone_ms']:.2f} ms a batch", flush=True)
    write_json(a.out, "step_feed.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
