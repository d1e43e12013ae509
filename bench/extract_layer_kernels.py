"""One extraction layer's kernels, library by library (issue 27: extraction compute >= 80% of its roofline).

    python -m bench.extract_layer_kernels --out $OUT     # on the H200: the 1.1B Llama layer, 16k tokens, ~2 min
    python -m bench.extract_layer_kernels --smoke         # tiny shapes on the CPU (a check of the code)

bench/extract_kernels.py profiles the whole capture: the GEMMs (cuBLAS) and cuDNN's attention take
most of its time, and the memory-bound glue between them (SiLU-multiply, RMSNorm, residual adds,
rope) the rest. This bench asks what each part of one decoder layer costs with each kernel library
that can run it, on bench/gpu_throughput's 1.1B Llama shape (hidden 2048, MLP 5632, 32 heads of 64,
4 KV heads) at 8 rows of 2048 tokens:
- cuBLAS (torch's matmul): q, k, v apart and fused, o, gate and up apart and fused, down;
- torch.compile'd glue: SiLU-multiply, residual add, RMSNorm, residual add + RMSNorm, rope;
- attention: SDPA (cuDNN, flash), torch's varlen flash, and FlashAttention 4 (flash_attn.cute) where
  it is installed;
- QuACK (quack-kernels, CuTe DSL) where it is installed: its GEMM, the gate/up GEMM with the SwiGLU in
  its epilogue, and o / down GEMMs with the residual add in theirs.
Per row: ms a call (CUDA events over back-to-back calls), TFLOP/s where it is a product, the worst
relative difference against torch's own result. Then the layer by the fastest choice of each part
against the layer as `eagle extract` runs it now (the compiled HF layer, timed whole), times the
layer count, against the batch time that 80% of the roofline allows. Writes OUT/extract_layer_kernels.json.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench.harness import Clocks, bench_device, matmul_rate, per_call_ms, write_json
from bench.shapes import SMOKE, TARGET_1B, random_target, target_flops_per_token


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


class Bench:
    def __init__(self, dev: torch.device, iters: int) -> None:
        self.dev, self.iters, self.rows = dev, iters, []
        self.clocks = Clocks(dev)

    def add(self, part: str, lib: str, fn: Callable[[], Any], flops: float = 0.0,
            want: torch.Tensor | None = None, got: Callable[[Any], torch.Tensor] | None = None,
            iters: int | None = None) -> float | None:
        try:
            out = fn()
            err = rel_err(got(out) if got else out, want) if want is not None else None
            with self.clocks as clk:
                ms = per_call_ms(fn, self.dev, iters or self.iters)
        except Exception as e:  # noqa: BLE001 - a library that cannot run a part is a row, not a crash
            self.rows.append({"part": part, "lib": lib, "error": f"{type(e).__name__}: {e}"[:300]})
            print(f"{part:<28} {lib:<26} FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
            return None
        row = {"part": part, "lib": lib, "ms": ms, "tflops": flops / ms / 1e9 if flops else None, "rel_err": err,
               "clocks": clk.summary()}
        self.rows.append(row)
        tf = f"{row['tflops']:7.1f}" if flops else "      -"
        clock = f"  {clk.describe()}" if row["clocks"] else ""
        print(f"{part:<28} {lib:<26} {ms:8.3f} ms {tf} TFLOP/s  err {'-' if err is None else f'{err:.1e}'}{clock}",
              flush=True)
        return ms

    def best(self, part: str, libs: tuple[str, ...] | None = None) -> tuple[float, str] | None:
        got = [(r["ms"], r["lib"]) for r in self.rows
               if r["part"] == part and "ms" in r and (libs is None or r["lib"] in libs)]
        return min(got) if got else None


def optional(name: str) -> Any:  # noqa: ANN401 - a module or None
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - absent or unusable here: report and go on
        print(f"({name} not usable here: {type(e).__name__}: {str(e)[:200]})", flush=True)
        return None


def layer_parts(b: Bench, shape: dict[str, int], rows: int, seq: int, dtype: torch.dtype) -> None:
    dev = b.dev
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    nh, nkv = shape["num_attention_heads"], shape["num_key_value_heads"]
    hd = h // nh
    m = rows * seq
    g = torch.Generator(device=dev).manual_seed(0)

    def w(o: int, i: int) -> torch.Tensor:
        return (torch.randn(o, i, device=dev, dtype=dtype, generator=g) / i ** 0.5).contiguous()

    x = torch.randn(m, h, device=dev, dtype=dtype, generator=g)
    res = torch.randn(m, h, device=dev, dtype=dtype, generator=g)
    wq, wk, wv, wo = w(h, h), w(nkv * hd, h), w(nkv * hd, h), w(h, h)
    wg, wu, wd = w(inter, h), w(inter, h), w(h, inter)
    wqkv, wgu = torch.cat([wq, wk, wv]), torch.cat([wg, wu])
    act = torch.randn(m, inter, device=dev, dtype=dtype, generator=g)

    def fl(n_out: int, n_in: int) -> float:
        return 2.0 * m * n_out * n_in

    # ---- cuBLAS
    b.add("q", "cublas", lambda: F.linear(x, wq), fl(h, h))
    b.add("k+v (apart)", "cublas", lambda: (F.linear(x, wk), F.linear(x, wv)), fl(2 * nkv * hd, h))
    qkv_ref = F.linear(x, wqkv)
    b.add("qkv", "cublas", lambda: F.linear(x, wqkv), fl(h + 2 * nkv * hd, h))
    b.add("o", "cublas", lambda: F.linear(x, wo), fl(h, h))
    o_res_ref = res + F.linear(x, wo)
    b.add("o + residual", "cublas addmm", lambda: torch.addmm(res, x, wo.t()), fl(h, h), o_res_ref)
    b.add("gate+up (apart)", "cublas", lambda: (F.linear(x, wg), F.linear(x, wu)), fl(2 * inter, h))
    gu_ref = F.linear(x, wgu)
    b.add("gate_up", "cublas", lambda: F.linear(x, wgu), fl(2 * inter, h))
    swiglu_ref = F.silu(gu_ref[:, :inter].float()).mul(gu_ref[:, inter:].float()).to(dtype)
    b.add("down", "cublas", lambda: F.linear(act, wd), fl(h, inter))
    down_res_ref = res + F.linear(act, wd)
    b.add("down + residual", "cublas addmm", lambda: torch.addmm(res, act, wd.t()), fl(h, inter), down_res_ref)

    # ---- the glue, compiled as `eagle extract` compiles it
    norm_w = torch.ones(h, device=dev, dtype=dtype)

    def rms(t: torch.Tensor) -> torch.Tensor:
        v = t.float()
        return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype) * norm_w

    compile_ = (lambda f: f) if dev.type != "cuda" else torch.compile
    silu_mul = compile_(lambda gu: F.silu(gu[:, :inter]) * gu[:, inter:])
    add = compile_(lambda a, r: a + r)
    norm = compile_(rms)
    add_norm = compile_(lambda a, r: (a + r, rms(a + r)))
    b.add("silu*mul", "torch.compile", lambda: silu_mul(gu_ref), 0.0, swiglu_ref)
    b.add("residual add", "torch.compile", lambda: add(x, res))
    b.add("rmsnorm", "torch.compile", lambda: norm(x))
    b.add("residual add + rmsnorm", "torch.compile", lambda: add_norm(x, res))

    # ---- attention: [rows, seq, heads, hd]
    q = torch.randn(rows, seq, nh, hd, device=dev, dtype=dtype, generator=g)
    k = torch.randn(rows, seq, nkv, hd, device=dev, dtype=dtype, generator=g)
    v = torch.randn(rows, seq, nkv, hd, device=dev, dtype=dtype, generator=g)
    attn_flops = 4.0 * rows * nh * hd * seq * (seq + 1) / 2  # causal: the lower triangle
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    rep = nh // nkv
    kr, vr = kt.repeat_interleave(rep, 1), vt.repeat_interleave(rep, 1)
    ref = F.scaled_dot_product_attention(qt.float(), kr.float(), vr.float(), is_causal=True) if dev.type != "cuda" \
        else None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in (("sdpa cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa math", SDPBackend.MATH)):
        if dev.type == "cuda" and backend == SDPBackend.MATH:
            continue

        def run(backend: Any = backend) -> torch.Tensor:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kr, vr, is_causal=True)

        got = b.add("attention (causal)", name, run, attn_flops)
        if got is not None and ref is None:
            with sdpa_kernel(backend):
                ref = F.scaled_dot_product_attention(qt, kr, vr, is_causal=True)
    if dev.type == "cuda":
        from eagle.train import doc_attention as da

        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401 - torch >= 2.9
        except ImportError:
            pass
        else:
            cu = torch.arange(0, (rows + 1) * seq, seq, device=dev, dtype=torch.int32)
            qf, kf, vf = q.reshape(-1, nh, hd), k.reshape(-1, nkv, hd), v.reshape(-1, nkv, hd)
            b.add("attention (causal)", "torch varlen flash",
                  lambda: da._varlen(qf, kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1), cu, seq,
                                     hd ** -0.5),
                  attn_flops, ref.transpose(1, 2).reshape(-1, nh, hd) if ref is not None else None)
        fa4 = optional("flash_attn.cute")
        if fa4 is not None:
            b.add("attention (causal)", "flash_attn.cute (FA4)", lambda: fa4.flash_attn_func(q, k, v, causal=True),
                  attn_flops, ref.transpose(1, 2) if ref is not None else None,
                  lambda o: o[0] if isinstance(o, tuple) else o)

    # ---- QuACK
    quack = optional("quack.gemm_interface") if dev.type == "cuda" else None
    if quack is not None:
        b.add("q", "quack", lambda: quack.gemm(x, wq.t(), tuned=False), fl(h, h))
        b.add("qkv", "quack", lambda: quack.gemm(x, wqkv.t(), tuned=False), fl(h + 2 * nkv * hd, h), qkv_ref)
        b.add("o", "quack", lambda: quack.gemm(x, wo.t(), tuned=False), fl(h, h))
        b.add("o + residual", "quack gemm_add", lambda: quack.gemm_add(x, wo.t(), res, tuned=False), fl(h, h), o_res_ref)
        b.add("gate_up", "quack", lambda: quack.gemm(x, wgu.t(), tuned=False), fl(2 * inter, h), gu_ref)
        b.add("gate_up + swiglu", "quack gemm_act swiglu",
              lambda: quack.gemm_act(x, wgu.t(), activation="swiglu", store_preact=False, concat_layout=("B",),
                                     tuned=False),
              fl(2 * inter, h), swiglu_ref, lambda o: o[1])
        from quack.gemm_config import GemmConfig

        for tm, tn, ping, cl in ((128, 192, True, (2, 1)), (128, 128, True, (2, 1)), (256, 128, False, (2, 1)),
                                 (256, 160, False, (1, 2)), (128, 256, False, (2, 1))):
            cfg = GemmConfig(tile_m=tm, tile_n=tn, pingpong=ping, cluster_m=cl[0], cluster_n=cl[1],
                             is_dynamic_persistent=False, device_capacity=9)
            b.add("gate_up + swiglu", f"quack swiglu {tm}x{tn}{'p' if ping else 'c'}{cl[0]}{cl[1]}",
                  lambda cfg=cfg: quack.gemm_act(x, wgu.t(), activation="swiglu", store_preact=False,
                                                 concat_layout=("B",), config=cfg),
                  fl(2 * inter, h), swiglu_ref, lambda o: o[1])
        b.add("down", "quack", lambda: quack.gemm(act, wd.t(), tuned=False), fl(h, inter))
        b.add("down + residual", "quack gemm_add", lambda: quack.gemm_add(act, wd.t(), res, tuned=False), fl(h, inter),
              down_res_ref)


def whole_layer(b: Bench, shape: dict[str, int], rows: int, seq: int, dtype: torch.dtype, matmul_n: int) -> None:
    """The HF decoder layer as `eagle extract` runs it (compiled on the GPU), timed whole: one layer over
    and over, then all the target's layers in turn (each its own weights), then the capture engine
    itself, each briefly and sustained (~1 s), beside the n^3 matmul briefly and sustained: where the
    capture's batch goes beyond its layers' sum, and what a sustained load does to the clock."""
    from eagle.data import capture as hc

    model = random_target(shape, b.dev, dtype)
    layers = model.model.layers
    x = torch.randn(rows, seq, shape["hidden_size"], device=b.dev, dtype=dtype)
    pos = torch.arange(seq, device=b.dev).expand(rows, -1)
    mat = torch.randn(matmul_n, matmul_n, device=b.dev, dtype=dtype)
    mm_flops = 2.0 * matmul_n ** 3
    b.add("matmul n^3", "cublas, 10 calls", lambda: mat @ mat, mm_flops, iters=10)
    cap = hc.HiddenCapture(model, [2, len(layers) // 2, len(layers) - 3])
    try:
        pe = model.model.rotary_emb(x, pos)
        if b.dev.type == "cuda":
            cap.compile_layers()

        def all_layers() -> torch.Tensor:
            h = x
            for layer in layers:
                h = layer(h, position_embeddings=pe, attention_mask=None)
                h = h[0] if isinstance(h, tuple) else h
            return h

        ids = torch.randint(0, shape["vocab_size"], (rows, seq), device=b.dev)
        b.add("whole layer", "HF layer, torch.compile", lambda: layers[0](x, position_embeddings=pe,
                                                                          attention_mask=None))
        b.add("all layers in turn", "HF layers, torch.compile", all_layers, iters=3)
        b.add("capture (a batch)", "HiddenCapture layers", lambda: cap.run(ids), iters=3)
        burst_layers = b.rows[-2].get("ms")
        sustained = max(3, int(1000 / burst_layers)) if burst_layers else 3
        b.add("capture (a batch)", "HiddenCapture, sustained", lambda: cap.run(ids), iters=sustained)
        b.add("matmul n^3", "cublas, sustained", lambda: mat @ mat, mm_flops, iters=max(10, int(1000 / 1.5)))
    finally:
        cap.uncompile()
        cap.close()


def plan(b: Bench, layers: int) -> dict[str, Any]:
    """The layer by its fastest parts, two ways: as the HF layer's ops (apart GEMMs + compiled glue +
    attention) and with the fused choices; ms a layer."""
    def ms(part: str, libs: tuple[str, ...] | None = None) -> float:
        got = b.best(part, libs)
        return got[0] if got else float("nan")

    now = (ms("rmsnorm", ("torch.compile",)) + ms("q", ("cublas",)) + ms("k+v (apart)") + ms("attention (causal)")
           + ms("o", ("cublas",)) + ms("residual add + rmsnorm") + ms("gate+up (apart)") + ms("silu*mul")
           + ms("down", ("cublas",)) + ms("residual add"))
    mlp = [t for t in (ms("gate_up + swiglu"), ms("gate_up") + ms("silu*mul")) if t == t]  # nan: not run
    fused = (ms("rmsnorm") + ms("qkv") + ms("attention (causal)") + ms("o + residual") + ms("rmsnorm")
             + min(mlp, default=float("nan")) + ms("down + residual"))
    return {"parts_now_ms": now, "parts_fused_ms": fused, "layers": layers,
            "batch_now_ms": now * layers, "batch_fused_ms": fused * layers}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the code, measures nothing")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write extract_layer_kernels.json here [$OUT]")
    p.add_argument("--rows", type=int, default=8, help="rows of --seq tokens a batch (extraction's 16k tokens)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--iters", type=int, default=20, help="back-to-back calls timed per row")
    a = p.parse_args(argv)
    dev = bench_device(a.smoke)
    if dev is None:
        return 1
    shape = SMOKE if a.smoke else TARGET_1B
    rows, seq = (2, 64) if a.smoke else (a.rows, a.seq)
    dtype = torch.float32 if a.smoke else torch.bfloat16
    matmul = matmul_rate(dev, 512 if a.smoke else 8192)
    flops = target_flops_per_token(shape, seq)
    batch_80 = rows * seq * flops / matmul * 1000 / 0.8  # ms a batch may take at 80% of the roofline
    print(f"bf16 matmul {matmul / 1e12:.1f} TFLOP/s; {flops / 1e9:.2f} GFLOP/token; a batch of {rows * seq} tokens: "
          f"roofline {batch_80 * 0.8:.2f} ms, 80% of it {batch_80:.2f} ms", flush=True)
    b = Bench(dev, 3 if a.smoke else a.iters)
    with torch.no_grad():
        layer_parts(b, shape, rows, seq, dtype)
        whole_layer(b, shape, rows, seq, dtype, 512 if a.smoke else 8192)
    n = shape["num_hidden_layers"]
    pl = plan(b, n)
    whole = b.best("whole layer")
    print(f"a layer: HF compiled {whole[0] if whole else float('nan'):.3f} ms; its parts at their fastest apart "
          f"{pl['parts_now_ms']:.3f} ms; fused parts {pl['parts_fused_ms']:.3f} ms", flush=True)
    print(f"x {n} layers: HF compiled {n * whole[0] if whole else float('nan'):.2f} ms, fused parts "
          f"{pl['batch_fused_ms']:.2f} ms, 80% of the roofline allows {batch_80:.2f} ms", flush=True)
    write_json(a.out, "extract_layer_kernels.json",
               {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)",
                "shape": shape, "rows": rows, "seq": seq, "matmul_tflops": matmul / 1e12,
                "batch_ms_at_80pct": batch_80, "whole_layer_ms": whole[0] if whole else None, "plan": pl,
                "parts": b.rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
