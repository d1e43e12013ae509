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


def per_call_ms(fn: Any, dev: Any, iters: int) -> float:  # noqa: ANN401 - a callable, a torch.device
    """Mean ms of fn() over `iters` back-to-back calls after a warm-up (CUDA events; wall clock on a CPU)."""
    import time

    import torch

    for _ in range(2):
        fn()
    if dev.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1000 / iters
    torch.cuda.synchronize(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


class Clocks:
    """The SM clock (MHz) and board power (W), sampled every 20 ms on a thread while `with` holds (NVML,
    where nvidia-ml-py is installed): shows whether a figure ran at the boost clock or a power-capped one."""

    def __init__(self, dev: Any) -> None:  # noqa: ANN401 - a torch.device
        self.nvml: Any = None
        self.samples: list[tuple[int, float]] = []
        if dev.type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = pynvml
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(dev.index or 0)
            except Exception:  # noqa: BLE001 - no NVML: no clock column
                self.nvml = None

    def __enter__(self) -> "Clocks":
        import threading

        self.samples, self._stop = [], threading.Event()
        if self.nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        n = self.nvml
        while not self._stop.wait(0.02):  # every 20 ms: a thread that takes the GIL seldom
            self.samples.append((n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM),
                                 n.nvmlDeviceGetPowerUsage(self.handle) / 1000))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.nvml is not None:
            self._thread.join()

    def summary(self) -> dict[str, float] | None:
        if not self.samples:
            return None
        mhz = sorted(c for c, _ in self.samples)
        watts = sorted(w for _, w in self.samples)
        return {"sm_mhz_median": mhz[len(mhz) // 2], "sm_mhz_min": mhz[0], "watts_median": watts[len(watts) // 2],
                "samples": len(mhz)}

    def describe(self) -> str:
        """'1635 MHz (min 1440), 691 W' of the samples; 'no clock read' when there are none."""
        return self.text(self.summary())

    @staticmethod
    def text(summary: dict[str, float] | None) -> str:
        if not summary:
            return "no clock read"
        return f"{summary['sm_mhz_median']} MHz (min {summary['sm_mhz_min']}), {summary['watts_median']:.0f} W"
