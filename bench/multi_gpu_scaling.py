"""Scaling of `eagle extract` and `eagle train` over N GPUs of one host (issues 11 and 24): one call, one table.

    python3 -m bench.multi_gpu_scaling --out $OUT                 # on nvidia-h200-x2: 1.1B Llama shape, bf16
    python3 -m bench.multi_gpu_scaling --workdir W --train-baseline OUT/train_real_loop.json ...
                                           # reuse bench/train_real_loop.py's target, data and 1-GPU figure
    python3 -m bench.multi_gpu_scaling --smoke                    # tiny shapes, CPU processes over gloo (a check
                                                                  # of the code: N processes on shared cores)

Parts (`--parts`, in this order; each child process has a timeout, and with `--deadline` a part gets
only the time left and is skipped when too little is):
  disk     the disk bound at extraction's own file sizes and writer count: 1 process, then N at once,
           each with extraction's 8 writer threads (hidden_capture.write_safetensors: temp file, fsync,
           rename), writing the files of the extraction set (rows i % N == K) from memory.
  extract  `eagle extract` (the CLI) on the extraction set: 1 process, then `torchrun --nproc-per-node N`
           (index % N sharding, rank R on cuda:R); same files checked byte for byte.
  capture  compute only: the capture engine (hidden_capture.CapturePipeline, compiled layers, no sink)
           in one process per GPU after a warm-up pass; rank 0 alone on all rows, then all N ranks at
           once on their shards (a file barrier starts them together).
  allreduce  what DDP adds to each optimizer step: an all-reduce of the drafter's gradients (its trainable
           parameters' count, float32, and in bfloat16 as a compression hook would send them) between
           N processes (NCCL on GPUs, NCCL_DEBUG=INFO: the transport it picked, in logs/allreduce-*.log),
           ms per all-reduce and bus bandwidth; with every gradient ready only at the backward's end
           (eagle/train/trainer.py), it adds to the step time one to one.
  train    `eagle train` under torchrun (DDP over NCCL; gloo on CPU) on bench/train_real_loop.py's
           variable-length data, against 1 process on the same data, epochs and arguments (its `real`
           mode's result with --train-baseline, else run here).
  online1  `eagle train --online` with 1 process, kept in WORKDIR/online-1.json (so it can run on one GPU
           while the other is busy: bench/h200x2_call.py runs it beside another job).
  online   `eagle train --online` (each rank runs its own target forward) with N processes, against
           online-1.json when its arguments match, else against a 1-process run here.

Rates: disk and extraction with files are read off the files' modification times (each file's last
write, which precedes its fsync and rename): "2nd half" = the tokens written while every writer
was past half of its own tokens and none had finished / that window's seconds (with one writer: the
later half of the tokens), so model load, the lazy compile of the first batches and ranks starting
apart are out of it, for 1 and N writers alike ("all" = every token / from the start of the writers
to the last file; for the CLI the start is unknown, so its own capture_tok_s is given instead,
compile included). The disk writers start together at a file barrier, after their imports. Training: real tokens per second over the epochs after the first
(the first carries compilation), all ranks' tokens over the epoch's seconds, as bench/train_real_loop.py.
Efficiency = rate(N) / (N x rate(1)); extraction with files is also set against the N-writer disk bound.
Writes OUT/multi_gpu_scaling.json after every row (OUT: --out, else $OUT), child logs under WORKDIR/logs.
NVLink multicast stays off in every child: NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import (
    NO_MULTICAST,
    REPO,
    describe,
    free_port,
    read,
    rows_table,
    run_group,
    steady,
    summarise,
)
from bench.shapes import (
    BATCH_TOKENS,
    EXTRACT_BATCH,
    LR,
    SMOKE_CLI,
    TARGET_1B,
    TTT,
    VAL_FRACTION,
    make_data,
    prepare,
)

PARTS = ("disk", "extract", "capture", "allreduce", "train", "online1", "online")
WRITERS = 8  # hidden_capture.extract_rows' writer threads per process

ROWS: list[dict[str, Any]] = []
META: dict[str, Any] = {}


def save(out: Path | None) -> None:
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / ".multi_gpu_scaling.json.tmp"
        tmp.write_text(json.dumps({"meta": META, "rows": ROWS}, indent=1) + "\n")
        os.replace(tmp, out / "multi_gpu_scaling.json")


def row(out: Path | None, part: str, name: str, value: float | str, unit: str = "", note: str = "") -> None:
    ROWS.append({"part": part, "name": name, "value": value, "unit": unit, "note": note})
    text = f"{value:,.3f}" if isinstance(value, float) else str(value)
    print(f"  [{part}] {name}: {text} {unit} {note}".rstrip(), file=sys.stderr, flush=True)
    save(out)


# ---------------------------------------------------------------- inputs


def row_lengths(data: Path) -> list[int]:
    from eagle.data import hidden_io

    return [len(r) for r in hidden_io.open_prepared(data).with_format(None)["input_ids"]]


# ---------------------------------------------------------------- measuring files


def file_rates(dirs: list[Path], start: float | None, world: int = 1) -> dict[str, float]:
    """Tokens per second read off the hs files' mtimes. Writer (rank) r wrote the files hs_i with
    i % world == r. "half": the files written while every writer was past half of its own tokens and
    none had finished (from the latest of the writers' half-way times to the earliest of their last
    files), so load, compile and one rank starting late stay out; with one writer it is the later half
    of the tokens. "all" (when `start` is given): every token from `start` to the last file."""
    from safetensors import safe_open

    ranks: dict[int, list[tuple[float, int, int]]] = {r: [] for r in range(world)}
    for d in dirs:
        for f in d.glob("hs_*.safetensors"):
            with safe_open(str(f), "pt") as fh:
                tokens = fh.get_slice("token_ids").get_shape()[0]
            ranks[int(f.stem.split("_")[1]) % world].append((f.stat().st_mtime, tokens, f.stat().st_size))
    files = sorted(x for got in ranks.values() for x in got)
    total = sum(t for _, t, _ in files)
    halves, ends = [], []
    for got in ranks.values():
        if not got:
            continue
        got.sort()
        mine, acc = sum(t for _, t, _ in got), 0
        k = 0
        while k < len(got) - 1 and acc + got[k][1] <= mine / 2:
            acc += got[k][1]
            k += 1
        halves.append(got[max(k - 1, 0)][0])
        ends.append(got[-1][0])
    a, b = max(halves), min(ends)
    inside = sum(t for m, t, _ in files if a < m <= b)
    res = {"files": len(files), "tokens": total, "bytes": sum(x for _, _, x in files),
           # no window when the writers' second halves did not overlap (one started late on little data)
           "half_tok_s": inside / (b - a) if b > a else float("nan"), "half_s": max(b - a, 0.0), "half_tokens": inside,
           "skew_s": max(ends) - min(ends)}
    if start is not None:
        res["all_tok_s"] = total / max(files[-1][0] - start, 1e-9)
        res["all_s"] = files[-1][0] - start
    return res


def same_files(a: Path, b: Path) -> tuple[int, int, float]:
    """(files byte-identical, files in `a`, the largest |difference| of hidden states in the others; inf when
    a file is missing or its shape differs)."""
    from safetensors.torch import load_file

    names = sorted(p.name for p in a.glob("hs_*.safetensors"))
    same, worst = 0, 0.0
    for n in names:
        if (b / n).is_file() and filecmp.cmp(a / n, b / n, shallow=False):
            same += 1
            continue
        if not (b / n).is_file():
            worst = float("inf")
            continue
        x, y = load_file(str(a / n))["hidden_states"].float(), load_file(str(b / n))["hidden_states"].float()
        worst = max(worst, float((x - y).abs().max()) if x.shape == y.shape else float("inf"))
    return same, len(names), worst


# ---------------------------------------------------------------- children (run as `--child JSON`)


def file_barrier(sync: str, name: str, rank: int, world: int) -> None:
    """Wait until every rank has reached `name` (a file per rank in `sync`)."""
    Path(sync, f"{name}-{rank}").touch()
    while not all(Path(sync, f"{name}-{k}").exists() for k in range(world)):
        time.sleep(0.002)


def child_disk(data: str, out: str, rank: int, world: int, layers: int, hidden: int, sync: str) -> dict[str, Any]:
    """Write the hs files of rows i % world == rank, as extraction writes them, from one buffer; the
    writers start together (after their imports and buffers)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from eagle.data import hidden_io
    from eagle.data.capture import write_safetensors

    lengths = row_lengths(Path(data))
    mine = [i for i in range(len(lengths)) if i % world == rank]
    buf = torch.empty(max(lengths), layers, hidden, dtype=torch.bfloat16).pin_memory() if torch.cuda.is_available() \
        else torch.empty(max(lengths), layers, hidden, dtype=torch.bfloat16)
    buf.view(torch.int16).random_(-30000, 30000)  # incompressible, like real states
    tid = torch.zeros(max(lengths), dtype=torch.int64)
    d = hidden_io.hs_dir(out)
    d.mkdir(parents=True, exist_ok=True)
    file_barrier(sync, "start", rank, world)
    t0 = time.time()
    with ThreadPoolExecutor(WRITERS) as pool:
        written = sum(pool.map(lambda i: write_safetensors(hidden_io.hs_path(out, i), {
            "hidden_states": buf[: lengths[i]], "token_ids": tid[: lengths[i]]}), mine))
    return {"start": t0, "end": time.time(), "bytes": written, "files": len(mine)}


