"""What the bench scripts share: measuring (timing, kernel profiles, matmul rates, clocks, step
times), running children (process groups, free ports), and writing results (JSON, tables).

A script imports this module and bench.shapes, never another script; this module imports no
script. torch is imported inside the functions that need it, so the CPU-only scripts
(parse_bench, ledger_scale, series_bench, vllm_cpu) stay light.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle.train.hooks import StepHooks

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[1]
# NVLink multicast stays off in every child of the multi-GPU benches (the lent machines' rule)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# kernel kinds by name: matrix products and attention (the decode and training profiles share them)
MATMUL = re.compile(r"gemv|gemm|cutlass|xmma|nvjet|cublas|splitK|sm90_|addmm|aten::mm|aten::linear", re.I)
ATTENTION = re.compile(r"fmha|flash|attention|cudnn", re.I)


# ---------------------------------------------------------------- results
def write_json(out: str | Path | None, name: str, data: Any) -> None:  # noqa: ANN401 - any JSON-able value
    """Write `data` as indented JSON to OUT/name (the folder made if missing); nothing when `out` is
    None. Benches call it after every row or run, so a run cut short keeps what it measured."""
    if out is None or out == "":
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / name).write_text(json.dumps(data, indent=1) + "\n")


class Table:
    """One bench's table of measurements: rows of name, value, unit, and optionally a limit and a peer
    (each with the ratio to it) and a note; a failed measurement is a row with no value naming its cause.
    With `out` set, OUT/NAME.json and OUT/NAME.md are rewritten after every row (a run cut short keeps
    what it measured)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: list[dict[str, Any]] = []
        self.meta: dict[str, Any] = {}
        self.out: Path | None = None

    def stamp(self, dev: Any, **extra: Any) -> None:  # noqa: ANN401 - a torch.device; any JSON-able values
        """The meta every table starts with: date, device, torch, transformers and speculators versions, `extra`."""
        import importlib.metadata as md

        import torch
        import transformers

        self.meta.update({"date": time.strftime("%Y-%m-%d"),
                          "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)",
                          "torch": torch.__version__, "transformers": transformers.__version__, **extra})
        try:
            self.meta["speculators"] = md.version("speculators")
        except md.PackageNotFoundError:
            pass

    def save(self) -> None:
        if self.out is not None:
            write_json(self.out, f"{self.name}.json", {"meta": self.meta, "rows": self.rows})
            (self.out / f"{self.name}.md").write_text(self.markdown())

    def row(self, name: str, value: float, unit: str, limit: tuple[str, float] | None = None,
            peer: tuple[str, float] | None = None, note: str = "") -> None:
        r: dict[str, Any] = {"name": name, "value": value, "unit": unit, "note": note}
        if limit:
            r["limit"], r["of_limit"] = limit[0], value / limit[1] if limit[1] else None
        if peer:
            r["peer"], r["of_peer"] = peer[0], value / peer[1] if peer[1] else None
        self.rows.append(r)
        self.save()
        print(f"  {name}: {value:,.1f} {unit}" + (f"  ({r['of_limit']:.0%} of {limit[0]})" if limit else "")
              + (f"  ({r['of_peer']:.2f}x {peer[0]})" if peer else "") + (f"  [{note}]" if note else ""), flush=True)

    def failed(self, name: str, exc: BaseException) -> None:
        import traceback

        msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        self.rows.append({"name": name, "value": None, "unit": "", "note": "FAILED " + msg})
        self.save()
        print(f"  {name}: FAILED {msg}", flush=True)
        traceback.print_exc(limit=6)

    def kernel_rows(self, step: Any, dev: Any, top: int = 8) -> None:  # noqa: ANN401 - a callable, a torch.device
        """Top CUDA kernels (share of device time) over 3 calls of `step`, as rows: the 'why' of a figure
        (a failure here is a row, never the loss of the figure's own)."""
        try:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    step()
                sync(dev)
            events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
            attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
            total = sum(getattr(e, attr) for e in events) or 1
            for e in sorted(events, key=lambda e: -getattr(e, attr))[:top]:
                self.row(f"  kernel {e.key[:70]}", getattr(e, attr) / 3 / 1000, "ms/step",
                         note=f"{getattr(e, attr) / total:.0%} of device time, {e.count // 3} calls/step")
        except Exception as e:  # noqa: BLE001
            self.failed("kernel profile", e)

    def markdown(self) -> str:
        if not self.meta:
            return ""
        m = self.meta
        lines = [f"{m.get('date')}, {m.get('gpu')}, torch {m.get('torch')}, transformers {m.get('transformers')}, "
                 f"speculators {m.get('speculators', '-')}", "",
                 "| measurement | value | unit | vs limit | vs peer | note |", "| --- | ---: | --- | --- | --- | --- |"]
        for r in self.rows:
            v = "-" if r["value"] is None else f"{r['value']:,.1f}"
            lim = f"{r['of_limit']:.0%} of {r['limit']}" if r.get("of_limit") is not None else ""
            peer = f"{r['of_peer']:.2f}x {r['peer']}" if r.get("of_peer") is not None else ""
            lines.append(f"| {r['name']} | {v} | {r['unit']} | {lim} | {peer} | {r['note']} |")
        return "\n".join(lines) + "\n"


