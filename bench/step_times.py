"""Where a step of `eagle train` goes, per rank (issue 24: why 2 GPUs take longer a step than 1).

    torchrun --nproc-per-node 2 -m bench.step_times --out DIR -- train --model T --data D ...
    python -m bench.step_times --out DIR -- train --model T --data D ...          # 1 process

Runs eagle's own CLI (the arguments after `--`, exactly as `eagle` takes them) in this process with
`StepTimes` observing its Trainer (eagle/train/hooks.py: around each backward and optimizer step),
and a comm hook on its DDP wrapper that notes when each gradient bucket is ready, then all-reduces it
as DDP does by default (`allreduce_hook`: the sum over ranks divided by their count). Times come from CUDA events on the
training stream (nothing is synchronised during training; the events are read after it) or, on the
CPU, from the clock. Each rank writes DIR/step-times-rank{R}.json (`summarise` reads them), per
optimizer step:

  compute_ms  forward + backward until the last gradient bucket was ready (1 process: the whole
              backward_step, which is then compute only)
  comm_ms     from there to the end of the backward: the all-reduce plus waiting for the slowest rank
  opt_ms      the optimizer step (clip, AdamW, schedule)
  wall_ms     this step's start to the next one's: everything the loop spent, host gaps included
  grid        the pack's attention grid [documents, width] (shape buckets), to match slow steps to shapes

Used by bench/multi_gpu_scaling.py's train part; `--smoke` there runs it on the CPU over gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from eagle.train.hooks import StepHooks, observing


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python -m bench.step_times --out DIR -- train ARGS... (eagle's arguments)", file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="bench.step_times")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv[:cut])
    from eagle import cli

    times = StepTimes()
    rank = int(os.environ.get("RANK", "0"))
    sys.argv = ["eagle", *argv[cut + 1:]]
    code: Any = 0
    try:
        with observing(times):
            cli.main()
    except SystemExit as e:
        code = e.code
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"step-times-rank{rank}.json").write_text(json.dumps({"rank": rank, "steps": times.rows()}) + "\n")
    return int(code or 0) if not isinstance(code, str) else 1


if __name__ == "__main__":
    sys.exit(main())
