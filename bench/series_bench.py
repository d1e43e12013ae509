"""Metric series at a long run's scale: how long runbook takes to read what a step appended to
$RUNBOOK_SERIES, and how much the ledger keeps (and git then stores) per run.

    .venv/bin/python -m bench.series_bench [--steps 100000]

Writes a step's series file like `eagle train` would (8 values per optimizer step, 6 per validation
every 1,000 steps, smooth curves with noise), reads it with runbook.store.series, saves the compact file
and prints: the raw size, the read time, the points kept, the kept file's size and its gzip size
(about what git stores for it), and the time to draw the PNG of one series.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import tempfile
import time
from pathlib import Path

from runbook.store import series

TRAIN = ["train_loss", "train_loss_0", "train_loss_1", "train_loss_2", "train_acc_0", "train_acc_1", "train_acc_2", "lr"]
VAL = ["val_loss", "val_accept_len", "val_acc_0", "val_acc_1", "val_acc_2", "train_tok_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        raw = root / "step-1.series.jsonl"
        with open(raw, "w") as f:
            for i in range(1, args.steps + 1):
                decay = math.exp(-i / (args.steps / 3))
                f.write(json.dumps({"step": i, **{n: 0.1 + decay * (1 + 0.05 * rng.random()) for n in TRAIN}}) + "\n")
                if i % 1000 == 0:
                    f.write(json.dumps({"step": i, **{n: 1 + decay * rng.random() for n in VAL}}) + "\n")
        t0 = time.perf_counter()
        found, problem = series.read_step(raw, "step-1")
        read_s = time.perf_counter() - t0
        kept = series.save(root / "state", "run", found, [problem] if problem else [])
        assert kept is not None
        data = kept.read_bytes()
        from runbook.model import RunRecord
        from runbook.report.plotting import draw, plan_chart

        record = RunRecord(run_id="run", plan="p.md", plan_blob="0", phase="p", phase_label="0", phase_text_hash="0",
                           started="2026-11-30T00:00:00Z", verdict="pass", series=series.summary(found))
        t0 = time.perf_counter()
        draw(plan_chart("train_loss", [record], root / "state"), root / "curve.png", root / "curve.svg")
        draw_s = time.perf_counter() - t0
        print(f"steps {args.steps:,}: raw file {raw.stat().st_size / 1e6:.1f} MB, {len(found)} series, "
              f"read in {read_s:.2f} s ({raw.stat().st_size / 1e6 / read_s:.0f} MB/s)")
        print(f"kept: {sum(len(s.x) for s in found):,} points, {len(data) / 1e3:.1f} KB "
              f"({len(gzip.compress(data)) / 1e3:.1f} KB gzipped, about what git stores)")
        print(f"PNG + SVG of one series: {draw_s:.2f} s, PNG {(root / 'curve.png').stat().st_size / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
