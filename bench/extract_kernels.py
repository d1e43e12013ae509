"""Extraction's gap to the roofline, variant by variant (issue 27: extraction compute >= 80% of it).

    python -m bench.extract_kernels --out $OUT      # on the H200: the 1.1B Llama shape, ~4 min
    python -m bench.extract_kernels --smoke          # tiny shapes on the CPU (a check of the code)

The capture engine (eagle/data/capture.py, compute only: no copy to the host, no files) on
bench/gpu_throughput's 1.1B Llama target (random bf16 weights, aux layers 2, 11, 19 + the pre-norm
last layer, rows of 2048 tokens) for each variant of `--variants`:
- `layers`: each decoder layer compiled on its own (the hooks outside the graphs);
- `decoder`: the whole capture compiled as one graph (hidden_capture's scope "decoder"; the rope
  tables made outside it);
- `decoder-graphs`: the same replayed as CUDA graphs (one per batch shape);
- `decoder-graphs-rope-in`: the same with the rope tables made inside the graph (as before
  2026-12-01: Inductor recomputes them in every layer's rope kernel);
- `decoder-32k`: the same as `decoder` on batches of 32k tokens instead of 16k.
Per variant: tok/s over `--rows` rows after a warm-up (compilation) pass, with the SM clock and the
board power meanwhile, as a fraction of two rooflines (decoder FLOPs,
bench/gpu_throughput.target_flops_per_token, over a bf16 matmul rate): the burst rate (10 n^3
products, the boost clock: the figures before 2026-12-01) and the held rate (products back to back
for 2 s, timed over the second: the clock the card's power cap allows a long job; measured again
after the variants); then a kernel profile of 3 batches: device ms a batch by category (matmul,
attention, Inductor's fused kernels, other), the batch's wall ms, the gap between them, the host's
launch ms (the forward's Python, no waiting) and the top kernels. Writes OUT/extract_kernels.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

from bench.harness import (
    Clocks,
    bench_device,
    kernel_profile,
    matmul_rate,
    sustained_matmul_rate,
    sync,
    write_json,
)
from bench.shapes import SMOKE, TARGET_1B, random_target, target_flops_per_token

VARIANTS = {  # name: (compile scope, CUDA graphs, rows per batch, rope tables made inside the graph)
    "layers": ("layers", False, 8, False),
    "decoder": ("decoder", False, 8, False),
    "decoder-graphs": ("decoder", True, 8, False),
    "decoder-graphs-rope-in": ("decoder", True, 8, True),
    "decoder-32k": ("decoder", False, 16, False),
}


def measure(model: Any, variant: str, rows: list[list[int]], layer_ids: list[int], dev: torch.device,
            smoke: bool) -> dict[str, Any]:
    from eagle.data import capture as hc

    scope, graphs, per_batch, rope_in_graph = VARIANTS[variant]
    seq = len(rows[0])
    batches = hc.plan_buckets([seq] * len(rows), range(len(rows)), per_batch * seq, 64)
    torch._dynamo.reset()
    cap = hc.HiddenCapture(model, layer_ids)
    try:
        if not smoke:
            if scope == "layers":
                cap.compile_layers()
            else:
                cap.compile_decoder(graphs=graphs, rope_in_graph=rope_in_graph)
        pipe = hc.CapturePipeline(cap, dev, pad_multiple=64)
        t0 = time.perf_counter()
        pipe.run(rows, batches[:2])  # the compile
        warm = time.perf_counter() - t0
        with Clocks(dev) as clk:
            st = pipe.run(rows, batches)
        x = hc.padded_input(rows, batches[0], 64).to(dev)
        sync(dev)
        t0 = time.perf_counter()
        cap.run(x)
        host_ms = (time.perf_counter() - t0) * 1000
        prof = kernel_profile(lambda: cap.run(x), dev) if dev.type == "cuda" else None
    finally:
        cap.uncompile()
        cap.close()
    tokens = per_batch * seq
    return {"variant": variant, "scope": scope, "cuda_graphs": graphs, "batch_tokens": tokens,
            "warmup_s": round(warm, 1), "tok_s": st.tok_s, "batch_ms": tokens / st.tok_s * 1000,
            "host_launch_ms": round(host_ms, 2), "clocks": clk.summary(),
            "profile": prof}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the code, measures nothing")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write extract_kernels.json here [$OUT]")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--rows", type=int, default=384,
                   help="2048-token rows timed per variant (384: ~3 s, long enough for the clock to settle)")
    a = p.parse_args(argv)
    dev = bench_device(a.smoke)
    if dev is None:
        return 1
    variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    shape = SMOKE if a.smoke else TARGET_1B
    seq = 64 if a.smoke else 2048
    n = shape["num_hidden_layers"]
    layer_ids = [2, n // 2, n - 3]
    model = random_target(shape, dev, torch.float32 if a.smoke else torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, shape["vocab_size"], (32 if a.smoke else a.rows, seq), generator=g).tolist()
    n = 512 if a.smoke else 8192
    matmul = matmul_rate(dev, n)
    held_s = 0.2 if a.smoke else 2.0
    held, held_clocks = sustained_matmul_rate(dev, n, held_s)
    flops = target_flops_per_token(shape, seq)
    roof, roof_held = matmul / flops, held / flops
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)",
                              "shape": shape, "seq": seq, "matmul_tflops": round(matmul / 1e12, 1),
                              "matmul_sustained_tflops": round(held / 1e12, 1), "matmul_sustained_clocks": held_clocks,
                              "gflop_per_token": round(flops / 1e9, 3), "roofline_tok_s": roof,
                              "roofline_sustained_tok_s": roof_held, "runs": []}
    print(f"bf16 matmul {matmul / 1e12:.1f} TFLOP/s in a burst, {held / 1e12:.1f} held {held_s:g} s "
          f"({Clocks.text(held_clocks)}); {flops / 1e9:.2f} GFLOP/token; roofline {roof:,.0f} tok/s (burst), "
          f"{roof_held:,.0f} (held)", flush=True)
    for v in variants:
        try:
            r = measure(model, v, rows, layer_ids, dev, a.smoke)
        except Exception as e:  # noqa: BLE001 - keep measuring the other variants
            r = {"variant": v, "error": f"{type(e).__name__}: {e}"[:400]}
            print(f"[{v}] FAILED {r['error']}", flush=True)
        else:
            r["of_roofline"] = r["tok_s"] / roof
            r["of_roofline_sustained"] = r["tok_s"] / roof_held
            prof = r["profile"] or {"by_category_ms": {}, "device_ms": 0.0, "kernels": 0, "top": []}  # none on a CPU
            cats = ", ".join(f"{k} {ms:.2f}" for k, ms in prof["by_category_ms"].items())
            print(f"[{v}] {r['tok_s']:,.0f} tok/s = {r['of_roofline']:.1%} of the burst roofline, "
                  f"{r['of_roofline_sustained']:.1%} of the held one ({Clocks.text(r['clocks'])}); batch {r['batch_ms']:.2f} "
                  f"ms, device {prof['device_ms']:.2f} ms ({prof['kernels']} kernels; {cats}), gap "
                  f"{r['batch_ms'] - prof['device_ms']:.2f} ms; host launch {r['host_launch_ms']:.2f} ms; "
                  f"warm-up {r['warmup_s']} s", flush=True)
            for t in prof["top"][:8]:
                print(f"    {t['ms']:7.3f} ms {t['calls']:4d} x  {t['kernel']}", flush=True)
        result["runs"].append(r)
        write_json(a.out, "extract_kernels.json", result)
    after, after_clocks = sustained_matmul_rate(dev, n, held_s)
    result.update(matmul_sustained_after_tflops=round(after / 1e12, 1), matmul_sustained_after_clocks=after_clocks)
    write_json(a.out, "extract_kernels.json", result)
    print(f"bf16 matmul held {held_s:g} s after the variants: {after / 1e12:.1f} TFLOP/s ({Clocks.text(after_clocks)})",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
