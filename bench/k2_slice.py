"""Kimi-K2 at its real widths on one GPU (issue 52): a slice of the target and the K2 drafter shape, one table.

    python -m bench.k2_slice --out $OUT      # on the H200: 1 dense + 2 MoE layers of Kimi-K2, random bf16 weights
    python -m bench.k2_slice --smoke         # the same code path at tiny widths on the CPU (checks, no numbers)

The slice: Kimi-K2's published config (DeepSeek-V3 architecture; `K2` below: hidden 7168, MLA with q_lora_rank
1536 and kv_lora_rank 512, 64 heads, a dense first layer of intermediate 18432, MoE layers of 384 routed experts
of width 2048 with 8 active and one shared, vocabulary 163,840) cut to its first three layers (the dense one and
two MoE ones; about 37B parameters, 74 GB in bf16), built on the device directly (no host copy), random weights
N(0, 0.02), transformers' DeepseekV3ForCausalLM with its default experts implementation (`grouped_mm`: one
grouped GEMM per projection, no Python loop over the experts). Aux layers: the inputs of the slice's three
layers (0, 1, 2; on the full 61-layer target eagle's default would be 2, 30, 58), plus the last pre-norm state.

Sections, each timed and caught on its own (a failure is a row naming its cause; the next section still runs):
1. ceilings: measured bf16 matmul rate and device-to-device copy bandwidth.
2. the slice: parameters, active parameters per token (attention, the dense MLP, per MoE layer the router,
   the shared expert and 8 routed experts), memory after the build.
3. extraction: eagle's capture engine (`eagle.data.capture.extract_rows`, what `eagle extract` runs for this
   architecture, its layers compiled on CUDA; and, for comparison, eager; states discarded by the sink, so
   compute only; each the second of two whole passes) against a naive transformers
   forward with output_hidden_states on the same batches, against the roofline (2 x active parameters + causal
   attention FLOPs per token over the measured matmul rate); time per layer (CUDA events around each layer of
   the naive forward); peak memory; the estimate for all 61 layers on 8 GPUs next to the seed's 2,912 tok/s.
4. decode: eagle's generic decoder (transformers' model, batch 1, DynamicCache) step on the slice against the
   bandwidth bound of the bytes a token reads (active weights and the 163,840-row LM head).
5. the K2 drafter shape: one Llama layer at hidden 7168 (intermediate 18432, 64 heads), aux 3 x 7168 into fc,
   draft vocabulary 32,000, the frozen 163,840 x 7168 embedding and verifier head, trained on the slice's own
   hidden states (4 x 2047-token packs): eagle's training step against speculators' own Trainer on the same
   batches (bench.shapes.drafter_training, as bench/gpu_throughput.py's section 3), tok/s, MFU, peak memory.
Writes OUT/k2_slice.json and OUT/k2_slice.md (after every row, so a call cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.harness import Table, bench_device, copy_bandwidth, matmul_rate, sync
from bench.shapes import K2, K2_DRAFT_VOCAB, K2_LAYERS, TINY, drafter_training, random_hf

SEED_EXTRACT_TOK_S = 2912.0  # the seed's extraction of the whole target on 8 GPUs
LAYER_IDS = [0, 1, 2]
TABLE = Table("k2_slice")


def build_slice(shape: dict[str, Any], dev: torch.device, dtype: torch.dtype) -> Any:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(**shape, max_position_embeddings=4096, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 50000.0})
    cfg._attn_implementation = "sdpa"
    return random_hf(DeepseekV3ForCausalLM, cfg, dev, dtype)


def param_counts(shape: dict[str, Any]) -> dict[str, float]:
    """The parameters a token uses in the slice (attention, the dense MLP; per MoE layer the router, the
    shared expert and the active routed experts), and the LM head's."""
    h, heads = shape["hidden_size"], shape["num_attention_heads"]
    qk = shape["qk_nope_head_dim"] + shape["qk_rope_head_dim"]
    attn = (h * shape["q_lora_rank"] + shape["q_lora_rank"] * heads * qk
            + h * (shape["kv_lora_rank"] + shape["qk_rope_head_dim"])
            + shape["kv_lora_rank"] * heads * (shape["qk_nope_head_dim"] + shape["v_head_dim"])
            + heads * shape["v_head_dim"] * h)
    dense = 3 * h * shape["intermediate_size"]
    moe = h * shape["n_routed_experts"] + 3 * h * shape["moe_intermediate_size"] * (
        shape["n_shared_experts"] + shape["num_experts_per_tok"])
    n_dense = shape["first_k_dense_replace"]
    n_moe = shape["num_hidden_layers"] - n_dense
    return {"active_per_token": n_dense * (attn + dense) + n_moe * (attn + moe), "head": h * shape["vocab_size"]}


