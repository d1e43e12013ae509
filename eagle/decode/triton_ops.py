"""The fast decoder's small fused kernels in Triton (issue 27), used by the layers of a cache whose
attention is "triton" (llama_ops.ATTENTION_KERNELS) beside the split-KV attention of
eagle/decode/triton_attention.py.

Why: on the 8B shape a decode step spent 0.93 ms of its 5.5 ms in 339 small kernels (65 RMSNorms of
5.9 us, rope in three kernels, two cache writes, SiLU and a product per layer): each reads a few KB
and costs a launch slot in the graph. Four kernels replace them and the cycle's bookkeeping:

- `rope_write`: the rope of every query and key head, the key and value written into the cache
  at the rows' slots, and the queries laid out for the attention kernel, in one launch (was five
  kernels, plus a transpose copy in a verify step);
- `rms_norm`: one program a row, float32 statistics, the weight applied before the cast back (as
  torch's fused `F.rms_norm`);
- `silu_mul`: SwiGLU's silu(gate) * up from the fused [gate; up] projection in one launch;
- `accept`: the speculative cycle's bookkeeping after the verify step (the accepted prefix, the
  committed tokens, the next cycle's rows, first token, first draft and feature, the history, n)
  in one launch instead of about twenty (decode.accept_cycle); on the toy target the cycle is made of
  launches of a few us each.

Numerics: `rope_write` rounds `x * cos` to the activation dtype before the addcmul, as
llama_ops.apply_rope does, so in bf16 and fp16 its output equals that path's bit for bit (in fp32
to an FMA's rounding); `silu_mul` rounds silu's output likewise; `rms_norm` sums the squares in
another order than torch (last-bit differences in bf16). All compute in float32, which also keeps them right in Triton's interpreter (it cannot
compute on bf16: triton-lang/triton#11584), where the CPU tests run them (TRITON_INTERPRET=1).
Triton is imported on first use only, as in eagle/decode/triton_attention.py.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from eagle.decode.triton_attention import _interpreting, _pow2

SILU_BLOCK = 1024  # columns of the [T, I] product per program


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


@functools.cache
def _kernels(interpret: bool) -> tuple[Any, Any, Any, Any]:
    """The jitted kernels (triton imported here), compiled or interpreted (see triton_attention)."""
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, o_ptr, keep_ptr, N, sx, so, sk, eps, BLOCK: tl.constexpr, KEEP: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        xin = tl.load(x_ptr + row * sx + cols, mask=ok, other=0.0)
        if KEEP:  # the input itself, copied out (the target's aux state) in the same launch
            tl.store(keep_ptr + row * sk + cols, xin, mask=ok)
        x = xin.to(tl.float32)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
        tl.store(o_ptr + row * so + cols, (x * rstd * w).to(o_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def silu_mul_kernel(gu_ptr, o_ptr, N, sg, so, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < N
        g = tl.load(gu_ptr + row * sg + cols, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * sg + N + cols, mask=ok, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(o_ptr.dtype.element_ty).to(tl.float32)  # F.silu's rounding
        tl.store(o_ptr + row * so + cols, (s * u).to(o_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def rope_write_kernel(qk_ptr, v_ptr, cos_ptr, sin_ptr, slots_ptr, q_ptr, kc_ptr, vc_ptr,
                          T, HQ, HKV, HALF, s_qk_t, s_qk_h, s_v_t, s_v_h, s_cs, s_kc_h, s_kc_s, s_vc_h, s_vc_s,
                          HALF_P: tl.constexpr):
        t = tl.program_id(0)
        h = tl.program_id(1)  # query heads, then key heads, then value heads
        i = tl.arange(0, HALF_P)
        ok = i < HALF
        slot = tl.load(slots_ptr + t)
        dt = q_ptr.dtype.element_ty
        if h < HQ + HKV:
            src = qk_ptr + t * s_qk_t + h * s_qk_h
            x1 = tl.load(src + i, mask=ok, other=0.0).to(tl.float32)
            x2 = tl.load(src + HALF + i, mask=ok, other=0.0).to(tl.float32)
            c1 = tl.load(cos_ptr + slot * s_cs + i, mask=ok, other=0.0).to(tl.float32)  # the tables' row of
            c2 = tl.load(cos_ptr + slot * s_cs + HALF + i, mask=ok, other=0.0).to(tl.float32)  # the slot
            s1 = tl.load(sin_ptr + slot * s_cs + i, mask=ok, other=0.0).to(tl.float32)
            s2 = tl.load(sin_ptr + slot * s_cs + HALF + i, mask=ok, other=0.0).to(tl.float32)
            # apply_rope: addcmul(x * cos, swap_halves(x), sin_signed), x * cos rounded first
            o1 = ((x1 * c1).to(dt).to(tl.float32) + x2 * s1).to(dt)
            o2 = ((x2 * c2).to(dt).to(tl.float32) + x1 * s2).to(dt)
            if h < HQ:  # queries as [HQ, T, D]: the [hkv, g*t, d] rows of the attention kernel
                dst = q_ptr + (h * T + t) * (2 * HALF)
            else:
                dst = kc_ptr + (h - HQ) * s_kc_h + slot * s_kc_s
            tl.store(dst + i, o1, mask=ok)
            tl.store(dst + HALF + i, o2, mask=ok)
        else:
            hv = h - HQ - HKV
            src = v_ptr + t * s_v_t + hv * s_v_h
            dst = vc_ptr + hv * s_vc_h + slot * s_vc_s
            tl.store(dst + i, tl.load(src + i, mask=ok, other=0.0), mask=ok)
            tl.store(dst + HALF + i, tl.load(src + HALF + i, mask=ok, other=0.0), mask=ok)

    @triton.jit
    def accept_kernel(tokens_ptr, pos_ptr, greedy_ptr, ids_ptr, feats_ptr, state_ptr, counter_ptr, hist_m_ptr,
                      hist_n_ptr, feat_ptr, K, H, s_feats, K_P: tl.constexpr, BLOCK_H: tl.constexpr):
        j = tl.arange(0, K_P)
        drafts = tl.load(tokens_ptr + 1 + j, mask=j < K, other=0)
        greedy = tl.load(greedy_ptr + j, mask=j <= K, other=0)
        pos = tl.load(pos_ptr + j, mask=j <= K, other=0)
        m = tl.min(tl.where((j < K) & (drafts != greedy), j, K), axis=0)  # drafts accepted
        n0 = tl.load(state_ptr)
        c = tl.load(counter_ptr)
        d1 = tl.load(ids_ptr + m)
        g_m = tl.load(greedy_ptr + m)
        tl.debug_barrier()  # every thread has read n, the counter and the drafts before any writes them
        tl.store(state_ptr + 2 + n0 + j, greedy, mask=j <= K)  # seq[n+1 .. n+k+1] = g0..gk
        tl.store(pos_ptr + j, pos + m + 1, mask=j <= K)  # the next cycle's rows n'..n'+k
        tl.store(tokens_ptr, g_m)  # its first token seq[n'] and first draft
        tl.store(tokens_ptr + 1, d1)
        for lo in range(0, H, BLOCK_H):
            cols = lo + tl.arange(0, BLOCK_H)
            tl.store(feat_ptr + cols, tl.load(feats_ptr + m * s_feats + cols, mask=cols < H), mask=cols < H)
        tl.store(hist_m_ptr + c, m)
        tl.store(hist_n_ptr + c, n0)
        tl.store(counter_ptr, c + 1)
        tl.store(state_ptr, n0 + m + 1)

    return rms_norm_kernel, silu_mul_kernel, rope_write_kernel, accept_kernel


def _rows(x: torch.Tensor, what: str) -> torch.Tensor:
    """x as [rows, last] with a contiguous last dimension."""
    if x.dim() != 2:
        raise ValueError(f"{what}: expected a [rows, features] tensor, got {tuple(x.shape)}")
    return x if x.stride(-1) == 1 else x.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, keep: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, N] -> x / sqrt(mean(x^2) + eps) * weight, in x's dtype; `keep` (a [T, N] view of x's
    dtype, any row stride) receives x itself in the same launch."""
    x = _rows(x, "rms_norm")
    t, n = x.shape
    if keep is not None and (keep.shape != x.shape or keep.dtype != x.dtype or keep.stride(-1) != 1):
        raise ValueError(f"rms_norm: keep {tuple(keep.shape)} {keep.dtype} does not fit x {tuple(x.shape)} {x.dtype}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    block = _pow2(n)
    kernel = _kernels(_interpreting())[0]
    kernel[(t,)](x, weight, out, out if keep is None else keep, n, x.stride(0), out.stride(0),
                 0 if keep is None else keep.stride(0), eps, BLOCK=block, KEEP=keep is not None,
                 num_warps=_warps(block))
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] ([gate | up]) -> silu(gate) * up [T, I], rounded as F.silu(gate) * up."""
    gate_up = _rows(gate_up, "silu_mul")
    t, n2 = gate_up.shape
    n = n2 // 2
    out = torch.empty(t, n, device=gate_up.device, dtype=gate_up.dtype)
    kernel = _kernels(_interpreting())[1]
    kernel[(t, -(-n // SILU_BLOCK))](gate_up, out, n, gate_up.stride(0), out.stride(0), BLOCK=SILU_BLOCK)
    return out


def rope_write(qk: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor,
               slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """Rope the query and key heads of qk [T, hq + hkv, d] (cos / signed sin: tables [S, d] of
    every slot's position, llama_ops.Rope.table / KVCache.rope, read at row slots[t]), write the
    keys and v [T, hkv, d] into the caches [hkv, S, d] at `slots` [T]; return the queries as
    [hq, T, d] (row j*T + i of kv head j // g is query head j at row i: the attention kernel's
    layout). In bf16/fp16 equal bit for bit to apply_rope (on the tables' rows) + index_copy_ +
    transpose."""
    t, heads, d = qk.shape
    hkv = v.shape[1]
    hq = heads - hkv
    if (d % 2 or v.shape != (t, hkv, d) or cos.dim() != 2 or cos.shape[1] != d or sin_signed.shape != cos.shape
            or cos.shape[0] < k_cache.shape[1]
            or k_cache.shape != v_cache.shape or k_cache.shape[0] != hkv or k_cache.shape[2] != d
            or slots.shape != (t,) or hq <= 0):
        raise ValueError(f"rope_write: qk {tuple(qk.shape)}, v {tuple(v.shape)}, cos {tuple(cos.shape)}, "
                         f"slots {tuple(slots.shape)}, caches {tuple(k_cache.shape)} do not fit")
    if qk.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("rope_write: the heads' last dimension must be contiguous")
    cos, sin_signed, slots = cos.contiguous(), sin_signed.contiguous(), slots.contiguous()
    q = torch.empty(hq, t, d, device=qk.device, dtype=qk.dtype)
    kernel = _kernels(_interpreting())[2]
    kernel[(t, hq + 2 * hkv)](
        qk, v, cos, sin_signed, slots, q, k_cache, v_cache,
        t, hq, hkv, d // 2, qk.stride(0), qk.stride(1), v.stride(0), v.stride(1), cos.stride(0),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        HALF_P=_pow2(d // 2), num_warps=1)
    return q


def accept(tokens: torch.Tensor, pos: torch.Tensor, greedy: torch.Tensor, ids: torch.Tensor, feats: torch.Tensor,
           state: torch.Tensor, counter: torch.Tensor, hist_m: torch.Tensor, hist_n: torch.Tensor,
           feat: torch.Tensor) -> None:
    """decode.accept_cycle in one launch, all in place (that function states what it does)."""
    k = greedy.shape[0] - 1
    if (k < 1 or tokens.shape[0] < k + 1 or pos.shape[0] < k + 1 or ids.shape != (k + 1,)
            or feats.shape[0] != k + 1 or feat.shape != (1, feats.shape[1])):
        raise ValueError(f"accept: tokens {tuple(tokens.shape)}, pos {tuple(pos.shape)}, greedy {tuple(greedy.shape)}, "
                         f"ids {tuple(ids.shape)}, feats {tuple(feats.shape)}, feat {tuple(feat.shape)} do not fit")
    longs = (tokens, pos, greedy, ids, state, counter, hist_m, hist_n)
    if (any(t.dtype != torch.long or not t.is_contiguous() for t in longs) or feats.dtype != feat.dtype
            or feats.stride(-1) != 1):
        raise ValueError("accept: token tensors must be contiguous int64, features one dtype with a contiguous "
                         "last dimension")
    kernel = _kernels(_interpreting())[3]
    h = feats.shape[1]
    kernel[(1,)](tokens, pos, greedy, ids, feats, state, counter, hist_m, hist_n, feat, k, h, feats.stride(0),
                 K_P=_pow2(k + 1, 2), BLOCK_H=min(1024, _pow2(h)))
