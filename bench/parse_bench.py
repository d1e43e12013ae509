"""Benchmark: parse + validate a generated 10,000-line plan with 500 phases.

Prints our time next to markdown-it-py's bare parse of the same text (the default CommonMark
parser, inline rules included) and the ratio. Targets: < 300 ms and < 1.5x the bare parse.

`--scale 1000,10000,100000` instead runs the real `runbook validate` (a whole process, as a user
runs it) over generated plans of that many phases (`make_long_plan`: 8 lines each, every phase with a
`Needs:` and an `On pass:` that the flow check walks; 100,000 phases are 22 MB, under the 32 MB a
plan may have) and prints wall, CPU, peak memory and CPU per phase: linear
means the last column stays flat.

    .venv/bin/python -m bench.parse_bench [--phases 500] [--repeat 5]
    .venv/bin/python -m bench.parse_bench --scale 1000,10000,100000
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


def make_long_plan(phases: int) -> str:
    """A plan of `phases` short phases: a step using a var, a criterion, both transitions, a Needs."""
    out = ["---", "runbook: 1", "title: Long plan", "vars:", "  data: work/data", "---", "", "# Long plan", ""]
    for i in range(phases):
        out += [f"## Phase {i}: Step {i} (~1 min)", "Steps:", f"- [ ] Run: `eagle train --data {{data}} --seed {i}`",
                "Pass: `val_loss < 2.5 and accept_len >= 1.5`",
                f"On pass: Phase {i + 1}" if i + 1 < phases else "On pass: stop", "On fail: stop",
                f"Needs: Phase {i - 1}" if i else "Needs: none", ""]
    return "\n".join(out)


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


def scale(sizes: list[int]) -> None:
    """`runbook validate` as a process over plans of each size: wall, CPU (user + system), peak RSS."""
    import os
    import resource
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    runbook = Path(sys.executable).with_name("runbook")
    print(f"{'phases':>8} {'MB':>9} {'wall s':>8} {'cpu s':>8} {'peak MB':>8} {'cpu ms/phase':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            plan = Path(tmp) / f"plan-{n}.md"
            plan.write_text(make_long_plan(n))
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            w0 = time.perf_counter()
            proc = subprocess.run([str(runbook), "validate", str(plan)], capture_output=True, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
            wall = time.perf_counter() - w0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            assert proc.returncode == 0, proc.stderr[-2000:]
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            print(f"{n:>8} {plan.stat().st_size / 1e6:>9.1f} {wall:>8.2f} {cpu:>8.2f} {after.ru_maxrss / 1024:>8.0f} {cpu / n * 1000:>13.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", type=int, default=500)
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--scale", help="comma-separated phase counts: time `runbook validate` over each")
    args = ap.parse_args()
    if args.scale:
        scale([int(n) for n in args.scale.split(",")])
        return

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
