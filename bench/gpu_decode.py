"""Fast-decoding benchmark for the H200 (issue 9): one call, one table.

    python -m bench.gpu_decode                                   # 8B Llama shape, random bf16 weights
    python -m bench.gpu_decode --target work/target --draft work/draft --prompts plans/data/prompts-heldout.jsonl
    python -m bench.gpu_decode --smoke [--target ... --draft ... --prompts ...]   # tiny, on the CPU
    python -m bench.gpu_decode --attention sdpa,triton --skip-part2             # both kernels, side by side

Part 1 (speed only, random weights): plain greedy tok/s of the CUDA-graph decode step against the
memory-bandwidth bound (weight bytes read per token / measured device copy bandwidth; target >=
60% of it), the (k+1)-token verify step's cost relative to one decode step for k = 1..7 (should
stay close to 1), and a kernel profile of one decode step (kernels per step; time in the matrix
products, with their achieved bandwidth, in attention and in everything else; the rest of the
step is launch gaps).
Part 2 (with --target/--draft/--prompts): speculative decoding on a trained target + drafter (real
acceptance): a check that the fast decoder's greedy output equals transformers' greedy output on
this device, then plain tok/s and for each k speculative tok/s, accept_len, the measured cost
ratio, the Leviathan bound and the fraction of it reached (target >= 80%), where the cycle's time
goes, and whether the output equals plain greedy.
`--attention sdpa,triton` (issue 27): parts 1 and 2 run once per attention kernel of the fast
decoder (llama_ops.ATTENTION_KERNELS; the rows of the second say `[triton]`), then a sweep puts
the decode step and the (k+1)-token verify of each kernel side by side at several positions in one
large static cache (`--sweep-len` slots): SDPA reads the whole cache at every position, the split-KV
kernel only the slots written so far. On the CPU (--smoke) triton needs TRITON_INTERPRET=1.

`--json PATH` writes every number. Needs only torch, transformers and safetensors (no
speculators, vLLM, click or pydantic).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from bench.harness import ATTENTION, MATMUL, copy_bandwidth, sync
from bench.shapes import LLAMA_8B, SMOKE_8B
from bench.shapes import random_fast_target as random_target
from eagle.decode import llama_ops
from eagle.decode.factory import load_decoder
from eagle.decode.fast import Decoder, TargetModel
from eagle.decode.interface import required_len
from eagle.decode.leviathan import acceptance_from_accept_len, leviathan_speedup

Rows = list[tuple[str, str]]


def table(rows: Rows) -> str:
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def kernel_profile(fn, device: torch.device, steps: int = 5) -> dict:
    """Per-step kernel count and device time by kind and in all (`device_s`), calls per step of each
    kernel (`counts`), from torch.profiler over `steps` eager calls. Kernel durations are the same
    in and out of a CUDA graph; only the gaps between them differ."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    fn()
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
        sync(device)
    want = DeviceType.CUDA if cuda else DeviceType.CPU
    per_name: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type != want or (not cuda and ev.cpu_parent is not None):
            continue  # on the CPU (smoke) only top-level ops, so nothing is counted twice
        per_name.setdefault(ev.name, []).append(ev.time_range.elapsed_us() * 1e-6)
    kinds = {"matmul": [0, 0.0], "attention": [0, 0.0], "other": [0, 0.0]}
    for name, ts in per_name.items():
        kind = "attention" if ATTENTION.search(name) else "matmul" if MATMUL.search(name) else "other"
        kinds[kind][0] += len(ts)
        kinds[kind][1] += sum(ts)
    top = sorted(per_name.items(), key=lambda kv: -sum(kv[1]))[:12]
    return {"kernels": sum(v[0] for v in kinds.values()) / steps,
            "device_s": sum(v[1] for v in kinds.values()) / steps,
            "counts": {n: len(ts) // steps for n, ts in per_name.items()},
            **{f"{k}_kernels": v[0] / steps for k, v in kinds.items()},
            **{f"{k}_s": v[1] / steps for k, v in kinds.items()},
            "top": [{"name": n[:90], "per_step": len(ts) / steps, "us_per_step": 1e6 * sum(ts) / steps}
                    for n, ts in top]}


def part1(shape: dict, device: torch.device, dtype: torch.dtype, prompt_len: int, new_tokens: int,
          copy_bytes: int, out: dict, attention: str = "sdpa", model: TargetModel | None = None) -> Rows:
    model = model or random_target(shape, device, dtype)
    dec = Decoder(model, None, max_len=required_len(prompt_len, new_tokens, 7),  # fuses q/k/v, gate/up
                  attention=attention)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    weight_bytes -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    bandwidth = copy_bandwidth(device, copy_bytes)
    bound = bandwidth / weight_bytes
    prompt = torch.randint(0, shape["vocab_size"], (prompt_len,)).tolist()
    dec.generate_greedy(prompt, new_tokens)  # warm-up + graph capture
    sync(device)
    t0 = time.perf_counter()
    toks = dec.generate_greedy(prompt, new_tokens)
    sync(device)
    e2e = len(toks) / (time.perf_counter() - t0)
    verify = {}
    step = None
    for k in range(1, 8):
        st = dec.time_stages(k, prompt, iters=30)
        step = step or st["target_step"]
        verify[k] = st["verify"]
    dec.prefill(prompt, speculative=False)
    prof = kernel_profile(dec._timed_target_step, device)
    variants = attention_variants(model, prompt, prompt_len, new_tokens, device) if attention == "sdpa" else {}
    out["part1"] = {"attention": attention, "shape": shape, "dtype": str(dtype), "weight_bytes": weight_bytes, "copy_bandwidth": bandwidth,
                    "bound_tok_s": bound, "step_s": step, "step_tok_s": 1 / step, "step_fraction": 1 / step / bound,
                    "e2e_tok_s": e2e, "e2e_fraction": e2e / bound, "cuda_graphs": dec.use_graphs,
                    "verify_s": verify, "verify_ratio": {k: v / step for k, v in verify.items()}, "profile": prof,
                    "attention_variants": variants}
    kernel_sum = prof["device_s"]
    rows = [("shape", f"hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers, inter "
                      f"{shape['intermediate_size']}, vocab {shape['vocab_size']}, {str(dtype).replace('torch.', '')}"),
            ("cuda graphs", str(dec.use_graphs)),
            ("attention", attention),
            ("weight bytes / token", f"{weight_bytes / 1e9:.2f} GB"),
            ("device copy bandwidth", f"{bandwidth / 1e12:.2f} TB/s"),
            ("bandwidth bound", f"{bound:.0f} tok/s"),
            ("decode step (graph)", f"{step * 1e3:.3f} ms = {1 / step:.0f} tok/s = {100 / step / bound:.0f}% of bound"),
            ("generate_greedy e2e", f"{e2e:.0f} tok/s ({len(toks)} tokens after a {prompt_len}-token prompt) "
                                    f"= {100 * e2e / bound:.0f}% of bound")]
    rows += [(f"verify k={k} ({k + 1} tokens)", f"{v * 1e3:.3f} ms = {v / step:.2f} x decode step")
             for k, v in verify.items()]
    rows += [("profile: kernels / step", f"{prof['kernels']:.0f} ({prof['matmul_kernels']:.0f} matmul, "
                                         f"{prof['attention_kernels']:.0f} attention, {prof['other_kernels']:.0f} other)"),
             ("profile: matmul", f"{prof['matmul_s'] * 1e3:.3f} ms = "
                                 f"{weight_bytes / max(prof['matmul_s'], 1e-12) / 1e12:.2f} TB/s on the weights"),
             ("profile: attention", f"{prof['attention_s'] * 1e3:.3f} ms"),
             ("profile: other kernels", f"{prof['other_s'] * 1e3:.3f} ms"),
             ("profile: gaps (step - kernels)", f"{(step - kernel_sum) * 1e3:.3f} ms")]
    rows += [(f"  top {i + 1}", f"{t['us_per_step']:8.1f} us  x{t['per_step']:.0f}  {t['name']}")
             for i, t in enumerate(prof["top"][:8])]
    rows += [(f"sdpa {name}", f"decode step {v['step_s'] * 1e3:.3f} ms = {100 / v['step_s'] / bound:.0f}% of bound; "
                              f"prefill of a new length {v['prefill_first_s'] * 1e3:.1f} ms, again "
                              f"{v['prefill_again_s'] * 1e3:.1f} ms")
             for name, v in variants.items()]
    return rows


def attention_variants(model: TargetModel, prompt: list[int], prompt_len: int, new_tokens: int,
                       device: torch.device) -> dict:
    """Decode-step time and the cost of a prefill at a new prompt length, under our attention
    backend list and under torch's own choice (cuDNN on the H200)."""
    results = {}
    saved = llama_ops.SDPA_BACKENDS
    for i, (name, backends) in enumerate([("ours (efficient)", saved), ("torch default", None)]):
        llama_ops.SDPA_BACKENDS = backends
        try:
            dec = Decoder(model, None, max_len=required_len(prompt_len, new_tokens, 7))
            step = dec.time_stages(1, prompt, iters=30)["target_step"]
            fresh = prompt[: prompt_len - 17 - 2 * i]  # a length not seen before in this process
            times = []
            for _ in range(2):
                sync(device)
                t0 = time.perf_counter()
                dec.prefill(fresh, speculative=False)
                sync(device)
                times.append(time.perf_counter() - t0)
            results[name] = {"step_s": step, "prefill_first_s": times[0], "prefill_again_s": times[1]}
            del dec
        finally:
            llama_ops.SDPA_BACKENDS = saved
    return results


def attention_sweep(model: TargetModel, kernels: list[str], cache_len: int, positions: list[int], k: int,
                    vocab: int) -> tuple[Rows, dict]:
    """The decode step and the (k+1)-token verify (each a CUDA graph on a GPU) of every attention
    kernel at each position of one static cache of `cache_len` slots, side by side."""
    results: dict[str, dict[int, dict[str, float]]] = {}
    for kernel in kernels:
        dec = Decoder(model, None, max_len=cache_len, attention=kernel)
        results[kernel] = {}
        for pos in positions:
            prompt = torch.randint(0, vocab, (pos,), generator=torch.Generator().manual_seed(pos)).tolist()
            st = dec.time_stages(k, prompt, iters=30)
            results[kernel][pos] = {"step_s": st["target_step"], "verify_s": st["verify"]}
        del dec
    first = kernels[0]
    rows: Rows = [("sweep", f"static cache of {cache_len} slots (S = {-(-cache_len // 64) * 64}), verify k={k}")]
    for pos in positions:
        cells = []
        for kernel in kernels:
            r = results[kernel][pos]
            ratio = "" if kernel == first else f" ({results[first][pos]['step_s'] / r['step_s']:.2f}x {first})"
            cells.append(f"{kernel} step {r['step_s'] * 1e3:.3f} ms{ratio}, verify {r['verify_s'] * 1e3:.3f} ms "
                         f"= {r['verify_s'] / r['step_s']:.2f} x step")
        rows.append((f"position {pos}", " | ".join(cells)))
    return rows, {"cache_len": cache_len, "k": k, "positions": positions, "results": results}


def hf_greedy(model_dir: Path, prompts: list[list[int]], new_tokens: int, device: torch.device,
              dtype: torch.dtype) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    from eagle.decode.factory import eos_ids_of

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    pad = (eos_ids_of(model_dir) or [0])[0]
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids], device=device)
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                               do_sample=False, pad_token_id=pad)
            outs.append(y[0, len(ids):].tolist())
    return outs


