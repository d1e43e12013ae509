"""Split-KV ("flash-decoding") attention in Triton for the fast decoder's small steps.

The contract is `llama_ops.Attention`'s: `q [hkv, g*t, d]` holds the g query heads of each kv head
stacked as rows (row r = j*t + i is query head j of the group at step row i), the caches are
`[hkv, S, d]`, and row r attends every slot s <= slots[r % t] -- the same rows as the additive
mask of `KVCache.mask`. The result is `[hkv, g*t, d]` in q's dtype.

Why: SDPA over the static cache reads all S = max_len slots every step, in a grid of about one
block per kv head. Here the cache is cut into fixed chunks of `split` slots, one program per
(kv head, chunk); a program whose chunk starts past its rows' last slot returns at once, so a step
reads only the slots up to max(slots) and the grid is wide. Each program writes a partial softmax
(row max, row sum, unnormalised output; fp32), and a second kernel combines the chunks a row
reaches with log-sum-exp. The length comes from the device tensor `slots`, never from the host:
the grid depends only on shapes, so both kernels can be captured in a CUDA graph and replayed at
any position.

Only this module imports triton, and only on first use (eagle and runbook import without it). On
a CPU, Triton runs kernels only in its interpreter (TRITON_INTERPRET=1, set before first use):
slow, for tests.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import torch

from eagle.common import EagleError

BLOCK_N = 64  # slots per tile inside a chunk
MAX_SPLITS = 256  # a longer cache uses larger chunks (a multiple of BLOCK_N), not more of them
MAX_ROWS = 64  # g*t rows handled in one program; more rows (a prefill) take the SDPA path
COMBINE_GROUP = 16  # chunks the combine kernel merges per iteration
MAX_HEAD_DIM = 128


def _interpreting() -> bool:
    """Whether triton.jit builds interpreted kernels now (it reads TRITON_INTERPRET when it jits)."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on")


