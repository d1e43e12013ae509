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
import sys
from pathlib import Path
from typing import Any

from bench.harness import StepTimes
from eagle.train.hooks import observing


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
