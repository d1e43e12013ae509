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


def host_allocs(dev: Any) -> tuple[int, float]:  # noqa: ANN401 - a torch.device; torch imported only here
    """(pinned blocks torch's host allocator has created, ms those cudaHostAlloc calls took) so far
    in this process; (0, 0.0) off CUDA or on a torch without host_memory_stats."""
    import torch

    if dev.type != "cuda" or not hasattr(torch.cuda, "host_memory_stats"):
        return 0, 0.0
    stats = torch.cuda.host_memory_stats()
    return int(stats.get("num_host_alloc", 0)), float(stats.get("host_alloc_time.total", 0)) / 1000