def unavailable_reason(device: torch.device | str) -> str | None:
    """Why the Triton kernels cannot run on `device` (None when they can)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed in this environment"
    kind = torch.device(device).type
    if kind == "cpu" and not _interpreting():
        return "the device is the CPU, where Triton runs only in its interpreter (TRITON_INTERPRET=1, slow)"
    if kind not in ("cpu", "cuda"):
        return f"the device is {kind!r}; the Triton kernels here run on CUDA"
    return None


def require(device: torch.device | str, flag: str = "--attention triton") -> None:
    """EagleError naming `flag` and the fix when the Triton kernels cannot run on `device`."""
    reason = unavailable_reason(device)
    if reason is not None:
        raise EagleError(f"{flag}: {reason}; use --attention sdpa (the default), or run on a CUDA device with "
                         "triton installed", code=2)


def supports(rows: int, head_dim: int) -> bool:
    """Whether `decode_attention` takes `rows` = g*t query rows per kv head of `head_dim` (up to
    128: Llama's and Qwen3's; the tiles compiled for sm_90 fit its shared memory up to there)."""
    return rows <= MAX_ROWS and head_dim <= MAX_HEAD_DIM


def split_size(cache_len: int) -> int:
    """Slots per chunk for a cache of `cache_len` slots: BLOCK_N, or a multiple of it when the
    cache would need more than MAX_SPLITS chunks."""
    per = -(-cache_len // MAX_SPLITS)
    return max(BLOCK_N, -(-per // BLOCK_N) * BLOCK_N)


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << (n - 1).bit_length())


@functools.cache
def _kernels(interpret: bool) -> tuple[Any, Any]:
    """The two jitted kernels (triton imported here, on first use), compiled or interpreted: one
    pair per mode, as triton.jit decides the mode when it wraps the function."""
    import triton
    import triton.language as tl

    @triton.jit
    def decode_attention_partial(q_ptr, k_ptr, v_ptr, slots_ptr, m_ptr, l_ptr, acc_ptr,
                       T, ROWS, D, SPLITS, SPLIT,
                       sq_h, sq_r, sk_h, sk_s, sv_h, sv_s,
                       qk_scale,
                       ROWS_P: tl.constexpr, D_P: tl.constexpr, T_P: tl.constexpr, BLOCK: tl.constexpr,
                       F32_DOT: tl.constexpr, ROUND_P: tl.constexpr):
        head = tl.program_id(0)
        split = tl.program_id(1)
        t_idx = tl.arange(0, T_P)
        last = tl.max(tl.load(slots_ptr + t_idx, mask=t_idx < T, other=-1), axis=0)
        start = split * SPLIT
        if start <= last:  # else: no row reaches this chunk; the combine never reads it
            rows = tl.arange(0, ROWS_P)
            dims = tl.arange(0, D_P)
            row_ok = rows < ROWS
            row_last = tl.load(slots_ptr + rows % T, mask=row_ok, other=-1)
            q = tl.load(q_ptr + head * sq_h + rows[:, None] * sq_r + dims[None, :],
                        mask=row_ok[:, None] & (dims[None, :] < D), other=0.0)
            m_i = tl.full([ROWS_P], float("-inf"), tl.float32)
            l_i = tl.zeros([ROWS_P], tl.float32)
            acc = tl.zeros([ROWS_P, D_P], tl.float32)
            stop = tl.minimum(start + SPLIT, last + 1)
            for lo in range(start, stop, BLOCK):
                cols = lo + tl.arange(0, BLOCK)
                col_ok = cols < stop
                kv_mask = col_ok[:, None] & (dims[None, :] < D)
                k = tl.load(k_ptr + head * sk_h + cols[:, None] * sk_s + dims[None, :], mask=kv_mask, other=0.0)
                if F32_DOT:
                    s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k))
                s = s * qk_scale  # log2 domain: exp2(s) = exp(q.k / sqrt(d))
                allowed = (cols[None, :] <= row_last[:, None]) & col_ok[None, :]
                s = tl.where(allowed, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing yet: no NaN
                p = tl.exp2(s - m_use[:, None])
                alpha = tl.exp2(m_i - m_use)
                l_i = l_i * alpha + tl.sum(p, axis=1)
                v = tl.load(v_ptr + head * sv_h + cols[:, None] * sv_s + dims[None, :], mask=kv_mask, other=0.0)
                if F32_DOT:
                    if ROUND_P:  # as the native path rounds p to the inputs' dtype
                        p = p.to(v.dtype).to(tl.float32)
                    acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
                else:
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
            out = (head * SPLITS + split) * ROWS_P + rows
            tl.store(m_ptr + out, m_i)
            tl.store(l_ptr + out, l_i)
            tl.store(acc_ptr + out[:, None] * D_P + dims[None, :], acc)

    @triton.jit
    def decode_attention_combine(m_ptr, l_ptr, acc_ptr, slots_ptr, o_ptr,
                                 T, ROWS, D, SPLITS, SPLIT, so_h, so_j, so_i,
                                 ROWS_P: tl.constexpr, D_P: tl.constexpr, GROUP: tl.constexpr):
        head = tl.program_id(0)
        row = tl.program_id(1)
        dims = tl.arange(0, D_P)
        n = tl.load(slots_ptr + row % T) // SPLIT + 1  # the chunks this row reaches (each holds >= 1 slot)
        m_run = tl.full([], float("-inf"), tl.float32)
        l_run = tl.zeros([], tl.float32)
        acc = tl.zeros([D_P], tl.float32)
        for first in range(0, n, GROUP):  # GROUP chunks per iteration: few dependent round trips
            idx = first + tl.arange(0, GROUP)
            ok = idx < n
            at = (head * SPLITS + idx) * ROWS_P + row
            m_s = tl.load(m_ptr + at, mask=ok, other=float("-inf"))
            l_s = tl.load(l_ptr + at, mask=ok, other=0.0)
            a_s = tl.load(acc_ptr + at[:, None] * D_P + dims[None, :], mask=ok[:, None], other=0.0)
            m_new = tl.maximum(m_run, tl.max(m_s, axis=0))  # finite: chunk `first` holds a slot of this row
            old = tl.exp2(m_run - m_new)
            w = tl.exp2(m_s - m_new)  # 0 for the masked chunks
            l_run = l_run * old + tl.sum(w * l_s, axis=0)
            acc = acc * old + tl.sum(w[:, None] * a_s, axis=0)
            m_run = m_new
        out = acc / l_run
        at_out = o_ptr + head * so_h + (row // T) * so_j + (row % T) * so_i  # row = j*T + i
        tl.store(at_out + dims, out.to(o_ptr.dtype.element_ty), mask=dims < D)

    return decode_attention_partial, decode_attention_combine


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     groups: int, split: int | None = None, token_major: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v for q [hkv, g*t, d] over caches [hkv, S, d], where row
    r = j*t + i sees the slots <= slots[i] (slots [t], int, on q's device); -> [hkv, g*t, d], or
    with `token_major` [t, hkv*g*d] (row i holds query heads 0..hq-1 of step row i: what o_proj
    reads, written so by the combine kernel instead of a transpose copy).

    `split` (a multiple of BLOCK_N) overrides the chunk size; rows must satisfy `supports`."""
    hkv, rows, d = q.shape
    t = slots.shape[0]
    if (rows != groups * t or k_cache.shape[0] != hkv or k_cache.shape != v_cache.shape or k_cache.shape[2] != d
            or not q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"decode_attention: q {tuple(q.shape)} {q.dtype}, caches {tuple(k_cache.shape)} "
                         f"{k_cache.dtype} / {tuple(v_cache.shape)} {v_cache.dtype}, {t} slots, groups {groups} "
                         "do not fit")
    if not supports(rows, d):
        raise ValueError(f"decode_attention: {rows} rows of head_dim {d}; at most {MAX_ROWS} rows, head_dim "
                         f"<= {MAX_HEAD_DIM}")
    partial_kernel, combine_kernel = _kernels(_interpreting())
    cache_len = k_cache.shape[1]
    split = split or split_size(cache_len)
    if split % BLOCK_N:
        raise ValueError(f"decode_attention: split {split} is not a multiple of {BLOCK_N}")
    splits = -(-cache_len // split)
    q = q if q.stride(-1) == 1 else q.contiguous()
    slots = slots.contiguous()  # (a no-op for the decoder's slots)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("decode_attention: the caches' last dimension must be contiguous")
    rows_p, d_p = _pow2(rows), _pow2(d)
    dev = q.device
    m = torch.empty(hkv * splits * rows_p, device=dev, dtype=torch.float32)
    lse = torch.empty_like(m)
    acc = torch.empty(hkv * splits * rows_p, d_p, device=dev, dtype=torch.float32)
    if token_major:  # out[i, (head*g + j)*d + x]
        out = torch.empty(t, hkv * rows * d // t, device=dev, dtype=q.dtype)
        so = (groups * d, d, hkv * groups * d)
    else:  # out[head, j*t + i, x]
        out = torch.empty(hkv, rows, d, device=dev, dtype=q.dtype)
        so = (rows * d, t * d, d)
    log2e = 1.4426950408889634
    # fp32 inputs: exact fp32 products (not tf32). Triton's interpreter cannot compute on bf16
    # (it multiplies the bit patterns; triton-lang/triton#11584), so there bf16 operands are
    # widened to fp32 first: the same products, as bf16 x bf16 is exact in fp32.
    f32_dot = q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and _interpreting())
    partial_kernel[(hkv, splits)](
        q, k_cache, v_cache, slots, m, lse, acc,
        t, rows, d, splits, split,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        log2e / d ** 0.5,
        ROWS_P=rows_p, D_P=d_p, T_P=_pow2(t, 2), BLOCK=BLOCK_N,
        F32_DOT=f32_dot, ROUND_P=q.dtype != torch.float32)
    combine_kernel[(hkv, rows)](
        m, lse, acc, slots, out, t, rows, d, splits, split, *so,
        ROWS_P=rows_p, D_P=d_p, GROUP=COMBINE_GROUP)
    return out
