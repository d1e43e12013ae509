"""The Triton attention cases of tests/eagle/decode/test_triton_attention.py, run in a child process.

Triton decides interpreted vs compiled when it is first imported (its own `tl.max`, `tl.sum`
are jitted then), so TRITON_INTERPRET=1 must be set before anything in the process imports
triton; a pytest worker may have imported it already. The test starts
`python tests/support/_triton_cases.py kernels` (or `ops`, `kernels+ops`, `compile`, or `decoder TARGET DRAFT PROMPTS
NEW_TOKENS K`) with the variable set and reads one JSON object from stdout: for each case the largest
|triton - reference| (or the tokens). `kernels+ops` runs both sets of interpreted cases in one process
({"kernels": ..., "ops": ...}): the same cases, one interpreter start-up (torch and triton imported once).
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
    from eagle.decode import llama_ops
    from eagle.decode.triton_attention import decode_attention

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
        for kernel in ("sdpa", "triton"):  # (the triton cache's layers read its rope tables by slot)
            cache = llama_ops.KVCache(1, 2, 16, 64, "cpu", torch.float32, attention=kernel).attach_rope(rope)
            steps[kernel] = []
            for rows in (torch.arange(40), torch.arange(40, 43)):
                cos, sin = cache.rope_of(rope, rows, torch.float32)
                steps[kernel].append(layer(x[rows], cos, sin, rows, cache.k[0], cache.v[0], cache.mask(rows)))
    out["err_layer"] = [_err(a, b) for a, b in zip(steps["sdpa"], steps["triton"], strict=True)]
    return out


def ops_cases() -> dict[str, object]:
    """eagle/decode/triton_ops.py's kernels against the torch ops they replace, per dtype: the largest
    |difference| and how many elements differ. (The interpreter rounds float32 -> bf16 toward zero,
    where a GPU rounds to nearest even, so bf16 agrees here only to a bf16 step; tests/gpu/test_gpu.py
    checks the compiled kernels' bits.)"""
    import torch.nn.functional as F

    from eagle.decode import llama_ops, triton_ops
    from eagle.decode.triton_attention import decode_attention

    gen = torch.Generator().manual_seed(3)
    out: dict[str, object] = {}
    for dname, dtype in DTYPES.items():
        x = torch.randn(3, 1000, generator=gen).to(dtype)  # not a power of two: a masked tail
        w = torch.randn(1000, generator=gen).to(dtype)
        norm = triton_ops.rms_norm(x, w, 1e-5)
        out[f"rms_norm-{dname}"] = _err(norm, F.rms_norm(x.float(), (1000,), w.float(), 1e-5).to(dtype))
        out[f"rms_norm_shape-{dname}"] = [list(norm.shape), str(norm.dtype)]
        # keep: x copied into columns 1000..1999 of a wider buffer (an aux state's columns), the rest untouched
        wide = torch.full((3, 3000), 5.0, dtype=dtype)
        kept = triton_ops.rms_norm(x, w, 1e-5, keep=wide[:, 1000:2000])
        out[f"rms_norm_keep-{dname}"] = {"norm_equal": bool(torch.equal(kept, norm)),
                                         "kept_equal": bool(torch.equal(wide[:, 1000:2000], x)),
                                         "rest_untouched": bool((wide[:, :1000] == 5).all() and (wide[:, 2000:] == 5).all())}
        gate_up = torch.randn(2, 2 * 1500, generator=gen).to(dtype)  # two programs a row, the second masked
        gate, up = gate_up.chunk(2, dim=-1)
        out[f"silu_mul-{dname}"] = _err(triton_ops.silu_mul(gate_up), F.silu(gate) * up)
        for d in (16, 96):  # head_dim 96: half 48 padded to 64 inside the kernel
            t, hq, hkv = 3, 4, 2
            qkv = torch.randn(t, hq + 2 * hkv, d, generator=gen).to(dtype)
            rope = llama_ops.Rope(1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))
            slots = torch.tensor([9, 2, 40])  # any order, as a verify step's rows might be
            cos, sin = rope.table(64, dtype, offset=1)  # tables of every slot (a drafter's: position = slot + 1)
            caches = [torch.full((hkv, 64, d), 7.0, dtype=dtype) for _ in range(4)]
            q = triton_ops.rope_write(qkv[:, : hq + hkv], qkv[:, hq + hkv:], cos, sin, slots, caches[0], caches[1])
            qk = llama_ops.apply_rope(qkv[:, : hq + hkv], *rope(slots + 1, dtype))  # the rows' own rope
            caches[2].index_copy_(1, slots, qk[:, hq:].transpose(0, 1))
            caches[3].index_copy_(1, slots, qkv[:, hq + hkv:].transpose(0, 1))
            out[f"rope_write-d{d}-{dname}"] = {
                "q": _err(q, qk[:, :hq].transpose(0, 1)), "k": _err(caches[0], caches[2]),
                "v_equal": bool(torch.equal(caches[1], caches[3])),
                "untouched_equal": bool((caches[0][:, [0, 1, 63]] == 7).all() and (caches[1][:, [0, 1, 63]] == 7).all())}
    # the accept stage against decode.Decoder's torch ops, for every number of accepted drafts
    out["accept"] = [_accept_case(k, m) for k in (1, 3, 4) for m in range(k + 1)]
    # the attention kernel's token-major output is its head-major output transposed, bit for bit
    q, k, v = _inputs(3, 4, torch.float32, seed=9)
    slots = _slots(3, 100)
    heads = decode_attention(q, k, v, slots, 4)
    tokens = decode_attention(q, k, v, slots, 4, token_major=True)
    out["token_major_equal"] = bool(torch.equal(tokens, heads.view(KV_HEADS, 4, 3, HEAD_DIM).permute(2, 0, 1, 3)
                                                .reshape(3, -1)))
    return out


