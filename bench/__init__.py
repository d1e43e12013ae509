"""Benchmark scripts (not installed with the package): run each from the repository root as
`python -m bench.NAME`; bench/README.md says what each measures, docs/benchmarks.md holds the results."""

import json
from pathlib import Path
from typing import Any


def write_json(out: str | Path | None, name: str, data: Any) -> None:  # noqa: ANN401 - any JSON-able value
    """Write `data` as indented JSON to OUT/name (the folder made if missing); nothing when `out` is
    None. Benches call it after every row or run, so a run cut short keeps what it measured."""
    if out is None or out == "":
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / name).write_text(json.dumps(data, indent=1) + "\n")


def bench_device(smoke: bool):  # noqa: ANN201 - torch.device | None; torch imported only here
    """The device a GPU bench runs on: the CPU for `--smoke`, else CUDA; None (with the reason on
    stderr) when there is no GPU and no --smoke, for the bench to exit 1."""
    import sys

    import torch

    if smoke:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    print("no GPU: use --smoke for a CPU check", file=sys.stderr)
    return None


def _host_stats(dev: Any) -> dict[str, Any]:  # noqa: ANN401 - a torch.device; torch imported only here
    """torch's host (pinned) allocator statistics; empty off CUDA or on a torch without them."""
    import torch

    if dev.type != "cuda" or not hasattr(torch.cuda, "host_memory_stats"):
        return {}
    return dict(torch.cuda.host_memory_stats())


def host_allocs(dev: Any) -> tuple[int, float, float]:  # noqa: ANN401 - a torch.device
    """(pinned blocks torch's host allocator has created, ms those cudaHostAlloc calls took, MB
    they hold) so far in this process; zeros off CUDA or on a torch without host_memory_stats."""
    stats = _host_stats(dev)
    return (int(stats.get("num_host_alloc", 0)), float(stats.get("host_alloc_time.total", 0)) / 1000,
            float(stats.get("allocated_bytes.allocated", 0)) / 2**20)


def host_pool(dev: Any) -> tuple[int, int]:  # noqa: ANN401 - a torch.device
    """(pinned blocks torch's host allocator has given back to CUDA so far, the most blocks it counted
    as in use at once since the last reset_peak_host_memory_stats: handed out, or freed with their
    copy's event not yet seen complete); zeros off CUDA or on a torch without these stats."""
    stats = _host_stats(dev)
    return int(stats.get("num_host_free", 0)), int(stats.get("active_requests.peak", 0))


def timed_feed(batches: Any, step: Any, dev: Any) -> dict[str, Any]:  # noqa: ANN401 - iterable, callable, torch.device
    """step(batch) for each batch of `batches` (an iterable: a feed), the device synchronised at
    both ends. Returns the seconds, the steps, the last step's return value, ms a step, the ms a
    step the main thread waited for its batch (a feed that cannot keep up), and the pinned blocks
    torch's host allocator created meanwhile with their ms and MB (host_allocs)."""
    import time

    from bench.gpu_decode import sync

    pinned = host_allocs(dev)
    sync(dev)
    t0, waited, count, last = time.perf_counter(), 0.0, 0, None
    it = iter(batches)
    while True:
        t = time.perf_counter()
        b = next(it, None)
        waited += time.perf_counter() - t
        if b is None:
            break
        last = step(b)
        count += 1
    sync(dev)
    seconds = time.perf_counter() - t0
    allocs, alloc_ms, alloc_mb = (after - before for after, before in zip(host_allocs(dev), pinned, strict=True))
    per_step = 1000 / max(count, 1)
    return {"s": seconds, "steps": count, "last": last, "step_ms": seconds * per_step, "wait_ms": waited * per_step,
            "pin_allocs": allocs, "pin_alloc_ms": alloc_ms, "pin_alloc_mb": alloc_mb}
