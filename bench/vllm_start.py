"""What one vLLM server start costs on this host: seconds to /health and CPU seconds of the server's whole
process tree (API server and engine core), started as eagle starts it (eagle.serving.server.running_server,
the toy target, eagle's engine flags for this host), stopped at once, several times.

    python -m bench.vllm_start                    # 5 starts of the Llama toy, vLLM's cache kept between them
    python -m bench.vllm_start --starts 3 --out bench/results

CPU is this process's RUSAGE_CHILDREN after each stop: the server and every process it waited for (its
engine core). The first start may fill vLLM's cache (--cache, default the test suite's); later ones read it.
Prints one table; writes OUT/vllm_start.json (OUT: --out, else $OUT, else nothing).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

from bench.harness import write_json


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--cache", type=Path, default=None, help="VLLM_CACHE_ROOT [default: the test suite's]")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = ap.parse_args()

    from eagle.serving.flags import host_has_cuda, server_spec, vllm_flags
    from eagle.serving.server import free_port, running_server
    from eagle.toy import cache_root, cached_target

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["VLLM_CACHE_ROOT"] = str(args.cache or cache_root() / "vllm")
    target = cached_target()
    rows = []
    for i in range(args.starts):
        spec = server_spec(target, vllm_flags(), host_has_cuda(), port=free_port(), max_model_len=512)
        cpu0, t0 = children_cpu(), time.monotonic()
        with running_server(spec, echo=False) as server:
            healthy = server.startup_s
        rows.append({"start": i, "healthy_s": round(healthy, 2), "cpu_s": round(children_cpu() - cpu0, 2),
                     "wall_s": round(time.monotonic() - t0, 2)})
        print(f"  start {i}: healthy after {healthy:.2f} s, {rows[-1]['cpu_s']:.2f} s of CPU "
              f"({rows[-1]['wall_s']:.2f} s to stopped)", file=sys.stderr, flush=True)
    later = rows[1:] or rows
    summary = {name: round(statistics.median(r[name] for r in later), 2) for name in ("healthy_s", "cpu_s", "wall_s")}
    print("| starts | healthy (s, median) | CPU (s, median) | to stopped (s, median) |")
    print("|---|---|---|---|")
    print(f"| {len(later)} of {len(rows)} (the first left out) | {summary['healthy_s']} | {summary['cpu_s']} | "
          f"{summary['wall_s']} |")
    if args.out:
        write_json(args.out, "vllm_start.json", {"machine": platform.node(), "cpus": os.cpu_count(),
                                                 "target": str(target), "starts": rows, "median": summary})


if __name__ == "__main__":
    main()
