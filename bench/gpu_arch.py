"""The generic decoding path on an 8B-shape Qwen3 (issue 15): one device call, one table.

    python -m bench.gpu_arch --out DIR            # H200: 8B Qwen3 shape, random bf16 weights, in memory
    python -m bench.gpu_arch --out DIR --cli      # also save it and run `eagle evaluate --decoder generic`
    python -m bench.gpu_arch --out DIR --smoke    # tiny shapes, on the CPU

1. Builds a Qwen3 of Qwen3-8B's shape (hidden 4096, 36 layers, intermediate 12288, 32 / 8 heads of
   128, vocab 151936) with random bf16 weights on the device, and a random EAGLE-3 drafter for it
   (eagle/decode/draft_infer.py's Drafter: one Llama layer of the target's shape, draft vocab 32000).
2. Decodes with the generic path (eagle/decode/generic.py: the target's own transformers forward
   with a DynamicCache, the path every architecture the fast decoder lacks takes): speculative and
   plain greedy on the same random prompts (greedy_match), as `eagle evaluate --decoder generic`
   does; with --cli, also that command itself on the saved model (16 GB written and read back).
3. Times one decode step (1 token after a 128-token prompt) and the (k+1)-token verify of: the
   generic path on that Qwen3, the fast decoder's CUDA graph on the same weights (eagle/decode/fast.py
   implements Qwen3), and the fast decoder on the 8B Llama shape of bench/gpu_decode.py; each
   against its bandwidth bound (weight bytes read per token, embedding excluded, over the measured
   device-to-device copy bandwidth). Rows are printed as they are measured.

Writes DIR/gpu_arch.json with every number. Random weights: speed only (acceptance is ~1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.harness import copy_bandwidth
from bench.shapes import LLAMA_8B, random_hf
from bench.shapes import random_fast_target as random_target
from eagle.decode.fast import Decoder, TargetModel
from eagle.decode.generic import GenericDecoder
from eagle.decode.interface import required_len

QWEN3_8B = {"hidden_size": 4096, "num_hidden_layers": 36, "intermediate_size": 12288, "vocab_size": 151936,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
SMOKE_QWEN3 = {"hidden_size": 128, "num_hidden_layers": 8, "intermediate_size": 256, "vocab_size": 2048,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
SMOKE_LLAMA = {"hidden_size": 128, "num_hidden_layers": 8, "intermediate_size": 256, "vocab_size": 2048,
               "num_attention_heads": 4, "num_key_value_heads": 2}
PROMPT_LEN, K = 128, 3


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes read per decoded token: every weight except the input embedding (a row gather)."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else model.embed_tokens
    skip = {id(p) for p in embed.parameters()}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skip)


def build_qwen3(shape: dict, out: Path | None, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A random Qwen3 of `shape` on `device` (the toy tokenizer's special ids: 0 pad, 5 eos)."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**shape, max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-6,
                      eos_token_id=5, pad_token_id=0, bos_token_id=None)
    model = random_hf(Qwen3ForCausalLM, cfg, device, dtype)  # in bf16 directly: no fp32 copy of 8B weights
    model.generation_config = GenerationConfig(eos_token_id=5, pad_token_id=0)
    return model


def step_row(name: str, model_name: str, step_s: float, wbytes: int, bandwidth: float) -> dict:
    bound = bandwidth / wbytes
    return {"path": name, "model": model_name, "step_ms": 1e3 * step_s, "tok_s": 1 / step_s,
            "bound_tok_s": bound, "fraction": (1 / step_s) / bound, "weight_gb": wbytes / 1e9}


def random_drafter(shape: dict, model: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                   draft_vocab: int) -> torch.nn.Module:
    """An untrained EAGLE-3 drafter for `model`: one Llama layer of the target's shape, its embedding."""
    from transformers import LlamaConfig

    from eagle.decode.draft_infer import Drafter, DraftSpec
    from eagle.decode.llama_ops import Rope, rope_inv_freq

    n = shape["num_hidden_layers"]
    cfg = LlamaConfig(**{**shape, "num_hidden_layers": 1}, rms_norm_eps=1e-6, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    spec = DraftSpec(layer_config=cfg, draft_vocab_size=draft_vocab, target_hidden_size=shape["hidden_size"],
                     layer_ids=[2, n // 2, n - 3], norm_before_residual=False, norm_before_fc=False, fc_norm=False,
                     norm_output=False, speculative_tokens=K)
    torch.manual_seed(1)
    drafter = Drafter(spec, device=device, dtype=dtype).eval()
    top = torch.sort(torch.randperm(shape["vocab_size"], device=device)[:draft_vocab]).values
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
        drafter.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        drafter.d2t.copy_(top - torch.arange(draft_vocab, device=device))
    inv_freq, scaling = rope_inv_freq(cfg)
    drafter.rope = Rope(inv_freq.to(device), scaling)
    return drafter


def fast_from(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> TargetModel:
    """The fast decoder's module with the weights of the transformers model (no second load from disk)."""
    from eagle.decode.llama_ops import Rope, check_and_assign, rope_inv_freq

    tensors = {k.removeprefix("model."): v for k, v in model.state_dict().items() if "rotary_emb" not in k}
    fast = TargetModel(model.config, device="meta")
    check_and_assign(fast, tensors, "qwen3", device, dtype)
    inv_freq, scaling = rope_inv_freq(model.config)
    fast.rope = Rope(inv_freq.to(device), scaling)
    return fast.eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    ap.add_argument("--cli", action="store_true", help="also save the target and run `eagle evaluate` on it")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--no-llama", action="store_true", help="skip the Llama 8B row (docs/benchmarks.md has it)")
    a = ap.parse_args()
    device = torch.device("cpu" if a.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    qshape, lshape = (SMOKE_QWEN3, SMOKE_LLAMA) if a.smoke else (QWEN3_8B, LLAMA_8B)
    a.out.mkdir(parents=True, exist_ok=True)
    import transformers

    result: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "transformers": transformers.__version__, "dtype": str(dtype),
                    "qwen3_shape": qshape, "llama_shape": lshape, "steps": []}
    t0 = time.perf_counter()

    def save() -> None:
        result["seconds"] = round(time.perf_counter() - t0, 1)
        (a.out / "gpu_arch.json").write_text(json.dumps(result, indent=1))

    bandwidth = copy_bandwidth(device, (1 << 30) if device.type == "cuda" else (1 << 24))
    result["copy_bandwidth"] = bandwidth
    print(f"device {result['device']}, torch {result['torch']}, transformers {result['transformers']}, {dtype}; "
          f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; prompt {PROMPT_LEN} tokens, k = {K}", flush=True)
    print(f"{'t s':>5}  {'path':36} {'model':9} {'step ms':>8} {'tok/s':>6} {'bound':>6} {'of bound':>8} "
          f"{'verify ms':>9}", flush=True)

    def row(name: str, model_name: str, st: dict, wbytes: int) -> None:
        r = step_row(name, model_name, st["target_step"], wbytes, bandwidth)
        r["verify_ms"] = 1e3 * st["verify"]
        result["steps"].append(r)
        save()
        print(f"{time.perf_counter() - t0:5.0f}  {r['path']:36} {r['model']:9} {r['step_ms']:8.2f} {r['tok_s']:6.0f} "
              f"{r['bound_tok_s']:6.0f} {100 * r['fraction']:7.0f}% {r['verify_ms']:9.2f}", flush=True)

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(10, qshape["vocab_size"], (PROMPT_LEN,), generator=g).tolist()
    model = build_qwen3(qshape, None, device, dtype)
    wq = weight_bytes(model)
    # 1. the generic path: speculative decoding == plain greedy, and the step's cost
    drafter = random_drafter(qshape, model, device, dtype, 32000 if not a.smoke else 256)
    gen = GenericDecoder(model, drafter, max_len=required_len(PROMPT_LEN, 64, K),
                         layer_ids=drafter.spec.layer_ids)
    spec = gen.generate_speculative(prompt, 32, K)
    plain = gen.generate_greedy(prompt, 32)
    result["generic_decode"] = {"new_tokens": len(spec.tokens), "accept_len": spec.accept_len,
                                "greedy_match": int(spec.tokens == plain), "decode_s": gen.last_timing["decode_s"]}
    row("generic (transformers + DynamicCache)", "Qwen3 8B", gen.time_stages(K, prompt, iters=10), wq)
    gen.close()
    del gen
    # 2. the fast decoder on the same weights
    dec = Decoder(fast_from(model, device, dtype), None, max_len=required_len(PROMPT_LEN, 64, K))
    row("fast (CUDA graph)" if dec.use_graphs else "fast (eager)", "Qwen3 8B", dec.time_stages(K, prompt, iters=30),
        wq)
    del dec, drafter
    if a.cli:
        run_cli(model, qshape, a.workdir or Path(tempfile.mkdtemp(prefix="gpu-arch-")), device, dtype, result)
        save()
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    gd = result["generic_decode"]
    print(f"generic path on the 8B Qwen3: {gd['new_tokens']} tokens, speculative == plain greedy: "
          f"{bool(gd['greedy_match'])}, accept_len {gd['accept_len']:.2f} (random drafter)", flush=True)
    if a.no_llama:
        return
    # 3. the fast decoder on the 8B Llama shape (bench/gpu_decode.py's)
    llama = random_target(lshape, device, dtype)
    dec = Decoder(llama, None, max_len=required_len(PROMPT_LEN, 64, K))
    row("fast (CUDA graph)" if dec.use_graphs else "fast (eager)", "Llama 8B",
        dec.time_stages(K, [t % lshape["vocab_size"] for t in prompt], iters=30), weight_bytes(llama))
    save()


def run_cli(model: torch.nn.Module, shape: dict, work: Path, device: torch.device, dtype: torch.dtype,
            result: dict) -> None:
    """Save the target with a tokenizer and a speculators drafter, then run `eagle evaluate --decoder generic`."""
    from eagle.drafter import model as edr
    from eagle.target import open_target
    from eagle.toy import build_tokenizer, make_prompts

    target, draft, prompts = work / "qwen3-8b", work / "qwen3-8b-eagle3", work / "prompts.jsonl"
    tok = build_tokenizer(shape["vocab_size"])
    model.save_pretrained(str(target))
    tok.save_pretrained(str(target))
    t = open_target(target)
    top = torch.sort(torch.randperm(t.vocab_size)[:32000]).values
    t2d = torch.zeros(t.vocab_size, dtype=torch.bool)
    t2d[top] = True
    d2t = top - torch.arange(32000)
    edr.save(edr.build_drafter(target, layer_ids=t.default_layer_ids(), d2t=d2t, t2d=t2d, ttt_steps=K), draft)
    prompts.write_text("".join(json.dumps(r) + "\n" for r in make_prompts(2, salt=3)))
    cmd = [sys.executable, "-m", "eagle.cli", "evaluate", "--model", str(target), "--draft", str(draft),
           "--prompts", str(prompts), "-k", str(K), "--max-new-tokens", "32", "--decoder", "generic",
           "--device", device.type, "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    ev = {"command": " ".join(cmd[1:]), "rc": proc.returncode, "stderr_tail": proc.stderr[-1500:]}
    if proc.returncode == 0:
        rep = json.loads(proc.stdout)
        ev.update({k: rep[k] for k in ("decoder", "dtype", "accept_len", "greedy_match", "prompts")})
    result["evaluate_cli"] = ev
    print(f"eagle evaluate --decoder generic: rc {ev['rc']}, decoder {ev.get('decoder')}, "
          f"greedy_match {ev.get('greedy_match')}", flush=True)


if __name__ == "__main__":
    main()