def rows_table(rows: list[dict[str, Any]]) -> str:
    """Rows of {name, value, unit, note} as a plain-text table (multi_gpu_scaling's, online_training's)."""
    if not rows:
        return "(no rows)"
    w = max(len(r["name"]) for r in rows)
    lines = [f"{'measure':<{w}}  {'value':>14}  unit      note", "-" * (w + 40)]
    for r in rows:
        v = r["value"]
        text = f"{v:>14,.3f}" if isinstance(v, float) else f"{v!s:>14}"
        lines.append(f"{r['name']:<{w}}  {text}  {r['unit']:<8}  {r['note']}".rstrip())
    return "\n".join(lines)


def steady(res: dict) -> float:
    """Real tokens per second over the epochs after the first (the first carries compilation)."""
    if "steady_tok_s" in res:
        return res["steady_tok_s"]
    later = list(zip(res["epoch_tok_s"][1:], res["epoch_s"][1:], strict=True))
    return sum(t * s for t, s in later) / sum(s for _, s in later) if later else res["epoch_tok_s"][0]


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """The real loop's steady tok/s over each other mode's (fixed, speculators, nobuckets, nowarm, dynb)."""
    base = results.get("real", {}).get("steady_tok_s_all")
    return {f"real / {other}": base / results[other]["steady_tok_s_all"]
            for other in ("fixed", "speculators", "nobuckets", "nowarm", "dynb") if base and other in results}


# ---------------------------------------------------------------- the device and timing
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


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (nothing on the CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Any, dev: torch.device, iters: int, warmup: int = 2) -> float:
    """Median seconds of fn() over `iters` runs (each synchronised)."""
    for _ in range(warmup):
        fn()
    sync(dev)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


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


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes/s of a device-to-device copy (counting the read and the write; median of 10)."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / sorted(times)[len(times) // 2]


def matmul_rate(dev: torch.device, n: int) -> float:
    """Measured bf16 FLOP/s of an n^3 product (the MFU's denominator): ten
    products after three, a burst the card runs at its boost clock (sustained_matmul_rate: held)."""
    import torch

    mat = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    return 2 * n ** 3 / timed(lambda: mat @ mat, dev, 10 if n >= 4096 else 3, 3)


def sustained_matmul_rate(dev: torch.device, n: int, seconds: float = 2.0) -> tuple[float, dict[str, Any] | None]:
    """bf16 FLOP/s of n^3 products back to back for `seconds`, timed over the latter half, with the SM
    clock and board power over that half (Clocks). On the H200 a held load meets the card's
    power cap (~700 W) and its clock falls from 1980 MHz to ~1500: the rate any long job can have,
    where matmul_rate's burst is the boost clock's."""
    import torch

    mat = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    one_ms = per_call_ms(lambda: mat @ mat, dev, 3)
    calls = max(3, int(seconds * 500 / one_ms))  # half the time each
    per_call_ms(lambda: mat @ mat, dev, calls)  # the first half: the clock settles
    with Clocks(dev) as clk:
        ms = per_call_ms(lambda: mat @ mat, dev, calls)
    return 2 * n ** 3 / (ms / 1000), clk.summary()


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

    def __enter__(self) -> Clocks:
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


