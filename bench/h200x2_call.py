"""One device call on two GPUs for issues 17 and 24: everything in a wall-clock budget, partial results kept.

    python3 -m bench.h200x2_call --out $OUT --budget 560     # on nvidia-h200-x2
    python3 -m bench.h200x2_call --smoke --out /tmp/o        # the same plumbing on the CPU (tiny shapes,
                                                             # gloo, make test-gpu skips without CUDA)

Phase A, two lanes at once:
  GPU 1   with --decode first `bench/gpu_decode.py --attention sdpa,triton --skip-part2` (issue 27)
          -> attention.json, its table in summary.txt
  GPU 1   `make test-gpu PY=python3` (tests/gpu/test_gpu.py; CUDA_VISIBLE_DEVICES=1, so its DDP test runs
          2 processes sharing one GPU over gloo)                                      -> test_gpu.log
          then the --lane1-modes of train_real_loop on the same prepared data (e.g. fixed: the
          fixed-shape step on its own H200 while GPU 0 runs real and speculators; merged into
          train_real_loop.json), then, with time left, the 1-process `eagle train --online`
          baseline (multi_gpu_scaling online1)
  GPU 0   bench/train_real_loop.py --workdir W: target, data, the 1-process extraction, then eagle
          train real loop / fixed shape / speculators' CLI        -> train_real_loop.json, lane0.log
Phase B, both GPUs: bench/multi_gpu_scaling.py --workdir W (disk bound 1 and 2 writers, 2-process
extraction against the lane's 1-process one, DDP training against the lane's real mode, compute-only
capture, --online)                                                -> multi_gpu_scaling.json, scaling.log
Then summary.txt (the tables), env.txt (machine), logs.tar.gz (every child's log, the lanes' too) and
compile-cache.tar.gz: 8 files at most with attention.json (a call returns 8).

Compilation: a fresh machine compiles the 1.1B drafter's step in 81-105 s a process (22 s with the
caches of an earlier call on the same machine). Every child shares one inductor and triton cache
(TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR under --workdir); at the end it is packed into OUT/compile-cache.tar.gz (when at most 15 MB), and
`--compile-cache FILE` unpacks such a file first: carry it to the next call (same torch, triton and GPU
kind, or the caches simply miss).
Every piece runs in its own process group with a timeout taken from the budget; the group is
killed when it runs out, and what was written so far stays.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from bench.harness import NO_MULTICAST, REPO, describe, ratios, rows_table

TIMES: dict[str, float] = {}
CACHE_LIMIT = 15 * 10**6  # a returned file may be 16 MB


def run_logged(name: str, cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> int:
    """Run `cmd` in its own process group, output streamed to `log` (kept if killed); 124 on timeout."""
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}  (timeout {timeout:.0f} s)\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
        fh.write(f"\n# {name}: rc {rc} after {time.time() - t0:.1f} s\n")
    TIMES[name] = round(time.time() - t0, 1)
    TIMES[f"{name}_rc"] = rc
    return rc


def use_compile_cache(packed: Path | None, where: Path) -> dict[str, str]:
    """The environment that points inductor's and triton's caches at `where`, first filled from
    `packed` (an earlier call's compile-cache.tar.gz) when given."""
    where.mkdir(parents=True, exist_ok=True)
    if packed is not None:
        with tarfile.open(packed) as tar:
            tar.extractall(where, filter="data")
    return {"TORCHINDUCTOR_CACHE_DIR": str(where / "inductor"), "TRITON_CACHE_DIR": str(where / "triton")}


def save_compile_cache(where: Path, dest: Path, limit: int = CACHE_LIMIT) -> str:
    """Pack `where` into `dest` (.tar.gz) when the result is at most `limit` bytes; says what it did."""
    if not where.is_dir() or not any(where.rglob("*")):
        return f"compile cache: {where} is empty, nothing packed"
    part = dest.with_name(dest.name + ".part")
    with tarfile.open(part, "w:gz") as tar:
        for sub in sorted(where.iterdir()):
            tar.add(sub, arcname=sub.name)
    size = part.stat().st_size
    if size > limit:
        part.unlink()
        return (f"compile cache: {size / 1e6:.1f} MB packed, over the {limit / 1e6:.0f} MB limit: not returned; "
                f"unpacked, by kind: {cache_breakdown(where)}")
    part.rename(dest)
    return f"compile cache: {dest} ({size / 1e6:.1f} MB); pass it as --compile-cache next call"


def cache_breakdown(where: Path, top: int = 10) -> str:
    """What fills a compile cache, largest first: MB by top-level folder and file suffix (e.g.
    `triton .ptx`), to learn what could be left out of a returned cache."""
    sizes: dict[str, int] = {}
    for f in where.rglob("*"):
        if f.is_file():
            rel = f.relative_to(where)
            key = f"{rel.parts[0] if len(rel.parts) > 1 else '.'} {f.suffix or '(none)'}"
            sizes[key] = sizes.get(key, 0) + f.stat().st_size
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v / 1e6:.1f}" for k, v in ranked[:top]) or "(empty)"


