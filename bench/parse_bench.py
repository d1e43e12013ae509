"""Benchmark: parse + validate a generated 10,000-line plan with 500 phases.

Prints our time next to markdown-it-py's bare parse of the same text (the default CommonMark
parser, inline rules included) and the ratio. Targets: < 300 ms and < 1.5x the bare parse.

    .venv/bin/python -m bench.parse_bench [--phases 500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def make_plan(phases: int = 500, lines: int = 10_000) -> str:
    """A plan of `phases` phases padded with prose to exactly `lines` lines."""
    out = [
        "---",
        "runbook: 1",
        "title: Benchmark plan",
        "vars:",
        "  target: work/target",
        "  data: work/data",
        "---",
        "",
        "# Benchmark plan",
        "",
    ]
    per_phase = (lines - len(out)) // phases
    for i in range(phases):
        nxt = f"Phase {i + 1}" if i + 1 < phases else "stop"
        block = [
            f"## Phase {i}: Step number {i} (~{i % 50 + 1} min)",
            "",
            f"Goal of phase {i}: check that *this* works, with `code` and [a link](https://example.org/{i}).",
            "",
            "Steps:",
            f"- [x] Make the target: `eagle toy-target --out {{target}} --seed {i}`",
            "- [ ] Prepare: `eagle prepare --model {target} --data plans/data/prompts.jsonl --out {data}`",
            "- [ ] Train:",
            "  ```sh",
            "  eagle vocab --data {data} --draft-vocab 256",
            "  eagle train --model {target} --data {data} --out work/draft --epochs 2",
            "  ```",
            "",
            "Pass: `accept_len >= 1.5 and (train_loss < 4.0 or step-2.loss <= 3)`",
            f"On pass: {nxt}",
            "On fail: stop",
            f"Needs: Phase {i - 1}" if i else "Needs: none",
            "Timeout: 20m",
            "",
        ]
        while len(block) < per_phase:
            block.insert(3, f"More prose about phase {i}, line {len(block)}: nothing to parse here.")
        out.extend(block[:per_phase] if len(block) > per_phase else block)
    while len(out) < lines:
        out.append("Closing prose.")
    return "\n".join(out[:lines]) + "\n"


def measure(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, tuple[float, float]]:
    """Best wall and CPU time of each function; runs are interleaved so a busy machine hits all alike."""
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    return {name: (min(wall[name]), min(cpu[name])) for name in fns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", type=int, default=500)
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()

    from markdown_it import MarkdownIt

    from runbook.plan.parse import parse_plan

    text = make_plan(args.phases, args.lines)
    plan, problems = parse_plan(text, "bench.md")  # warm-up, and a sanity check
    errors = [p for p in problems if p.severity == "error"]
    assert plan is not None and not errors, errors[:3]
    assert len(plan.phases) == args.phases, len(plan.phases)

    from runbook.plan.parse import _markdown

    md = MarkdownIt()
    ours_md = _markdown()
    results = measure(
        {
            "bare": lambda: md.parse(text),
            "ours": lambda: parse_plan(text, "bench.md"),
            "blocks": lambda: ours_md.parse(text),
        },
        args.repeat,
    )
    (bare_w, bare_c), (ours_w, ours_c), (blk_w, blk_c) = results["bare"], results["ours"], results["blocks"]
    print(f"plan: {text.count(chr(10))} lines, {len(plan.phases)} phases, {sum(len(p.steps) for p in plan.phases)} steps")
    print(f"{'':34} {'wall (best)':>12} {'cpu (best)':>12}")
    print(f"{'markdown-it-py bare parse':34} {bare_w * 1000:9.1f} ms {bare_c * 1000:9.1f} ms")
    print(f"{'runbook parse + validate':34} {ours_w * 1000:9.1f} ms {ours_c * 1000:9.1f} ms")
    print(f"{'  of which markdown-it block pass':34} {blk_w * 1000:9.1f} ms {blk_c * 1000:9.1f} ms")
    print(f"ratio runbook / bare: wall {ours_w / bare_w:.2f}x, cpu {ours_c / bare_c:.2f}x   (targets: < 300 ms, < 1.5x)")

if __name__ == "__main__":
    main()
