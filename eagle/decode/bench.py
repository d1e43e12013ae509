"""`eagle bench`: tokens/s of plain greedy vs speculative decoding, and the Leviathan bound.

Both runs use the same decoder on the same prompts, after a warm-up: the fast one
(eagle/decode/fast.py: static KV cache, CUDA graphs on GPU) for Llama and Qwen3 targets, else the
generic one (eagle/decode/generic.py: the target's transformers forward); `decoder` says which. The Leviathan et al. (2023) bound: with per-token acceptance a, draft
length k and draft/target cost ratio c, a verify step yields (1 - a^(k+1)) / (1 - a) tokens on
average and costs k*c + 1 target steps, so speedup <= that / (k*c + 1). `a` is the i.i.d.
acceptance that reproduces the measured accept_len; `c` is measured (drafting time per cycle / k
/ one target decode step). bound_fraction = speedup / bound shows how much the decoder loses to
the verify step costing more than one decode step and to per-cycle overheads. best_k is the k in
1..K_MAX whose bound is highest at the same a and c (eagle/decode/leviathan.py: best_k), and
best_k_bound that bound: the draft length to bench and serve next, chosen for speed.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from eagle.decode.leviathan import acceptance_from_accept_len, best_k, leviathan_speedup


class BenchReport(BaseModel):
    k: int
    prompts: int
    device: str
    decoder: str = "fast"
    attention: str = "sdpa"  # the fast decoder's kernels that ran (--attention, auto resolved)
    plain_tokens: int
    spec_tokens: int
    plain_tok_s: float
    spec_tok_s: float
    speedup: float
    accept_len: float
    per_token_accept: float
    target_step_ms: float
    verify_ms: float
    draft_step_ms: float
    catchup_ms: float
    cost_ratio: float
    verify_cost: float
    leviathan_bound: float
    bound_fraction: float
    best_k: int  # the k in 1..K_MAX with the highest bound at the measured a and c
    best_k_bound: float  # the bound at best_k
    spec_matches_plain: bool
    spread: dict[str, float] = {}  # accept_len over the prompts (evaluate.prompt_spread)

    def metrics(self) -> dict[str, float]:
        names = ("plain_tok_s", "spec_tok_s", "speedup", "accept_len", "cost_ratio", "leviathan_bound",
                 "bound_fraction", "verify_cost", "best_k", "best_k_bound")
        return {**{n: getattr(self, n) for n in names}, **self.spread}


def run_bench(model_dir: Path, draft_dir: Path, prompts: list[list[int]], k: int, max_new_tokens: int,
              device, dtype, repeats: int = 1, decoder: str = "auto", trust_remote_code: bool = False,
              attention: str = "auto") -> BenchReport:
    from eagle.decode.factory import load_decoder
    from eagle.decode.interface import required_len, synchronize

    longest = max(len(p) for p in prompts)
    dec = load_decoder(model_dir, draft_dir, max_len=required_len(longest, max_new_tokens, k),
                       device=device, dtype=dtype, path=decoder, trust_remote_code=trust_remote_code,
                       attention=attention)

    dec.generate_greedy(prompts[0], max_new_tokens)  # warm-up: graph capture, allocator, caches
    dec.generate_speculative(prompts[0], max_new_tokens, k)
    from eagle.decode.evaluate import PromptResult, prompt_spread

    plain_out, spec_out, accepted, rows = [], [], [], []
    plain_s = spec_s = 0.0
    for _ in range(repeats):
        for ids in prompts:
            synchronize(dec.device)
            t0 = time.perf_counter()
            out = dec.generate_greedy(ids, max_new_tokens)
            synchronize(dec.device)
            plain_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            res = dec.generate_speculative(ids, max_new_tokens, k)
            synchronize(dec.device)
            spec_s += time.perf_counter() - t0
            plain_out.append(out)
            spec_out.append(res.tokens)
            accepted.extend(res.accepted)
            rows.append(PromptResult(prompt_tokens=len(ids), new_tokens=len(res.tokens), verify_steps=len(res.accepted),
                                     accepted=sum(res.accepted)))
    stages = dec.time_stages(k, prompts[0])
    plain_tokens = sum(len(o) for o in plain_out)
    spec_tokens = sum(len(o) for o in spec_out)
    plain_tok_s, spec_tok_s = plain_tokens / plain_s, spec_tokens / spec_s
    accept_len = 1.0 + sum(accepted) / len(accepted) if accepted else 1.0
    accept_len = min(accept_len, k + 1.0)
    a = acceptance_from_accept_len(accept_len, k)
    step = stages["target_step"]
    c = ((k - 1) * stages["draft_step"] + stages["catchup"]) / k / step
    bound = leviathan_speedup(a, k, c)
    k_best, k_best_bound = best_k(a, c)
    speedup = spec_tok_s / plain_tok_s
    return BenchReport(
        k=k, prompts=len(prompts), device=str(dec.device), decoder=dec.path, attention=dec.attention,
        plain_tokens=plain_tokens, spec_tokens=spec_tokens,
        plain_tok_s=plain_tok_s, spec_tok_s=spec_tok_s, speedup=speedup, accept_len=accept_len,
        per_token_accept=a, target_step_ms=1e3 * step, verify_ms=1e3 * stages["verify"],
        draft_step_ms=1e3 * stages["draft_step"], catchup_ms=1e3 * stages["catchup"], cost_ratio=c,
        verify_cost=stages["verify"] / step, leviathan_bound=bound, bound_fraction=speedup / bound,
        best_k=k_best, best_k_bound=k_best_bound,
        spec_matches_plain=plain_out == spec_out, spread=prompt_spread(rows))