def attention_flops(shape: dict[str, Any], seq: int) -> float:
    """Causal attention FLOPs per token per layer: QK^T over qk dims and PV over v dims, seq/2 keys on average."""
    heads = shape["num_attention_heads"]
    qk = shape["qk_nope_head_dim"] + shape["qk_rope_head_dim"]
    return 2 * heads * (qk + shape["v_head_dim"]) * seq / 2


def per_layer_ms(model: Any, x: torch.Tensor, dev: torch.device) -> list[float]:
    """Milliseconds of each decoder layer in one naive forward (CUDA events around each layer), after an
    untimed one: run after the capture sections, a first forward's layers took 10-30x their time (the
    allocator and the kernels' first calls), on the H200 2026-12-04."""
    with torch.no_grad():
        model.model(input_ids=x, use_cache=False)
    sync(dev)
    cuda = dev.type == "cuda"
    marks: list[list[Any]] = [[] for _ in model.model.layers]

    def mark(i: int) -> None:
        if cuda:
            marks[i].append(torch.cuda.Event(enable_timing=True))
            marks[i][-1].record()
        else:
            marks[i].append(time.perf_counter())

    hooks = [h for i, layer in enumerate(model.model.layers)
             for h in (layer.register_forward_pre_hook(lambda m, a, i=i: mark(i)),
                       layer.register_forward_hook(lambda m, a, o, i=i: mark(i)))]
    try:
        with torch.no_grad():
            model.model(input_ids=x, use_cache=False)
        sync(dev)
    finally:
        for hk in hooks:
            hk.remove()
    return [a.elapsed_time(b) if cuda else 1000 * (b - a) for a, b in marks]