# ---------------------------------------------------------------- kernel profiles
CATEGORIES = (  # first match wins: attention before matmul (flash kernels carry "cutlass" in their names)
    ("attention", ATTENTION),
    ("loss", re.compile(r"loss_(forward|backward)_kernel", re.I)),
    ("matmul", MATMUL),
    ("optimizer", re.compile(r"multi_tensor|adam|foreach|clip", re.I)),
    ("inductor", re.compile(r"^triton_", re.I)),
)


def category(name: str) -> str:
    return next((cat for cat, rx in CATEGORIES if rx.search(name)), "other")


def kernel_profile(step: Any, dev: torch.device, steps: int = 3) -> dict[str, Any]:
    """Device ms per step by category, kernels per step, the top kernels, and the step's wall ms."""
    from torch.profiler import ProfilerActivity, profile

    sync(dev)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync(dev)
    wall = (time.perf_counter() - t0) / steps
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    attr = "self_device_time_total" if events and hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    cats: dict[str, float] = {}
    for e in events:
        cats[category(e.key)] = cats.get(category(e.key), 0.0) + getattr(e, attr) / steps / 1000
    top = sorted(events, key=lambda e: -getattr(e, attr))[:12]
    return {"device_ms": round(sum(cats.values()), 3), "wall_ms_profiled": round(wall * 1000, 3),
            "kernels": sum(e.count for e in events) // steps,
            "by_category_ms": {k: round(v, 3) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
            "top": [{"kernel": e.key[:90], "ms": round(getattr(e, attr) / steps / 1000, 3), "calls": e.count // steps,
                     "category": category(e.key)} for e in top]}


# ---------------------------------------------------------------- feeds and pinned memory
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


# ---------------------------------------------------------------- step times of eagle train
class Marks:
    """Time marks on the training stream: CUDA events, or the clock on the CPU."""

    def __init__(self) -> None:
        import torch

        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._event = torch.cuda.Event

    def mark(self) -> Any:
        if self.cuda:
            ev = self._event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) if self.cuda else 1000.0 * (b - a)