def run_pass(dec: Decoder, prompts: list[list[int]], new_tokens: int, k: int | None) -> dict:
    """One pass over the prompts: outputs, accepted drafts, and wall seconds split into prefill and
    decode (the decode loop, after the prefill's first token)."""
    outs, accepted, prefill_s, decode_s, cycles = [], [], 0.0, 0.0, 0
    for ids in prompts:
        if k is None:
            outs.append(dec.generate_greedy(ids, new_tokens))
        else:
            res = dec.generate_speculative(ids, new_tokens, k)
            outs.append(res.tokens)
            accepted += res.accepted
            cycles += int(dec.last_timing["cycles"])
        prefill_s += dec.last_timing["prefill_s"]
        decode_s += dec.last_timing["decode_s"]
    tokens = sum(map(len, outs))
    return {"outs": outs, "accepted": accepted, "cycles": cycles, "tokens": tokens,
            "e2e_tok_s": tokens / (prefill_s + decode_s), "decode_tok_s": (tokens - len(prompts)) / decode_s,
            "prefill_s": prefill_s, "decode_s": decode_s}


def part2(target: Path, draft: Path, prompts_file: Path, ks: list[int], new_tokens: int, limit: int,
          device: torch.device, dtype: torch.dtype, out: dict, attention: str = "sdpa") -> Rows:
    from eagle.prompts import load_prompt_token_ids

    prompts = load_prompt_token_ids(target, prompts_file, limit)
    # correctness on this device: fast decoder (float32, graphs where CUDA) vs transformers' greedy
    check = prompts[:4]
    ref = hf_greedy(target, check, 64, device, torch.float32)
    dec32 = load_decoder(target, None, max_len=required_len(max(map(len, check)), 64), device=device,
                         dtype=torch.float32, attention=attention)
    hf_match = sum(dec32.generate_greedy(p, 64) == r for p, r in zip(check, ref, strict=True))
    del dec32

    dec = load_decoder(target, draft, max_len=required_len(max(map(len, prompts)), new_tokens, max(ks)),
                       device=device, dtype=dtype, attention=attention)
    for k in [None, *ks]:  # warm-up: graph capture and any per-shape setup, every prompt length
        run_pass(dec, prompts, new_tokens, k)
    plain = run_pass(dec, prompts, new_tokens, None)
    rows: Rows = [("target / draft", f"{target} / {draft}"),
                  ("attention", attention),
                  ("prompts, new tokens", f"{len(prompts)}, <= {new_tokens} (stops at EOS; {plain['tokens']} in all)"),
                  ("fast greedy == HF greedy", f"{hf_match}/{len(check)} prompts (float32, 64 tokens, {device.type})"),
                  ("plain greedy", f"{plain['decode_tok_s']:.0f} tok/s decoding ({plain['e2e_tok_s']:.0f} tok/s "
                                   f"with prefill)")]
    out["part2"] = {"attention": attention, "prompts": len(prompts), "new_tokens": new_tokens, "hf_match": hf_match, "hf_checked": len(check),
                    "plain": {k: v for k, v in plain.items() if k not in ("outs", "accepted")}, "k": {}}
    for k in ks:
        spec = run_pass(dec, prompts, new_tokens, k)
        st = dec.time_stages(k, prompts[0], iters=50)
        accepted = spec["accepted"]
        accept_len = min(1 + sum(accepted) / max(1, len(accepted)), k + 1.0)
        a = acceptance_from_accept_len(accept_len, k)
        step = st["target_step"]
        c = ((k - 1) * st["draft_step"] + st["catchup"]) / k / step
        bound = leviathan_speedup(a, k, c)
        speedup = spec["decode_tok_s"] / plain["decode_tok_s"]
        cycle = spec["decode_s"] / spec["cycles"]
        staged = (k - 1) * st["draft_step"] + st["catchup"] + st["verify"]
        same = spec["outs"] == plain["outs"]
        out["part2"]["k"][k] = {"spec": {kk: v for kk, v in spec.items() if kk not in ("outs", "accepted")},
                                "speedup": speedup, "e2e_speedup": spec["e2e_tok_s"] / plain["e2e_tok_s"],
                                "accept_len": accept_len, "a": a, "cost_ratio": c, "leviathan_bound": bound,
                                "bound_fraction": speedup / bound, "stages_s": st, "cycle_s": cycle,
                                "plain_step_wall_s": plain["decode_s"] / (plain["tokens"] - len(prompts)),
                                "same_as_plain": same}
        rows += [(f"k={k}: speculative", f"{spec['decode_tok_s']:.0f} tok/s decoding = {speedup:.2f}x plain "
                                         f"({spec['e2e_tok_s'] / plain['e2e_tok_s']:.2f}x with prefill); "
                                         f"output == plain: {same}"),
                 (f"k={k}: accept_len", f"{accept_len:.2f} (a = {a:.3f}); cost ratio c = {c:.3f} (draft step "
                                        f"{st['draft_step'] * 1e3:.3f} ms, catch-up {st['catchup'] * 1e3:.3f} ms, "
                                        f"decode step {step * 1e3:.3f} ms)"),
                 (f"k={k}: Leviathan bound", f"{bound:.2f}x; reached {speedup:.2f}x = {100 * speedup / bound:.0f}% of it"),
                 (f"k={k}: cycle", f"{cycle * 1e3:.3f} ms wall in the loop; graph stages {staged * 1e3:.3f} ms "
                                   f"(verify {st['verify'] * 1e3:.3f} ms = {st['verify'] / step:.2f} x step); "
                                   f"ideal (kc+1) x step {(k * c + 1) * step * 1e3:.3f} ms; plain step wall "
                                   f"{1e3 * plain['decode_s'] / (plain['tokens'] - len(prompts)):.3f} ms")]
    rows += verify_vs_step(dec, prompts[0], ks[0], device, out["part2"])
    return rows