def machine(out: Path) -> None:
    parts = []
    for cmd in (["nvidia-smi"], ["nvidia-smi", "topo", "-m"], ["nproc"], ["df", "-h", str(REPO), "/tmp"],
                [sys.executable, "-c", "import torch, transformers; print(torch.__version__, torch.version.cuda, "
                 "transformers.__version__, torch.backends.cudnn.version(), torch.cuda.device_count())"]):
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            parts.append(f"$ {' '.join(cmd)}\n{res.stdout}{res.stderr}")
        except (OSError, subprocess.TimeoutExpired) as e:
            parts.append(f"$ {' '.join(cmd)}\n{e}")
    (out / "env.txt").write_text("\n".join(parts))


def test_summary(log: Path) -> str:
    """The lines of the pytest log that say what passed (per test, the durations and the final count)."""
    if not log.is_file():
        return "(no log)"
    lines = log.read_text(errors="replace").splitlines()
    keep = [x for x in lines if any(k in x for k in (" PASSED", " FAILED", " ERROR", " SKIPPED", "passed", "failed",
                                                       "s call ", "s setup ", "# test-gpu"))]
    return "\n".join(keep[-60:])


def merge_lanes(main: Path, other: Path) -> None:
    """Lane 1's train_real_loop results into lane 0's file, ratios recomputed; its meta kept under lane1."""
    if not other.is_file():
        return
    b = json.loads(other.read_text())
    a = json.loads(main.read_text()) if main.is_file() else {"meta": {}, "results": {}}
    a["results"].update(b["results"])
    a["meta"]["lane1"] = {k: b["meta"].get(k) for k in ("device", "matmul_flop_s", "failed", "skipped")} | {
        "modes": list(b["results"]), "where": "GPU 1, after make test-gpu, on lane 0's prepared data"}
    a["meta"]["ratios"] = ratios(a["results"])
    main.write_text(json.dumps(a, indent=1) + "\n")