def child_allreduce(numel: int, rank: int, world: int, port: int, gpu: bool, reps: int) -> dict[str, Any]:
    """Time all-reduces of `numel` elements (float32, then bfloat16) in a process group of `world`."""
    import torch
    import torch.distributed as td

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    device = torch.device(f"cuda:{rank}" if gpu else "cpu")
    if gpu:
        torch.cuda.set_device(device)
    td.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world,
                          **({"device_id": device} if gpu else {}))
    res: dict[str, Any] = {"rank": rank, "numel": numel}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        try:
            x = torch.ones(numel, dtype=dtype, device=device)
            for _ in range(3):
                td.all_reduce(x)
            if gpu:
                torch.cuda.synchronize(device)
            td.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                td.all_reduce(x)
            if gpu:
                torch.cuda.synchronize(device)
            res[f"{name}_ms"] = 1000 * (time.perf_counter() - t0) / reps
            res[f"{name}_bytes"] = numel * x.element_size()
        except Exception as e:  # gloo may lack bfloat16: say so, keep the float32 figure
            res[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    td.destroy_process_group()
    return res


def child_capture(target: str, data: str, sync: str, rank: int, world: int, reps: int, gpu: bool) -> dict[str, Any]:
    """Compute-only capture: warm up, then (rank 0 alone) all rows, then (everyone at once) own shard."""
    import torch

    from eagle.data import hidden_io
    from eagle.data.capture import CapturePipeline, HiddenCapture, plan_buckets
    from eagle.target import load_model, open_target

    device = f"cuda:{rank}" if gpu else "cpu"
    if not gpu:
        torch.set_num_threads(1)
    rows = list(hidden_io.open_prepared(Path(data)).with_format(None)["input_ids"])
    lengths = [len(r) for r in rows]
    ids = open_target(Path(target)).layer_ids(None)
    model = load_model(Path(target), device, "auto")
    capture = HiddenCapture(model, ids, compile=gpu)
    pad = 64 if gpu else 1
    budget = EXTRACT_BATCH["gpu" if gpu else "smoke"]
    pipe = CapturePipeline(capture, torch.device(device), pad_multiple=pad)
    everything = plan_buckets(lengths, range(len(rows)), budget, pad)
    mine = plan_buckets(lengths, [i for i in range(len(rows)) if i % world == rank], budget, pad)

    def barrier(name: str) -> None:
        file_barrier(sync, name, rank, world)

    pipe.run(rows, everything if rank == 0 else mine)  # compiles every width this rank will see
    res: dict[str, Any] = {"rank": rank, "tokens_all": sum(lengths),
                           "tokens_mine": sum(lengths[i] for b in mine for i in b)}
    barrier("warm")
    if rank == 0:
        t0 = time.perf_counter()
        for _ in range(reps):
            pipe.run(rows, everything)
        res["lone_s"] = time.perf_counter() - t0
    barrier("lone")
    res["pair_start"] = time.time()
    for _ in range(reps):
        pipe.run(rows, mine)
    res["pair_end"] = time.time()
    capture.close()
    return res


# ---------------------------------------------------------------- the parts


class Bench:
    def __init__(self, a: argparse.Namespace, out: Path | None, work: Path, gpu: bool, shape: dict[str, int]) -> None:
        self.a, self.out, self.work, self.gpu, self.shape, self.n = a, out, work, gpu, shape, a.nproc
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.layers = 3 + 1  # default layer ids [2, N//2, N-3] + the last layer
        self.reserve = 0.0  # seconds the parts after the running one need (set by main)

    def left(self) -> float:
        return float("inf") if self.a.deadline is None else self.a.deadline - time.time() - 3

    def share(self, runs: int) -> float:
        """The seconds one of the `runs` training runs still to do in this part may take: an equal
        share of what the deadline leaves after the later parts' minimum (a fixed cap kills a run
        whose cold compile took long while the next part has minutes to spare)."""
        if self.a.deadline is None:
            return 1800.0
        return max(1.0, (self.left() - self.reserve) / runs)

    def env(self, nproc: int, metrics: Path | None = None) -> dict[str, str]:
        env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1"}
        if metrics is not None:
            env["RUNBOOK_METRICS"] = str(metrics)
        if self.gpu and nproc == 1:
            env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        if not self.gpu:  # one thread per process: a process stands for one device
            env["OMP_NUM_THREADS"] = "1"
        return env

    def run(self, name: str, cmd: list[str], env: dict[str, str], cap: float) -> subprocess.CompletedProcess:
        timeout = min(cap, self.left())
        t0 = time.perf_counter()
        res = run_group(cmd, env, timeout, log=self.logs / name)
        (self.logs / f"{name}.log").write_text(f"$ {' '.join(cmd)}\n# {time.perf_counter() - t0:.1f} s, rc "
                                               f"{res.returncode}\n{res.stdout}\n--- stderr\n{res.stderr}")
        if res.returncode != 0:
            tail = "\n".join(res.stderr.strip().splitlines()[-12:])
            raise RuntimeError(f"{name}: rc {res.returncode} ({'timed out' if res.returncode == 124 else 'failed'}) "
                               f"after {time.perf_counter() - t0:.0f} s; logs/{name}.log ends:\n{tail}")
        return res

    def eagle(self, name: str, args: list[str], nproc: int, cap: float, metrics: Path | None = None,
              step_times: Path | None = None) -> float:
        """Run `eagle ARGS` with 1 process or under torchrun; the wall seconds. With `step_times`, eagle's
        CLI runs inside bench/step_times.py, which writes each rank's step times there."""
        module = ["bench.step_times", "--out", str(step_times), "--"] if step_times else ["eagle.cli"]
        if nproc == 1:
            cmd = [sys.executable, "-m", *module, *args]
        else:
            torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
            cmd = [torchrun, "--nproc-per-node", str(nproc), "--master-port", str(free_port()), "-m", *module, *args]
        t0 = time.perf_counter()
        self.run(name, cmd, self.env(nproc, metrics), cap)
        return time.perf_counter() - t0

    def children(self, name: str, kind: str, args: list[list[Any]], cap: float) -> list[dict[str, Any]]:
        """Start one `--child` process per args list at once; their RESULT lines, in order."""
        env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1", **({} if self.gpu else {"OMP_NUM_THREADS": "1"})}
        procs = [subprocess.Popen([sys.executable, "-m", "bench.multi_gpu_scaling", "--child", json.dumps([kind, *x])],
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True)
                 for x in args]
        deadline = time.time() + min(cap, self.left())
        results, failed = [], []
        for k, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
                err += "\n[killed: out of time]"
            (self.logs / f"{name}-{k}.log").write_text(out + "\n--- stderr\n" + err)
            line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
            if p.returncode != 0 or line is None:
                failed.append(f"{name}-{k}: rc {p.returncode}: " + " | ".join(err.strip().splitlines()[-4:]))
            else:
                results.append(json.loads(line[len("RESULT "):]))
        if failed:
            raise RuntimeError("; ".join(failed))
        return results

    # -------------------------------------------------------- disk
    def disk(self, data: Path) -> dict[int, dict[str, float]]:
        got = {}
        for n in sorted({1, self.n}):
            d, sync = self.work / f"disk-{n}", self.work / f"disk-{n}-sync"
            for x in (d, sync):
                shutil.rmtree(x, ignore_errors=True)
            sync.mkdir()
            res = self.children(f"disk-{n}", "disk", [[str(data), str(d), k, n, self.layers, self.shape["hidden_size"],
                                                       str(sync)] for k in range(n)], cap=120)
            rates = file_rates([d / "hidden_states"], min(r["start"] for r in res), n)
            for x in (d, sync):
                shutil.rmtree(x, ignore_errors=True)
            got[n] = rates
            row(self.out, "disk", f"disk bound, {n} writer process(es) x {WRITERS} threads, 2nd half", rates["half_tok_s"],
                "tok/s", f"{rates['bytes'] / 1e9:.2f} GB in {rates['files']} files (extraction's sizes); "
                f"all {rates['all_tok_s']:,.0f} tok/s = {rates['bytes'] / rates['all_s'] / 1e9:.2f} GB/s; "
                f"writers' starts {max(r['start'] for r in res) - min(r['start'] for r in res):.2f} s apart")
        return got

    # -------------------------------------------------------- extract
    def extract(self, target: Path, data: Path, disk: dict[int, dict[str, float]], one: Path | None) -> None:
        """`one`: a data dir that 1-process `eagle extract` already filled (train_real_loop's W/data-v,
        metrics in W/extract-data-v.json): taken as the 1-process run instead of running it again."""
        runs = {}
        bt = str(EXTRACT_BATCH["gpu" if self.gpu else "smoke"])
        for n in (1, self.n):
            if n == 1 and one is not None:
                d, m, wall = one, json.loads((self.work / f"extract-{one.name}.json").read_text()), float("nan")
                how = "taken from train_real_loop's preparation"
            else:
                d, metrics = self.work / f"extract-{n}", self.work / f"extract-{n}.metrics.json"
                shutil.rmtree(d, ignore_errors=True)
                args = ["extract", "--model", str(target), "--data", str(data), "--out", str(d), "--batch-tokens", bt,
                        "--keep-free", "0"] + ([] if self.gpu else ["--device", "cpu"])
                wall = self.eagle(f"extract-{n}", args, n, cap=150, metrics=metrics)
                m, how = json.loads(metrics.read_text()), "run here"
            rates = file_rates([d / "hidden_states"], None, n)
            runs[n] = (d, rates)
            ranks = [m[f"extract_rank{k}_capture_tok_s"] for k in range(n) if f"extract_rank{k}_capture_tok_s" in m]
            row(self.out, "extract", f"extract with files, {n} process(es), 2nd half", rates["half_tok_s"], "tok/s",
                f"{rates['tokens']:,} tokens, {rates['bytes'] / 1e9:.2f} GB; CLI capture_tok_s {m['extract_capture_tok_s']:,.0f}"
                f" (compile included{'; ranks ' + ' '.join(f'{r:,.0f}' for r in ranks) if ranks else ''}); "
                f"CLI wall {wall:.1f} s; {how}; window {rates['half_s']:.1f} s, last files {rates['skew_s']:.1f} s apart"
                + ("" if rates["half_s"] > 0 else "; NO FIGURE: the writers' second halves did not overlap "
                   "(more data: --extract-data e --extract-samples N)"))
            bound = disk.get(n)
            if bound:
                row(self.out, "extract", f"extract with files / disk bound, {n} writer(s)",
                    rates["half_tok_s"] / bound["half_tok_s"], "x", f"disk bound {bound['half_tok_s']:,.0f} tok/s (2nd half)")
        (d1, r1), (dn, rn) = runs[1], runs[self.n]
        row(self.out, "extract", f"extract with files scaling, {self.n} vs 1 process", rn["half_tok_s"] / (self.n * r1["half_tok_s"]),
            "x", "2nd-half rates; both write to the one local disk")
        same, count, worst = same_files(d1 / "hidden_states", dn / "hidden_states")
        row(self.out, "extract", "extract: files byte-identical, 1 vs N processes", f"{same} of {count}", "",
            f"largest |difference| in the others {worst:.3g}" if same < count else "")
        for d in (d1, dn):
            if d != one:
                shutil.rmtree(d, ignore_errors=True)

    # -------------------------------------------------------- capture
    def capture(self, target: Path, data: Path) -> None:
        sync = self.work / "capture-sync"
        shutil.rmtree(sync, ignore_errors=True)
        sync.mkdir()
        reps = self.a.capture_reps
        res = self.children("capture", "capture", [[str(target), str(data), str(sync), k, self.n, reps, self.gpu]
                                                   for k in range(self.n)], cap=150)
        shutil.rmtree(sync, ignore_errors=True)
        tokens = res[0]["tokens_all"] * reps
        lone = tokens / res[0]["lone_s"]
        pair = tokens / (max(r["pair_end"] for r in res) - min(r["pair_start"] for r in res))
        row(self.out, "capture", "capture compute only, 1 GPU", lone, "tok/s", f"{tokens:,} tokens ({reps} passes), warm")
        row(self.out, "capture", f"capture compute only, {self.n} GPUs at once", pair, "tok/s",
            "per rank " + " ".join(f"{r['tokens_mine'] * reps / (r['pair_end'] - r['pair_start']):,.0f}" for r in res))
        row(self.out, "capture", "capture compute-only scaling", pair / (self.n * lone), "x",
            f"tok/s({self.n}) / ({self.n} x tok/s(1))")

    # -------------------------------------------------------- train / online
    # -------------------------------------------------------- allreduce
    def allreduce(self, target: Path, data: Path) -> None:
        import torch

        from eagle.drafter import model as drafter
        from eagle.train import dataset

        d2t, t2d = dataset.read_vocab(data)
        model = drafter.build_drafter(target, layer_ids=dataset.read_layer_ids(data), d2t=d2t, t2d=t2d, ttt_steps=3)
        numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
        del model
        port, reps = free_port(), 20 if self.gpu else 3
        old = os.environ.get("NCCL_DEBUG")
        os.environ["NCCL_DEBUG"] = "INFO"  # the transport NCCL picked (P2P/CUMEM, SHM, ...) goes to the logs
        try:
            res = self.children("allreduce", "allreduce", [[numel, k, self.n, port, self.gpu, reps] for k in range(self.n)],
                                cap=120)
        finally:
            if old is None:
                os.environ.pop("NCCL_DEBUG", None)
            else:
                os.environ["NCCL_DEBUG"] = old
        transports = sorted({line.split(" via ", 1)[1].split()[0] for k in range(self.n)
                             for line in (self.logs / f"allreduce-{k}.log").read_text().splitlines() if " via " in line})
        for dtype in ("float32", "bfloat16"):
            if f"{dtype}_ms" not in res[0]:
                row(self.out, "allreduce", f"all-reduce {dtype}: FAILED", res[0].get(f"{dtype}_error", "?"))
                continue
            ms = max(r[f"{dtype}_ms"] for r in res)
            nbytes = res[0][f"{dtype}_bytes"]
            bus = nbytes / (ms / 1000) * 2 * (self.n - 1) / self.n / 1e9
            row(self.out, "allreduce", f"all-reduce of the drafter's gradients, {dtype}, {self.n} processes", ms, "ms",
                f"{numel:,} trainable parameters = {nbytes / 1e6:.0f} MB; bus bandwidth {bus:.1f} GB/s; "
                f"NCCL transport: {', '.join(transports) or 'not logged'}; torch {torch.__version__}")

    def train_args(self, target: Path, data: Path, epochs: int) -> list[str]:
        kind = "gpu" if self.gpu else "smoke"
        return ["train", "--model", str(target), "--data", str(data), "--epochs", str(epochs), "--batch-tokens",
                str(BATCH_TOKENS[kind]), "--lr", str(LR[kind]), "--ttt-steps", str(TTT), "--val-fraction",
                str(VAL_FRACTION)] + ([] if self.gpu else ["--device", "cpu"])

    def train_run(self, name: str, args: list[str], nproc: int, cap: float) -> dict[str, Any]:
        out, metrics, times = self.work / name, self.work / f"{name}.metrics.json", self.work / f"{name}.step-times"
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(times, ignore_errors=True)
        wall = self.eagle(name, [*args, "--out", str(out)], nproc, cap, metrics, step_times=times)
        log = json.loads((out / "train_log.json").read_text())
        ep = log["epochs"]
        res = {"epoch_tok_s": [e["train_tok_s"] for e in ep], "epoch_s": [e["seconds"] for e in ep],
               "steps": [e["steps"] for e in ep], "val_loss": [e["val_loss"] for e in ep],
               "val_acc": ep[-1]["val_acc"], "world_size": log["args"]["world_size"], "wall_s": wall,
               "data_wait_s": [e["data_wait_s"] for e in ep], "target_s": [e.get("target_s") for e in ep]}
        res["steady_tok_s_all"] = steady(res)
        res["step_times"] = summarise(read(times))
        shutil.rmtree(out, ignore_errors=True)
        return res

    def compare(self, part: str, one: dict[str, Any], many: dict[str, Any], source: str) -> None:
        n = self.n
        row(self.out, part, f"{part} tok/s, 1 process", float(one["steady_tok_s_all"]), "tok/s",
            f"epochs after the first: {[round(x) for x in one['epoch_tok_s']]} ({source})")
        row(self.out, part, f"{part} tok/s, {n} processes", float(many["steady_tok_s_all"]), "tok/s",
            f"epochs {[round(x) for x in many['epoch_tok_s']]}, steps/epoch (all ranks) {many['steps']}, "
            f"CLI wall {many['wall_s']:.0f} s")
        row(self.out, part, f"{part} scaling efficiency", many["steady_tok_s_all"] / (n * one["steady_tok_s_all"]), "x",
            f"tok/s({n}) / ({n} x tok/s(1))")
        for procs, res in ((1, one), (n, many)):
            if res.get("step_times"):
                st = res["step_times"]
                row(self.out, part, f"{part} step, {procs} process(es): slowest rank's compute", st["slowest_compute_ms"],
                    "ms", describe(st))
        row(self.out, part, f"{part} val_loss by epoch, 1 / {n} processes",
            f"{' '.join(f'{x:.4f}' for x in one['val_loss'] if x is not None)} / "
            f"{' '.join(f'{x:.4f}' for x in many['val_loss'] if x is not None)}")
        row(self.out, part, f"{part} val_acc (last epoch), 1 / {n} processes",
            f"{' '.join(f'{x:.3f}' for x in one['val_acc'])} / {' '.join(f'{x:.3f}' for x in many['val_acc'])}")

    def train(self, target: Path, data: Path) -> None:
        args = self.train_args(target, data, self.a.epochs)
        one, source = None, "run here"
        if self.a.train_baseline and self.a.train_baseline.is_file():
            base = json.loads(self.a.train_baseline.read_text())
            real, meta = base.get("results", {}).get("real"), base.get("meta", {})
            same = real and meta.get("epochs") == self.a.epochs and meta.get("samples_variable") == self.a.samples
            if same:
                one = {**real, "val_loss": real.get("val_loss", [float("nan")]), "wall_s": real.get("process_s", 0.0)}
                source = f"{self.a.train_baseline.name}: its real mode, same data, epochs and arguments"
        many = self.train_run(f"train-{self.n}", args, self.n, cap=self.share(1 if one else 2))
        if one is None:
            one = self.train_run("train-1", args, 1, cap=self.share(1))
        self.compare("train", one, many, source)

    def online1(self, target: Path, data: Path) -> dict[str, Any]:
        """`eagle train --online` with 1 process; kept in WORKDIR/online-1.json with its arguments."""
        args = [*self.train_args(target, data, self.a.online_epochs), "--online"]
        one = self.train_run("online-1", args, 1, cap=self.share(1))
        (self.work / "online-1.json").write_text(json.dumps({"args": args, "result": one}) + "\n")
        row(self.out, "online", "online tok/s, 1 process", float(one["steady_tok_s_all"]), "tok/s",
            f"epochs {[round(x) for x in one['epoch_tok_s']]}, kept in online-1.json")
        return one

    def online(self, target: Path, data: Path) -> None:
        args = [*self.train_args(target, data, self.a.online_epochs), "--online"]
        kept = self.work / "online-1.json"
        saved = json.loads(kept.read_text()) if kept.is_file() else {}
        one, source = (saved["result"], "online-1.json: an earlier run of part online1") \
            if saved.get("args") == args else (None, "run here")
        many = self.train_run(f"online-{self.n}", args, self.n, cap=self.share(1 if one else 2))
        if one is None:
            one = self.train_run("online-1", args, 1, cap=self.share(1))
        self.compare("online", one, many, source)
        row(self.out, "online", f"online target seconds per epoch, 1 / {self.n} processes",
            f"{' '.join(f'{x or 0:.1f}' for x in one['target_s'])} / {' '.join(f'{x or 0:.1f}' for x in many['target_s'])}")


# ---------------------------------------------------------------- the table


def table(rows: list[dict[str, Any]] | None = None) -> str:
    """The rows (default: this bench's) as a plain-text table."""
    return rows_table(ROWS if rows is None else rows)


MIN_SECONDS = {"disk": 15, "extract": 45, "capture": 40, "allreduce": 30, "train": 90, "online1": 80, "online": 80}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="Tiny shapes, CPU processes with gloo.")
    p.add_argument("--nproc", type=int, default=2, help="Processes (GPUs) for the parallel runs.")
    p.add_argument("--parts", default=",".join(PARTS), help=f"Comma-separated, of {', '.join(PARTS)}.")
    p.add_argument("--samples", type=int, default=None, help="Training rows, as train_real_loop's --samples [192; smoke 24].")
    p.add_argument("--extract-samples", type=int, default=None, help="Extraction rows [384; smoke 24].")
    p.add_argument("--extract-data", choices=("e", "v"), default="e",
                   help="e: a separate set of --extract-samples rows; v: the training rows, whose 1-process "
                        "extraction (bench/train_real_loop.py's preparation) is then reused.")
    p.add_argument("--epochs", type=int, default=3, help="Training epochs (as train_real_loop's).")
    p.add_argument("--online-epochs", type=int, default=2, help="--online training epochs.")
    p.add_argument("--capture-reps", type=int, default=3, help="Timed passes of the compute-only capture.")
    p.add_argument("--train-baseline", type=Path, default=None,
                   help="train_real_loop.json: take the 1-process training figure from its real mode.")
    p.add_argument("--deadline", type=float, default=None, help="Wall-clock time (time.time()) to be done by.")
    p.add_argument("--workdir", type=Path, default=None, help="Inputs and outputs here (default: a temp dir, removed).")
    p.add_argument("--out", type=Path, default=None, help="Write multi_gpu_scaling.json here [default: $OUT].")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        args = json.loads(a.child)
        kinds = {"disk": child_disk, "capture": child_capture, "allreduce": child_allreduce}
        res = kinds[args[0]](*args[1:])
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    a.samples = a.samples or (24 if a.smoke else 192)
    a.extract_samples = a.extract_samples or (24 if a.smoke else 384)
    out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    parts = a.parts.split(",")
    bad = [x for x in parts if x not in PARTS]
    if bad:
        print(f"unknown part {bad[0]!r}; use {', '.join(PARTS)}", file=sys.stderr)
        return 2

    import torch

    gpu = not a.smoke
    if gpu and torch.cuda.device_count() < a.nproc:
        print(f"this machine has {torch.cuda.device_count()} GPUs; {a.nproc} are needed (or use --smoke on the CPU)",
              file=sys.stderr)
        return 2
    shape = SMOKE_CLI if a.smoke else TARGET_1B
    META.update({"date": time.strftime("%Y-%m-%d %H:%M"), "smoke": a.smoke, "nproc": a.nproc, "shape": shape,
                 "args": {k: str(v) for k, v in vars(a).items()}, "torch": torch.__version__, "cpus": os.cpu_count(),
                 "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], **NO_MULTICAST})
    work = a.workdir or Path(tempfile.mkdtemp(prefix="multi-gpu-scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(a, out, work, gpu, shape)
    try:
        t0 = time.perf_counter()
        seq = 48 if a.smoke else 2048
        target, data_v, _, _, _ = prepare(work, shape, a.samples, seq, ["real"], gpu, a.smoke)
        data_e = work / "data-e"
        if a.extract_data == "e" and not (data_e / "dataset_info.json").is_file():
            shutil.rmtree(data_e, ignore_errors=True)
            make_data(shape["vocab_size"], a.extract_samples, seq, data_e, seed=3)
        ext = data_v if a.extract_data == "v" else data_e
        META["prepare_s"] = time.perf_counter() - t0
        save(out)
        disk: dict[int, dict[str, float]] = {}
        for i, part in enumerate(parts):
            bench.reserve = sum(MIN_SECONDS[p] for p in parts[i + 1:])
            if bench.left() < MIN_SECONDS[part]:
                row(out, part, f"{part}: skipped", "no time", "", f"{bench.left():.0f} s left, {MIN_SECONDS[part]} s needed")
                continue
            t1 = time.perf_counter()
            try:
                if part == "disk":
                    disk = bench.disk(ext)
                elif part == "extract":
                    bench.extract(target, ext, disk, data_v if a.extract_data == "v" else None)
                elif part == "capture":
                    bench.capture(target, ext)
                elif part == "allreduce":
                    bench.allreduce(target, data_v)
                elif part == "train":
                    bench.train(target, data_v)
                elif part == "online1":
                    bench.online1(target, data_v)
                else:
                    bench.online(target, data_v)
            except Exception as e:  # keep what was measured; say what failed and go on
                row(out, part, f"{part}: FAILED", type(e).__name__, "", str(e)[:1500])
            META.setdefault("part_seconds", {})[part] = round(time.perf_counter() - t1, 1)
            save(out)
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table())
    if a.smoke:
        print(f"\n(smoke: {a.nproc} CPU processes on {os.cpu_count()} shared cores; checks the code paths, not GPU scaling)")
    return 0 if ROWS and not any(r["name"].endswith("FAILED") for r in ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
