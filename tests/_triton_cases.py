"""The Triton attention cases of tests/test_triton_attention.py, run in a child process.

Triton decides interpreted vs compiled when it is first imported (its own `tl.max`, `tl.sum`
are jitted then), so TRITON_INTERPRET=1 must be set before anything in the process imports
triton; a pytest worker may have imported it already. The test starts
`python tests/_triton_cases.py kernels` (or `compile`, or `decoder TARGET DRAFT PROMPTS NEW_TOKENS K`) with the variable set and reads
one JSON object from stdout: for each case the largest |triton - reference| (or the tokens).
"""

from __future__ import annotations

import json
import sys

import torch

S = 192  # three chunks of BLOCK_N = 64 slots
HEAD_DIM = 64
KV_HEADS = 2
TS, GS = (1, 3, 5), (1, 4)
LASTS = {"first": 0, "chunk-end": 63, "chunk-start": 64, "last": S - 1}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def case_id(t: int, g: int, dtype: str, last: str) -> str:
    return f"t{t}-g{g}-{dtype}-{last}"


def _slots(t: int, last: int) -> torch.Tensor:
    """t consecutive rows ending at slot `last` (a decode step's or a verify step's positions)."""
    first = max(0, last - t + 1)
    return torch.arange(first, first + t)


def _inputs(t: int, g: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(KV_HEADS, g * t, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(KV_HEADS, S, HEAD_DIM, generator=gen).to(dtype)
    v = torch.randn(KV_HEADS, S, HEAD_DIM, generator=gen).to(dtype)
    return q, k, v


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, g: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v in float64, row r = j*t + i seeing the slots <= slots[i]."""
    scores = q.double() @ k.double().transpose(1, 2) / q.shape[-1] ** 0.5
    row_last = slots.repeat(g)  # row r -> slots[r % t]
    allowed = torch.arange(k.shape[1], device=k.device)[None, :] <= row_last[:, None]
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v.double()


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def kernel_cases() -> dict[str, object]:
    from eagle import llama_ops
    from eagle.triton_attention import decode_attention

    out: dict[str, object] = {"cases": {}}
    cases: dict[str, dict[str, object]] = {}
    for t in TS:
        for g in GS:
            for dname, dtype in DTYPES.items():
                for lname, last in LASTS.items():
                    q, k, v = _inputs(t, g, dtype, seed=t * 100 + g * 10 + last)
                    slots = _slots(t, last)
                    got = decode_attention(q, k, v, slots, g)
                    # what the layers computed before this kernel: SDPA over the whole cache
                    sdpa = llama_ops.attend(q, k, v, llama_ops.AttnMask(torch.arange(S), slots, dtype), g)
                    cases[case_id(t, g, dname, lname)] = {
                        "shape_ok": got.shape == q.shape and got.dtype == dtype,
                        "err_reference": _err(got, reference(q, k, v, slots, g)), "err_sdpa": _err(got, sdpa)}
    out["cases"] = cases

    # whatever the cache holds after max(slots) (stale rows, NaN) is never read
    q, k, v = _inputs(3, 4, torch.float32)
    slots = _slots(3, 70)
    clean = decode_attention(q, k, v, slots, 4)
    k[:, 71:] = float("nan")
    v[:, 71:] = float("nan")
    out["nan_past_last_unchanged"] = bool(torch.equal(decode_attention(q, k, v, slots, 4), clean))

    # slots in any order (not only consecutive rows)
    q, k, v = _inputs(3, 2, torch.float32, seed=5)
    slots = torch.tensor([130, 5, 64])
    out["err_unordered"] = _err(decode_attention(q, k, v, slots, 2), reference(q, k, v, slots, 2))

    # more chunks than the combine kernel merges per iteration (20 chunks of 64 slots; groups of 16)
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, n, HEAD_DIM, generator=gen) for n in (12, 1280, 1280))
    out["err_many_chunks"] = [_err(decode_attention(q, k, v, sl, 4), reference(q, k, v, sl, 4))
                              for sl in (_slots(3, 1279), _slots(3, 1030), torch.tensor([1279, 2, 1024]))]

    # a head_dim that is not a power of two (padded to 128 inside the kernel, masked)
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, n, 96, generator=gen) for n in (4, S, S))
    slots = _slots(1, 100)
    out["err_head_dim_96"] = _err(decode_attention(q, k, v, slots, 4), reference(q, k, v, slots, 4))

    # a chunk of 128 slots (two tiles per program) gives the same result as 64
    q, k, v = _inputs(2, 4, torch.float32, seed=3)
    slots = _slots(2, 150)
    out["err_split128"] = _err(decode_attention(q, k, v, slots, 4),
                               decode_attention(q, k, v, slots, 4, split=128))

    # a whole Attention layer over a "triton" cache vs an "sdpa" one: a 40-row prefill (80 rows per
    # kv head: the SDPA path) then a 3-row step (the kernel)
    torch.manual_seed(0)
    layer = llama_ops.Attention(64, 64, heads=4, kv_heads=2, head_dim=16)
    rope = llama_ops.Rope(1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)))
    x = torch.randn(43, 64, generator=torch.Generator().manual_seed(1))
    steps: dict[str, list[torch.Tensor]] = {}
    with torch.inference_mode():
        for kernel in ("sdpa", "triton"):
            cache = llama_ops.KVCache(1, 2, 16, 64, "cpu", torch.float32, attention=kernel)
            steps[kernel] = []
            for rows in (torch.arange(40), torch.arange(40, 43)):
                cos, sin = rope(rows, torch.float32)
                steps[kernel].append(layer(x[rows], cos, sin, rows, cache.k[0], cache.v[0], cache.mask(rows)))
    out["err_layer"] = [_err(a, b) for a, b in zip(steps["sdpa"], steps["triton"], strict=True)]
    return out


def decoder_outputs(target: str, draft: str, prompts: str, new_tokens: int, k: int) -> dict[str, object]:
    """Greedy and speculative tokens of the fast decoder with each attention kernel (float32)."""
    from eagle import triton_attention
    from eagle.decode import load_decoder
    from eagle.prompts import load_prompt_token_ids

    torch.set_num_threads(1)
    calls = [0]
    kernel_fn = triton_attention.decode_attention

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls[0] += 1
        return kernel_fn(*args, **kwargs)  # type: ignore[arg-type]

    triton_attention.decode_attention = counted  # type: ignore[assignment]
    prompt = load_prompt_token_ids(target, prompts)[0]
    out: dict[str, object] = {}
    for kernel in ("sdpa", "triton"):
        dec = load_decoder(target, draft, max_len=160, attention=kernel)
        spec = dec.generate_speculative(prompt, new_tokens, k)
        out[kernel] = {"attention": dec.attention, "cache": dec.cache.attention,  # type: ignore[union-attr]
                       "greedy": dec.generate_greedy(prompt, new_tokens), "speculative": spec.tokens,
                       "verify_steps": len(spec.accepted), "kernel_calls": calls[0]}
        calls[0] = 0
    return out


def compile_for_sm90() -> dict[str, object]:
    """Both kernels compiled (not run) for an H100/H200 (sm_90) by this machine's triton and its
    bundled ptxas: catches what the interpreter forgives (dot shapes and dtypes, loop-carried
    types, shared memory) without a GPU. Per dtype: the partial kernel's largest shared memory in
    bytes (at MAX_ROWS rows of MAX_HEAD_DIM)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from eagle.triton_attention import BLOCK_N, COMBINE_GROUP, MAX_HEAD_DIM, MAX_ROWS, _kernels

    partial, combine = _kernels(False)
    target = GPUTarget("cuda", 90, 32)
    ints = ("T", "ROWS", "D", "SPLITS", "SPLIT")
    out: dict[str, object] = {}
    for dt in ("bf16", "fp16", "fp32"):
        sig = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "slots_ptr": "*i64", "m_ptr": "*fp32",
               "l_ptr": "*fp32", "acc_ptr": "*fp32", **dict.fromkeys(ints, "i32"),
               **dict.fromkeys(("sq_h", "sq_r", "sk_h", "sk_s", "sv_h", "sv_s"), "i32"), "qk_scale": "fp32"}
        shared = 0
        for rows_p in (16, MAX_ROWS):  # a decode step's tile, and the largest (most shared memory)
            const = {"ROWS_P": rows_p, "D_P": MAX_HEAD_DIM, "T_P": 8, "BLOCK": BLOCK_N, "F32_DOT": dt == "fp32",
                     "ROUND_P": dt != "fp32"}
            kernel = compile(ASTSource(partial, {**sig, **dict.fromkeys(const, "constexpr")}, const), target=target)
            shared = max(shared, kernel.metadata.shared)
        csig = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "slots_ptr": "*i64", "o_ptr": f"*{dt}",
                **dict.fromkeys(ints, "i32"), "so_h": "i32", "so_r": "i32"}
        cconst = {"ROWS_P": 16, "D_P": MAX_HEAD_DIM, "GROUP": COMBINE_GROUP}
        compile(ASTSource(combine, {**csig, **dict.fromkeys(cconst, "constexpr")}, cconst), target=target)
        out[dt] = {"shared": shared, "cubin_bytes": len(kernel.asm["cubin"])}
    return out


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "kernels":
        result = kernel_cases()
    elif what == "compile":
        result = compile_for_sm90()
    else:
        target, draft, prompts, new_tokens, k = sys.argv[2:7]
        result = decoder_outputs(target, draft, prompts, int(new_tokens), int(k))
    print(json.dumps(result))