def extraction(model: Any, shape: dict[str, Any], dev: torch.device, ceil: dict[str, float], smoke: bool,
               budget_s: float) -> list[list[int]]:
    """Section 3; returns the rows (token ids) the training section captures its samples from."""
    from eagle.data import capture as hc

    seq, n_rows, batch_tokens = (16, 8, 64) if smoke else (2048, 48, 16384)
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, shape["vocab_size"], (n_rows, seq), generator=g).tolist()
    counts = param_counts(shape)
    flops = 2 * counts["active_per_token"] + shape["num_hidden_layers"] * attention_flops(shape, seq)
    roof = ceil["matmul"] / flops
    TABLE.row("slice forward FLOPs", flops / 1e9, "GFLOP/token",
           note=f"2 x {counts['active_per_token'] / 1e9:.3f}B active params + causal attention at {seq} tokens")
    per_batch = max(1, batch_tokens // seq)
    batches = [list(range(s, min(s + per_batch, n_rows))) for s in range(0, n_rows, per_batch)]

    # (a) the naive forward: transformers with output_hidden_states, logits included
    name = "naive transformers forward (output_hidden_states)"
    try:
        t_end = time.perf_counter() + budget_s
        with torch.no_grad():
            x0 = torch.tensor([rows[i] for i in batches[0]], device=dev)
            model(input_ids=x0, output_hidden_states=True, use_cache=False)  # warm-up
            sync(dev)
            t0, done = time.perf_counter(), 0
            for b in batches:
                x = torch.tensor([rows[i] for i in b], device=dev)
                out = model(input_ids=x, output_hidden_states=True, use_cache=False)
                del out
                done += x.numel()
                if time.perf_counter() > t_end:
                    break
            sync(dev)
        naive = done / (time.perf_counter() - t0)
        TABLE.row(name, naive, "tok/s", limit=("roofline", roof))
    except Exception as e:  # noqa: BLE001
        naive = 0.0
        TABLE.failed(name, e)

    # (b) eagle's capture engine, compute only: as `eagle extract` runs it (its layers compiled on CUDA) and with
    # the layers eager. Each timed over a second whole pass: the first compiles, and the pipeline's pinned host
    # buffers (writers + 2 of them, a batch's states each) are allocated once per process, then reused.
    kept: dict[int, tuple[int, ...]] = {}

    def sink(i: int, hs: torch.Tensor) -> int:
        kept[i] = tuple(hs.shape)
        return 0

    for name, compiled in (("eagle capture engine (extract_rows, compute only; as eagle extract runs it)", None),
                           ("eagle capture engine, layers eager", False)):
        if compiled is False and dev.type != "cuda":
            continue  # on the CPU the default is eager already
        try:
            kept.clear()
            t0 = time.perf_counter()
            hc.extract_rows(model, rows, list(range(n_rows)), LAYER_IDS, None, batch_tokens=batch_tokens, sink=sink,
                            compile=compiled)
            first_s = time.perf_counter() - t0
            stats = hc.extract_rows(model, rows, list(range(n_rows)), LAYER_IDS, None, batch_tokens=batch_tokens,
                                    sink=sink, compile=compiled)
            assert len(kept) == n_rows and kept[0] == (seq, len(LAYER_IDS) + 1, shape["hidden_size"]), kept.get(0)
            TABLE.row(name, stats.tok_s, "tok/s", limit=("roofline", roof), peer=("naive", naive) if naive else None,
                      note=f"second pass of {stats.tokens} tokens in {stats.batches} batches; the first took "
                           f"{first_s:.1f} s (compilation and pinned buffers)")
        except Exception as e:  # noqa: BLE001
            TABLE.failed(name, e)
        finally:
            torch._dynamo.reset()

    # (c) per layer, the states' agreement (the check that matters at tiny widths too) and memory
    name = "time per layer (naive forward, one batch)"
    try:
        x = torch.tensor([rows[i] for i in batches[0]], device=dev)
        ms = per_layer_ms(model, x, dev)
        tok = x.numel()
        per_tok = [m / 1000 / tok for m in ms]
        TABLE.row(name, sum(ms), "ms", note="; ".join(
            f"layer {i} ({'dense' if i < shape['first_k_dense_replace'] else 'MoE'}) {m:.2f} ms"
            f" = {tok / (m / 1000):,.0f} tok/s" for i, m in enumerate(ms)))
        cap = hc.HiddenCapture(model, LAYER_IDS)
        try:
            got = cap.run(x[:2])
        finally:
            cap.close()
        with torch.no_grad():
            ref = model(input_ids=x[:2], output_hidden_states=True, use_cache=False).hidden_states
        err = max(float((got[:, :, j].float() - ref[k].float()).abs().max()) for j, k in enumerate(LAYER_IDS))
        TABLE.row("capture vs output_hidden_states at the aux layers (max abs diff)", err, "",
               note="the capture engine's states are transformers' own")
        if dev.type == "cuda":
            TABLE.row("peak memory (build + extraction)", torch.cuda.max_memory_allocated(dev) / 2**30, "GiB")
        dense_s = per_tok[0] if shape["first_k_dense_replace"] else 0.0
        moe_s = sum(per_tok[shape["first_k_dense_replace"]:]) / max(1, len(per_tok) - shape["first_k_dense_replace"])
        full_s = dense_s + (K2_LAYERS - shape["first_k_dense_replace"]) * moe_s
        est8 = 8 / full_s
        TABLE.row("estimate: all 61 layers on 8 GPUs (8 x this GPU's layer times, no communication)", est8, "tok/s",
               peer=("the seed's 8-GPU extraction", SEED_EXTRACT_TOK_S),
               note=f"1 dense + 60 MoE layers at {1e6 * dense_s:.2f} / {1e6 * moe_s:.2f} us a token each = "
                    f"{1 / full_s:,.0f} tok/s on one GPU if the weights fitted; tensor parallelism over 8 adds "
                    "all-reduces, so this is an upper bound")
    except Exception as e:  # noqa: BLE001
        TABLE.failed(name, e)
    return rows


def decode(model: Any, shape: dict[str, Any], dev: torch.device, ceil: dict[str, float], smoke: bool) -> None:
    from eagle.decode.generic import GenericDecoder

    name = "generic decoder step (batch 1, DynamicCache)"
    try:
        prompt = list(range(1, 17 if smoke else 129))
        dec = GenericDecoder(model, None, max_len=len(prompt) + 64)
        try:
            t = dec.time_stages(3, prompt, iters=3 if smoke else 20)
        finally:
            dec.close()
        counts = param_counts(shape)
        elem = 2 if next(model.parameters()).dtype == torch.bfloat16 else 4
        nbytes = elem * (counts["active_per_token"] + counts["head"])
        bound_s = nbytes / ceil["copy"]
        TABLE.row(name, t["target_step"] * 1000, "ms", limit=("bandwidth bound", bound_s * 1000),
               note=f"bytes a token reads: {nbytes / 1e9:.2f} GB (active weights + LM head) at the copy bandwidth "
                    f"= {bound_s * 1000:.2f} ms (a share above 100% is time over the bound); verify of 4 rows "
                    f"{t['verify'] * 1000:.2f} ms")
    except Exception as e:  # noqa: BLE001
        TABLE.failed(name, e)


def ceilings(dev: torch.device, smoke: bool) -> dict[str, float]:
    """Section 1: the measured bf16 matmul rate and device-to-device copy bandwidth."""
    matmul = matmul_rate(dev, 512 if smoke else 8192)
    TABLE.row("bf16 matmul (8192^3, random)", matmul / 1e12, "TFLOP/s")
    copy = copy_bandwidth(dev, (64 << 20) if smoke else (2 << 30))
    TABLE.row("device copy (read + write)", copy / 1e9, "GB/s")
    return {"matmul": matmul, "copy": copy}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny widths on the CPU: checks the code path, measures nothing")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write k2_slice.json/.md here [$OUT]")
    p.add_argument("--steps", type=int, default=20, help="measured training steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=4, help="training steps before timing (the first compiles)")
    p.add_argument("--budget", type=float, default=90.0, help="seconds the naive forward may take at most")
    p.add_argument("--skip", default="", help="comma list of sections to skip: extract,decode,train")
    a = p.parse_args(argv)
    dev = bench_device(a.smoke)
    if dev is None:
        return 1
    shape = TINY if a.smoke else K2
    dtype = torch.float32 if a.smoke else torch.bfloat16
    skip = set(a.skip.split(","))
    scratch = Path(tempfile.mkdtemp(prefix="k2_slice-"))
    TABLE.out = Path(a.out) if a.out else None
    TABLE.rows.clear()
    TABLE.stamp(dev, shape=shape, layer_ids=LAYER_IDS)
    print(f"# k2_slice {TABLE.meta}", flush=True)
    t_all = time.perf_counter()
    ceil = {"matmul": 1.0, "copy": 1.0}
    try:
        ceil = ceilings(dev, a.smoke)
    except Exception as e:  # noqa: BLE001
        TABLE.failed("ceilings", e)
    model = None
    try:
        t0 = time.perf_counter()
        model = build_slice(shape, dev, dtype)
        sync(dev)
        counts = param_counts(shape)
        total = sum(p.numel() for p in model.parameters())
        TABLE.meta["experts_implementation"] = model.config._experts_implementation
        TABLE.row("slice built on the device", time.perf_counter() - t0, "s",
               note=f"{total / 1e9:.2f}B parameters ({total * (2 if dtype == torch.bfloat16 else 4) / 1e9:.1f} GB), "
                    f"{counts['active_per_token'] / 1e9:.3f}B active a token in its 3 layers; experts "
                    f"{model.config._experts_implementation}"
                    + (f"; {torch.cuda.memory_allocated(dev) / 2**30:.1f} GiB allocated" if dev.type == "cuda" else ""))
    except Exception as e:  # noqa: BLE001
        TABLE.failed("slice build", e)
    rows: list[list[int]] = []
    if model is not None and "extract" not in skip:
        rows = extraction(model, shape, dev, ceil, a.smoke, a.budget)
    if model is not None and "decode" not in skip:
        decode(model, shape, dev, ceil, a.smoke)
    if model is not None and rows and "train" not in skip:
        try:
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            torch._dynamo.reset()  # the capture's compiled frames hold the slice's modules in their guards
            held = [model]
            del model  # training() captures its samples, then drops the last reference to the slice
            steps, warmup = (3, 1) if a.smoke else (a.steps, a.warmup)
            drafter_training(TABLE, held.pop(), rows, shape, dev, ceil, a.smoke, scratch, LAYER_IDS, steps, warmup,
                        draft_vocab=K2_DRAFT_VOCAB["smoke" if a.smoke else "gpu"])
            if dev.type == "cuda":
                TABLE.row("peak memory (capture for training + drafter training)",
                       torch.cuda.max_memory_allocated(dev) / 2**30, "GiB")
        except Exception as e:  # noqa: BLE001
            TABLE.failed("K2 drafter training", e)
    TABLE.meta["seconds"] = round(time.perf_counter() - t_all, 1)
    TABLE.save()
    print("\n" + TABLE.markdown())
    return 0 if all(r["value"] is not None for r in TABLE.rows) else 2


if __name__ == "__main__":
    sys.exit(main())