class StepTimes(StepHooks):
    """The Trainer's step hooks (eagle/train/hooks.py) leaving marks at every optimizer step; `rows()`
    turns them into times."""

    def __init__(self, keep: int = 4000) -> None:
        self.keep = keep
        self.marks: Marks | None = None
        self.steps: list[dict[str, Any]] = []
        self._bw: list[tuple[Any, Any, Any, list[int]]] = []  # (start, last bucket ready, end, grid) per backward
        self._bucket: Any = None
        self._start: Any = None
        self._opt_start: Any = None

    def _m(self) -> Any:
        if self.marks is None:
            self.marks = Marks()
        return self.marks.mark()

    def before_backward(self, batch: dict[str, Any]) -> None:
        self._bucket = None
        self._start = self._m()

    def after_backward(self, batch: dict[str, Any]) -> None:
        grid = list(batch["doc_index"].shape[-2:]) if "doc_index" in batch else []
        self._bw.append((self._start, self._bucket, self._m(), grid))

    def before_optimizer(self) -> None:
        self._opt_start = self._m()

    def after_optimizer(self) -> None:
        if self._bw and len(self.steps) < self.keep:
            first, last = self._bw[0], self._bw[-1]
            self.steps.append({"start": first[0], "bucket": last[1], "bw_end": last[2], "opt_start": self._opt_start,
                               "opt_end": self._m(), "grid": last[3], "batches": len(self._bw)})
        self._bw = []

    def ddp(self, model: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses annotations other than its own
            self._bucket = self._m()  # the last bucket's mark wins: all gradients ready
            return default_hooks.allreduce_hook(state, bucket)

        model.register_comm_hook(None, hook)

    def rows(self) -> list[dict[str, Any]]:
        """Per optimizer step, in ms (after training: reading a CUDA event waits for it)."""
        import torch

        if self.marks is None:
            return []
        if self.marks.cuda:
            torch.cuda.synchronize()
        ms, out = self.marks.ms, []
        for i, s in enumerate(self.steps):
            split = s["bucket"] if s["bucket"] is not None else s["bw_end"]
            nxt = self.steps[i + 1]["start"] if i + 1 < len(self.steps) else None
            out.append({"compute_ms": ms(s["start"], split), "comm_ms": ms(split, s["bw_end"]),
                        "opt_ms": ms(s["opt_start"], s["opt_end"]),
                        "wall_ms": ms(s["start"], nxt) if nxt is not None else None,
                        "grid": s["grid"], "batches": s["batches"]})
        return out


def read(out_dir: Path) -> list[list[dict[str, Any]]]:
    """The ranks' step rows, written by main() as DIR/step-times-rank{R}.json, in rank order."""
    files = sorted(out_dir.glob("step-times-rank*.json"), key=lambda f: int(f.stem.rsplit("rank", 1)[1]))
    if not files:
        raise RuntimeError(f"no step-times-rank*.json in {out_dir}")
    return [json.loads(f.read_text())["steps"] for f in files]


def summarise(ranks: list[list[dict[str, Any]]], skip: float = 0.25) -> dict[str, Any]:
    """Medians over the steps after the first `skip` of them, per rank, and how far apart the ranks'
    compute was at each step (under DDP the slowest rank sets the step's pace)."""
    n = min(len(r) for r in ranks)
    lo = int(n * skip)
    if n - lo < 1:
        raise RuntimeError("no optimizer steps were timed")

    def med(rank: list[dict[str, Any]], key: str) -> float:
        vals = [s[key] for s in rank[lo:n] if s[key] is not None]
        return statistics.median(vals) if vals else float("nan")

    per_rank = [{k: med(r, k) for k in ("compute_ms", "comm_ms", "opt_ms", "wall_ms")} for r in ranks]
    compute = [[r[i]["compute_ms"] for r in ranks] for i in range(lo, n)]
    return {"world": len(ranks), "steps": n - lo, "per_rank": per_rank,
            "compute_spread_ms": statistics.median(max(c) - min(c) for c in compute),
            "slowest_compute_ms": statistics.median(max(c) for c in compute)}


def describe(s: dict[str, Any]) -> str:
    """One line: the medians of rank 0 (and the others' compute), the spread between ranks."""
    r0 = s["per_rank"][0]
    others = ", ".join(f"{r['compute_ms']:.1f}" for r in s["per_rank"][1:])
    return (f"compute {r0['compute_ms']:.1f} ms" + (f" (other ranks {others})" if others else "")
            + f", comm + wait {r0['comm_ms']:.1f}, optimizer {r0['opt_ms']:.1f}, wall {r0['wall_ms']:.1f} ms a step"
            + (f"; ranks' compute apart by {s['compute_spread_ms']:.1f} ms (median)" if s["world"] > 1 else "")
            + f"; {s['steps']} steps")


# ---------------------------------------------------------------- child processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_group(cmd: list[str], env: dict[str, str], timeout: float, cwd: Path = REPO,
              log: Path | None = None) -> subprocess.CompletedProcess:
    """Run `cmd` in a new process group (torchrun's workers included); on timeout kill that group
    (ours alone: we created it) and return returncode 124 with what was printed until then. The output
    goes to LOG.stdout.log / LOG.stderr.log as it is printed (a temp dir without `log`), so it is on
    disk even if this process is killed while the group's GPU processes take long to die."""
    where = Path(tempfile.mkdtemp(prefix="run-group-")) if log is None else log.parent
    where.mkdir(parents=True, exist_ok=True)
    stem = log.name if log is not None else "run"
    paths = (where / f"{stem}.stdout.log", where / f"{stem}.stderr.log")
    with open(paths[0], "w") as so, open(paths[1], "w") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, text=True, env=env, cwd=cwd, start_new_session=True)
        rc = None
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
    out, err = (x.read_text(errors="replace") for x in paths)
    if log is None:
        shutil.rmtree(where, ignore_errors=True)
    if rc is None:
        return subprocess.CompletedProcess(cmd, 124, out, err + f"\n[killed after {timeout:.0f} s]")
    return subprocess.CompletedProcess(cmd, rc, out, err)


def eagle_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `eagle ARGS` (wait with `finish`)."""
    return subprocess.Popen([sys.executable, "-m", "eagle.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, proc.args[2:5]))} failed:\n{err[-3000:]}")