def summary(out: Path, log_dir: Path) -> str:
    text = ["# times (s) and exit codes", json.dumps(TIMES), "", "# make test-gpu", test_summary(out / "test_gpu.log"), ""]
    trl = out / "train_real_loop.json"
    if trl.is_file():
        d = json.loads(trl.read_text())
        text.append("# train_real_loop (steady = real tokens/s over the epochs after the first)")
        for mode, r in d["results"].items():
            text.append(f"{mode:<12} steady {r['steady_tok_s_all']:>10,.0f} tok/s  epochs "
                        f"{[round(x) for x in r['epoch_tok_s']]}  MFU {r.get('mfu') or 0:.1%}  graphs after epoch 1 "
                        f"{sorted(set(r.get('graphs_after_epoch1', [])))}  process {r.get('process_s', 0):.0f} s")
            if r.get("step_times"):
                text.append(f"{'':<12} {describe(r['step_times'])}")
        text.append(f"ratios {json.dumps(d['meta'].get('ratios', {}))}  prepare {d['meta'].get('prepare_s', 0):.0f} s  "
                    f"skipped {d['meta'].get('skipped', [])}  failed {d['meta'].get('failed', [])}")
        text.append("")
    decode_log = log_dir / "decode.log"
    if decode_log.is_file():
        lines = [x for x in decode_log.read_text(errors="replace").splitlines() if "Warning" not in x and x.strip()]
        text += ["# gpu_decode --attention sdpa,triton (attention.json; the log's last lines)", *lines[-45:], ""]
    mgs = out / "multi_gpu_scaling.json"
    if mgs.is_file():
        text += ["# multi_gpu_scaling", rows_table(json.loads(mgs.read_text())["rows"])]
    return "\n".join(text) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/h200x2-out")))
    p.add_argument("--budget", type=float, default=560, help="Wall seconds for everything.")
    p.add_argument("--workdir", type=Path, default=REPO.parent / "scale-work",
                   help="Target, data and logs (kept between calls on a warm machine).")
    p.add_argument("--samples", type=int, default=None, help="Training rows [192; smoke 24].")
    p.add_argument("--lane-a", type=float, default=350, help="Seconds for phase A (both lanes).")
    p.add_argument("--tests", default="make", help="make: run make test-gpu in lane 1; none: skip it.")
    p.add_argument("--modes", default="real,fixed,speculators", help="train_real_loop modes (empty: no lane 0).")
    p.add_argument("--lane1-modes", default="",
                   help="train_real_loop modes run on GPU 1 after the tests (taken out of --modes; merged).")
    p.add_argument("--parts", default="online1,disk,extract,train,capture,online",
                   help="multi_gpu_scaling parts (online1 runs in lane 1 after the tests, when time is left).")
    p.add_argument("--extract-samples", type=int, default=None,
                   help="Phase B's disk and extraction parts on their own N rows (default: the training rows; "
                        "1024 of them gave ranks' runs too short to overlap on 2026-12-01).")
    p.add_argument("--decode", action="store_true",
                   help="Lane 1 first runs bench/gpu_decode.py --attention sdpa,triton --skip-part2 (issue 27: "
                        "the 8B decode step under both attention kernels) -> attention.json, decode.log.")
    p.add_argument("--compile-cache", type=Path, default=None,
                   help="A compile-cache.tar.gz from an earlier call's OUT: unpacked into the shared caches first.")
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    start = time.time()
    deadline = start + a.budget
    out, work = a.out, a.workdir
    out.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    py = sys.executable
    base = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1", **use_compile_cache(a.compile_cache, work / "compile-cache")}
    samples = a.samples or (24 if a.smoke else 192)
    smoke = ["--smoke"] if a.smoke else []
    machine(out)

    lane_end = start + min(a.lane_a, a.budget - 30)
    gpu1 = {} if a.smoke else {"CUDA_VISIBLE_DEVICES": "1"}
    gpu0 = {} if a.smoke else {"CUDA_VISIBLE_DEVICES": "0"}
    lane1_modes = [m for m in a.lane1_modes.split(",") if m]
    lane0_modes = [m for m in a.modes.split(",") if m and m not in lane1_modes]

    def prepared() -> bool:
        marker = work / "prepared.json"
        return marker.is_file() and ("fixed" not in lane1_modes or json.loads(marker.read_text()).get("fixed"))

    def lane1() -> None:
        """GPU 1: the decode bench, make test-gpu, lane 1's train_real_loop modes, then (time left,
        data ready) the 1-process --online baseline."""
        if a.decode:
            smoke_env = {"TRITON_INTERPRET": "1"} if a.smoke else {}
            run_logged("decode", [py, "-m", "bench.gpu_decode", "--attention", "sdpa,triton", "--skip-part2",
                                  "--json", str(out / "attention.json"), *smoke],
                       {**base, **gpu1, **smoke_env}, min(300.0, lane_end - time.time()), work / "logs" / "decode.log")
        if a.tests == "make":
            cmd = ["make", "test-gpu", f"PY={py}"] if shutil.which("make") else [
                py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "--durations=0", "tests/gpu/test_gpu.py"]
            run_logged("test-gpu", cmd, {**base, **gpu1, "PYTEST_ADDOPTS": "-vv -rA"}, lane_end - time.time(),
                       out / "test_gpu.log")
        if lane1_modes:
            while lane_end - time.time() > 60 and not prepared():
                time.sleep(2)
            run_logged("train_real_loop-gpu1", [py, "-m", "bench.train_real_loop", "--workdir", str(work), "--out",
                                                str(work / "lane1"), "--samples", str(samples), "--epochs", "3",
                                                "--modes", ",".join(lane1_modes), "--deadline", str(lane_end - 20),
                                                *smoke],
                       {**base, **gpu1}, lane_end - time.time(), work / "logs" / "lane1.log")
        while "online1" in a.parts and lane_end - time.time() > 100 and not prepared():
            time.sleep(2)
        if "online1" in a.parts and lane_end - time.time() > 100:
            run_logged("online1", [py, "-m", "bench.multi_gpu_scaling", "--workdir", str(work), "--out", str(work / "online1"),
                                   "--nproc", "1", "--samples", str(samples), "--parts", "online1", "--extract-data", "v",
                                   "--deadline", str(lane_end - 20), *smoke],
                       {**base, **gpu1}, lane_end - time.time(), work / "logs" / "online1-lane.log")

    lanes = [threading.Thread(target=lane1)]
    if lane0_modes:
        lanes.append(threading.Thread(target=run_logged, args=(
            "train_real_loop", [py, "-m", "bench.train_real_loop", "--workdir", str(work), "--out", str(out), "--samples",
                                str(samples), "--epochs", "3", "--modes", ",".join(lane0_modes),
                                "--deadline", str(lane_end - 20), *smoke, *(["--prepare-fixed"] * ("fixed" in lane1_modes))],
            {**base, **gpu0}, lane_end - time.time(), work / "logs" / "lane0.log")))
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    if lane1_modes:
        merge_lanes(out / "train_real_loop.json", work / "lane1" / "train_real_loop.json")

    phase_b = [x for x in a.parts.split(",") if x and x != "online1"]
    if phase_b:
        run_logged("multi_gpu_scaling", [py, "-m", "bench.multi_gpu_scaling", "--workdir", str(work), "--out", str(out),
                                         "--samples", str(samples), "--epochs", "3",
                                         *(["--extract-data", "e", "--extract-samples", str(a.extract_samples)]
                                           if a.extract_samples else ["--extract-data", "v"]),
                                         "--train-baseline", str(out / "train_real_loop.json"),
                                         "--parts", ",".join(phase_b),
                                         "--deadline", str(deadline - 40), *smoke],
                   base, deadline - 12 - time.time(), work / "logs" / "scaling.log")
    TIMES["total"] = round(time.time() - start, 1)
    text = summary(out, work / "logs")
    (out / "summary.txt").write_text(text)
    print(text)
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for f in sorted((work / "logs").glob("*.log")):
            if f.stat().st_size < 4 << 20:
                tar.add(f, arcname=f.name)
    print(save_compile_cache(work / "compile-cache", out / "compile-cache.tar.gz"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
