"""The drafter's training attention in its two forms, side by side (issue 27: the real loop within
10% of the fixed-shape step): eagle/train/doc_attention.py's grid (each pack's documents gathered into
[B, Lmax], one causal SDPA, cuDNN's kernel on the H200) and its varlen form (the pack as it lies,
torch's variable-length flash attention, one causal sequence per document). Both carry the draft
blocks' diagonal as anchor keys. A pack of real rows (B documents of 1024-2048 tokens) pays the
grid's B x Lmax cells where the fixed 4 x 2047 pack fills [4, 2048] exactly; varlen pays each
document's own triangle.

    python -m bench.doc_attention_forms --out $OUT     # on a GPU (about a minute, no drafter)
    python -m bench.doc_attention_forms --smoke        # tiny shapes on the CPU: the grid only

For the fixed pack and the real-loop packs of each document count (bench/train_step_kernels'
rows: 1,000 rows of 1024-2048 tokens, eagle's packing to 8188 tokens, widths rounded to 256), per
form: forward + backward ms of the three attention calls of a ttt-3 step (0, 1 and 2 earlier draft
blocks; 32 query heads on 4 kv heads of 64, bf16, eager; the loss's gradient on the real tokens
only, as the padding tokens carry none), the attention kernels' and all kernels' device ms
(torch.profiler), and the largest difference between the forms' outputs and gradients on the real
tokens against their largest magnitude. Writes
OUT/doc_attention_forms.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

from bench.harness import bench_device, kernel_profile, timed, write_json
from bench.shapes import row_lengths


class _Module(torch.nn.Module):
    """What the attention reads off transformers' attention module."""

    num_key_value_groups = 8
    is_causal = True


def packs(rows: int, budget: int) -> dict[str, list[int]]:
    """The fixed pack and, for each document count B the real loop makes, its first pack: name ->
    document lengths (shifted: a row of n tokens trains n - 1)."""
    from eagle.train import dataset

    lengths = row_lengths(rows, 2048)
    out = {"fixed 4 x 2047": [2047] * 4}
    for pack in dataset.pack_batches(list(range(rows)), lengths, budget, seed=0):
        docs = [min(lengths[i] - 1, budget) for i in pack]
        out.setdefault(f"real, {len(docs)} documents", docs)
    return out


def fwd_bwd(form: str, docs: list[int], total: int, steps: int, dev: torch.device, dtype: torch.dtype,
            heads: tuple[int, int, int] = (32, 4, 64), seed: int = 0) -> tuple[Any, dict[str, torch.Tensor]]:
    """(a call running forward + backward, the output and q/k/v gradients of one run on the real tokens)."""
    from eagle.train import doc_attention

    h, hkv, d = heads
    g = torch.Generator().manual_seed(seed)
    lay = {k: v.to(dev) for k, v in doc_attention.layout(docs, 256, total).items()}
    q = torch.randn(1, h, total, d, generator=g).to(dev, dtype).requires_grad_()
    k = torch.randn(1, hkv, (steps + 1) * total, d, generator=g).to(dev, dtype).requires_grad_()
    v = torch.randn(1, hkv, (steps + 1) * total, d, generator=g).to(dev, dtype).requires_grad_()
    real = lay["doc_index"][lay["doc_mask"]]
    grad = torch.zeros(1, total, h, d, device=dev, dtype=dtype)  # the pack's padding tokens carry no loss
    grad[0, real] = torch.randn(len(real), h, d, generator=g).to(dev, dtype)

    def run() -> torch.Tensor:
        with doc_attention.forced(form == "varlen"):
            out, _ = doc_attention.doc_sdpa(_Module(), q, k, v, None, **lay, scaling=d ** -0.5)
        out.backward(grad)
        return out.detach()

    out = run()
    rows = torch.cat([real + j * total for j in range(steps + 1)])
    result = {"out": out[0, real].float(), "dq": q.grad[0][:, real].float(),  # type: ignore[index]
              "dk": k.grad[0][:, rows].float(), "dv": v.grad[0][:, rows].float()}  # type: ignore[index]
    return run, result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the code, measures nothing")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write doc_attention_forms.json here [$OUT]")
    p.add_argument("--rows", type=int, default=1000, help="rows the real packs are made of")
    p.add_argument("--iters", type=int, default=20, help="timed runs of each (median)")
    a = p.parse_args(argv)
    dev = bench_device(a.smoke)
    if dev is None:
        return 1
    from eagle.train import doc_attention

    cuda = dev.type == "cuda"
    budget = 4 * 2047
    chosen = {"smoke": [30, 20, 9]} if a.smoke else packs(a.rows, budget)
    total = 64 if a.smoke else budget
    heads = (4, 2, 16) if a.smoke else (32, 4, 64)
    dtype = torch.bfloat16 if cuda else torch.float32
    probe = torch.empty(1, 1, 1, heads[2], device=dev, dtype=dtype)
    forms = ["grid"] + (["varlen"] if doc_attention.varlen_available(probe, 2) else [])
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                              "device": torch.cuda.get_device_name(dev) if cuda else "cpu (smoke)",
                              "heads": heads, "tokens": total, "forms": forms, "packs": []}
    print(f"{'pack':22s} {'grid cells':>10s} " + " ".join(f"{f + ' ms':>10s}" for f in forms)
          + f" {'varlen/grid':>11s} {'worst diff':>10s}", flush=True)
    for name, docs in chosen.items():
        row: dict[str, Any] = {"pack": name, "documents": docs,  # the grid's cells: doc_attention.layout's
                               "grid_cells": doc_attention.layout(docs, 256, total)["doc_mask"].numel()}
        ms: dict[str, float] = {}
        kernels: dict[str, float] = {}  # the flash / cuDNN kernels alone (torch.profiler)
        device: dict[str, float] = {}  # every kernel of the three calls
        outputs: dict[str, list[dict[str, torch.Tensor]]] = {}
        for form in forms:
            calls = [fwd_bwd(form, docs, total, steps, dev, dtype, heads) for steps in range(3)]
            outputs[form] = [c[1] for c in calls]
            ms[form] = 1000 * timed(lambda calls=calls: [c[0]() for c in calls], dev, 3 if a.smoke else a.iters)
            if cuda:
                prof = kernel_profile(lambda calls=calls: [c[0]() for c in calls], dev)
                kernels[form] = prof["by_category_ms"].get("attention", 0.0)
                device[form] = prof["device_ms"]
        row["ms"], row["attention_kernel_ms"], row["device_ms"] = ms, kernels, device
        worst = 0.0
        if len(forms) == 2:
            for ref, new in zip(outputs["grid"], outputs["varlen"], strict=True):
                for key in ref:
                    scale = float(ref[key].abs().max()) or 1.0
                    worst = max(worst, float((ref[key] - new[key]).abs().max()) / scale)
            row["worst_relative_diff"] = worst
        result["packs"].append(row)
        ratio = f"{ms['varlen'] / ms['grid']:11.3f}" if "varlen" in ms else f"{'-':>11s}"
        print(f"{name:22s} {row['grid_cells']:10d} " + " ".join(f"{ms[f]:10.3f}" for f in forms)
              + f" {ratio} {worst:10.2e}" + "".join(f"; {f}: kernels {kernels[f]:.3f} of device {device[f]:.3f} ms"
                                                    for f in kernels), flush=True)
        write_json(a.out, "doc_attention_forms.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