def verify_vs_step(dec: Decoder, prompt: list[int], k: int, device: torch.device, out: dict) -> Rows:
    """Why the (k+1)-token verify costs more than a decode step: both steps' kernels (count and
    device time, eager: the durations are the graph's) and the kernels whose count differs."""
    dec.prefill(prompt, speculative=True)
    step = kernel_profile(dec._timed_target_step, device)
    verify = kernel_profile(lambda: dec._timed_verify(k), device)
    diff = {n: verify["counts"].get(n, 0) - step["counts"].get(n, 0)
            for n in set(step["counts"]) | set(verify["counts"])}
    extra = sorted(((n, d) for n, d in diff.items() if d), key=lambda nd: -abs(nd[1]))[:8]
    out["verify_vs_step"] = {"k": k, "step": {"kernels": step["kernels"], "device_s": step["device_s"]},
                             "verify": {"kernels": verify["kernels"], "device_s": verify["device_s"]},
                             "count_diff": dict(extra)}
    return [(f"k={k}: kernels step / verify", f"{step['kernels']:.0f} ({step['device_s'] * 1e6:.0f} us of kernels) / "
                                             f"{verify['kernels']:.0f} ({verify['device_s'] * 1e6:.0f} us)"),
            *((f"  verify {d:+d}", n[:90]) for n, d in extra)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script runs")
    ap.add_argument("--target", type=Path, help="trained target dir (part 2)")
    ap.add_argument("--draft", type=Path, help="drafter checkpoint dir (part 2)")
    ap.add_argument("--prompts", type=Path, help="prompts JSONL (part 2)")
    ap.add_argument("--ks", default="3", help="comma-separated draft lengths for part 2 (default 3)")
    ap.add_argument("--limit", type=int, default=16, help="prompts used in part 2")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--skip-8b", action="store_true", help="only part 2")
    ap.add_argument("--skip-part2", action="store_true", help="only part 1 (and the sweep)")
    ap.add_argument("--attention", default="sdpa",
                    help="comma-separated attention kernels of the fast decoder, each measured in turn "
                         "(sdpa, triton; default sdpa); two or more add the side-by-side sweep")
    ap.add_argument("--sweep-len", type=int, default=8192, help="static cache slots of the sweep")
    ap.add_argument("--json", type=Path, help="write every number here")
    args = ap.parse_args(argv)
    try:
        ks = sorted({int(k) for k in args.ks.split(",")})
        if min(ks) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --ks {args.ks!r}: expected comma-separated draft lengths >= 1, e.g. 2,3,4", file=sys.stderr)
        return 2
    kernels = list(dict.fromkeys(a.strip() for a in args.attention.split(",")))
    if not kernels or any(a not in llama_ops.ATTENTION_KERNELS for a in kernels):
        print(f"error: --attention {args.attention!r}: expected comma-separated kernels out of "
              f"{', '.join(llama_ops.ATTENTION_KERNELS)}", file=sys.stderr)
        return 2
    if args.smoke:
        device, dtype, shape = torch.device("cpu"), torch.float32, SMOKE_8B
        args.prompt_len, args.new_tokens, copy_bytes = 16, 16, 1 << 24
        args.sweep_len = 256
    else:
        if not torch.cuda.is_available():
            print("error: no CUDA device; use --smoke for a CPU check", file=sys.stderr)
            return 2
        device, dtype, shape, copy_bytes = torch.device("cuda"), torch.bfloat16, LLAMA_8B, 1 << 30
    import transformers

    out: dict = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "transformers": transformers.__version__,
                 "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    print(f"torch {out['torch']}, transformers {out['transformers']}, {out['device']}")
    failed = False
    if not args.skip_8b:
        model = None
        for i, kernel in enumerate(kernels):
            print(f"\n== plain greedy and verify cost, random weights, attention {kernel} ==", flush=True)
            try:
                model = model or random_target(shape, device, dtype)
                sub: dict = {}
                rows = part1(shape, device, dtype, args.prompt_len, args.new_tokens, copy_bytes, sub, kernel, model)
                out["part1" if i == 0 else f"part1_{kernel}"] = sub["part1"]
                print(table(rows), flush=True)
            except Exception:  # noqa: BLE001 -- keep the other kernels and part 2 running; the traceback says what broke
                traceback.print_exc()
                failed = True
        if len(kernels) > 1 and model is not None:
            print(f"\n== attention side by side: {', '.join(kernels)} ==", flush=True)
            positions = sorted({p for p in (128, 1024, 4096, args.sweep_len - 64) if 0 < p <= args.sweep_len - 16})
            try:
                rows, out["sweep"] = attention_sweep(model, kernels, args.sweep_len, positions, 3, shape["vocab_size"])
                print(table(rows), flush=True)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                failed = True
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.target and args.draft and args.prompts and not args.skip_part2:
        for i, kernel in enumerate(kernels):
            print(f"\n== speculative decoding, trained target + drafter, attention {kernel} ==", flush=True)
            try:
                sub = {}
                rows = part2(args.target, args.draft, args.prompts, ks, min(args.new_tokens, 128), args.limit,
                             device, dtype, sub, kernel)
                out["part2" if i == 0 else f"part2_{kernel}"] = sub["part2"]
                print(table(rows), flush=True)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                failed = True
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