def _accept_case(k: int, m: int) -> dict[str, object]:
    """triton_ops.accept against decode.accept_cycle (the sdpa path's torch ops), when the first m
    drafts match; the buffers hold k + 3 rows (a larger k ran before): the rows past k stay."""
    from eagle.decode import triton_ops
    from eagle.decode.fast import accept_cycle

    gen = torch.Generator().manual_seed(k * 10 + m)
    greedy = torch.randint(0, 50, (k + 1,), generator=gen)
    n0, c0 = 7, 2
    tokens = torch.randint(0, 50, (k + 3,), generator=gen)
    tokens[1:k + 1] = greedy[:k]
    if m < k:
        tokens[1 + m] += 1  # the first mismatch; later drafts may match again, and must not count
    ids = torch.randint(0, 50, (k + 1,), generator=gen)
    feats = torch.randn(k + 1, 40, generator=gen)
    mine = {"tokens": tokens, "pos": n0 + torch.arange(k + 3), "state": torch.arange(30) * 3,
            "counter": torch.tensor([c0]), "hist_m": torch.zeros(8, dtype=torch.long),
            "hist_n": torch.zeros(8, dtype=torch.long), "feat": torch.zeros(1, 40)}
    mine["state"][0] = n0
    ref = {name: t.clone() for name, t in mine.items()}
    before = {name: t.clone() for name, t in mine.items()}
    names = ("tokens", "pos", "state", "counter", "hist_m", "hist_n", "feat")
    triton_ops.accept(mine["tokens"], mine["pos"], greedy, ids, feats, *(mine[n] for n in names[2:]))
    accept_cycle(ref["tokens"], ref["pos"], greedy, ids, feats, *(ref[n] for n in names[2:]))
    n1 = n0 + m + 1
    return {"equal": all(torch.equal(mine[name], ref[name]) for name in mine),
            "m": int(mine["hist_m"][c0]), "n": int(mine["state"][0]), "expected_n": n1,
            "next_rows": mine["pos"][: k + 1].tolist() == list(range(n1, n1 + k + 1)),
            "rows_past_k_kept": bool(torch.equal(mine["pos"][k + 1:], before["pos"][k + 1:])
                                     and torch.equal(mine["tokens"][k + 1:], before["tokens"][k + 1:])),
            "first_token": int(mine["tokens"][0]) == int(greedy[m]) == int(mine["state"][1 + n1]),
            "d1": int(mine["tokens"][1]) == int(ids[m]), "feat": bool(torch.equal(mine["feat"][0], feats[m]))}


def decoder_outputs(target: str, draft: str, prompts: str, new_tokens: int, k: int) -> dict[str, object]:
    """Greedy and speculative tokens of the fast decoder with each attention kernel (float32)."""
    from eagle.decode import triton_attention
    from eagle.decode.factory import load_decoder
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

    from eagle.decode.triton_attention import BLOCK_N, COMBINE_GROUP, MAX_HEAD_DIM, MAX_ROWS, _kernels

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
                **dict.fromkeys(ints, "i32"), "so_h": "i32", "so_j": "i32", "so_i": "i32"}
        cconst = {"ROWS_P": 16, "D_P": MAX_HEAD_DIM, "GROUP": COMBINE_GROUP}
        compile(ASTSource(combine, {**csig, **dict.fromkeys(cconst, "constexpr")}, cconst), target=target)
        out[dt] = {"shared": shared, "cubin_bytes": len(kernel.asm["cubin"])}
    out["ops"] = _compile_ops(target)
    return out


def _compile_ops(target: object) -> dict[str, int]:
    """eagle/decode/triton_ops.py's kernels compiled for sm_90 in bf16: cubin bytes by kernel."""
    from triton.compiler import ASTSource, compile

    from eagle.decode.triton_ops import SILU_BLOCK, _kernels

    rms, silu, rope, accept = _kernels(False)
    sizes = {}
    kernel = compile(ASTSource(rms, {"x_ptr": "*bf16", "w_ptr": "*bf16", "o_ptr": "*bf16", "keep_ptr": "*bf16",
                                     "N": "i32", "sx": "i32", "so": "i32", "sk": "i32", "eps": "fp32",
                                     "BLOCK": "constexpr", "KEEP": "constexpr"}, {"BLOCK": 8192, "KEEP": True}),
                     target=target)
    sizes["rms_norm"] = len(kernel.asm["cubin"])
    kernel = compile(ASTSource(silu, {"gu_ptr": "*bf16", "o_ptr": "*bf16", "N": "i32", "sg": "i32", "so": "i32",
                                      "BLOCK": "constexpr"}, {"BLOCK": SILU_BLOCK}), target=target)
    sizes["silu_mul"] = len(kernel.asm["cubin"])
    ints = ("T", "HQ", "HKV", "HALF", "s_qk_t", "s_qk_h", "s_v_t", "s_v_h", "s_cs", "s_kc_h", "s_kc_s", "s_vc_h",
            "s_vc_s")
    sig = {**{p: "*bf16" for p in ("qk_ptr", "v_ptr", "cos_ptr", "sin_ptr")}, "slots_ptr": "*i64",
           **{p: "*bf16" for p in ("q_ptr", "kc_ptr", "vc_ptr")}, **dict.fromkeys(ints, "i32"), "HALF_P": "constexpr"}
    kernel = compile(ASTSource(rope, sig, {"HALF_P": 64}), target=target)
    sizes["rope_write"] = len(kernel.asm["cubin"])
    sig = {**{p: "*i64" for p in ("tokens_ptr", "pos_ptr", "greedy_ptr", "ids_ptr")}, "feats_ptr": "*bf16",
           **{p: "*i64" for p in ("state_ptr", "counter_ptr", "hist_m_ptr", "hist_n_ptr")},
           "feat_ptr": "*bf16", "K": "i32", "H": "i32", "s_feats": "i32", "K_P": "constexpr", "BLOCK_H": "constexpr"}
    kernel = compile(ASTSource(accept, sig, {"K_P": 8, "BLOCK_H": 1024}), target=target)
    sizes["accept"] = len(kernel.asm["cubin"])
    return sizes


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "kernels":
        result = kernel_cases()
    elif what == "kernels+ops":
        result = {"kernels": kernel_cases(), "ops": ops_cases()}
    elif what == "compile":
        result = compile_for_sm90()
    elif what == "ops":
        result = ops_cases()
    else:
        target, draft, prompts, new_tokens, k = sys.argv[2:7]
        result = decoder_outputs(target, draft, prompts, int(new_tokens), int(k))
    print(json.dumps(result))
