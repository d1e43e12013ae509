"""`eagle evaluate`: real greedy speculative decoding with the target and the drafter.

For each prompt: draft k tokens, verify them in one target forward, accept the longest matching
prefix plus the bonus token. Llama and Qwen3 targets decode with the fast decoder
(eagle/decode/fast.py: static cache, CUDA graphs on GPU); every other architecture (DeepSeek-V3 / Kimi,
multimodal wrappers, custom code) through its own transformers forward with a KV cache
(eagle/decode/generic.py); `--decoder` forces one, and the report says which ran. Reports

- accept_len: mean tokens per verify step, bonus included (vLLM's 1 + accepted / drafts);
- accept_rate_j: the fraction of verify steps whose first j+1 drafts were all accepted (vLLM's
  per-position counter divided by the number of drafts);
- greedy_match: 1 when every prompt's speculative output equals plain greedy decoding with the same
  decoder and dtype, else 0 -- exact by construction, so a 0 is a bug in the decoding code (a
  random drafter must still give 1);
- generate_match: 1 when every output also equals transformers' own `generate(do_sample=False)`;
  computed in float32 only by default (bf16 rounding flips near-tied logits between two
  implementations, which would read as failures), or never with --no-check;
- with --temperature > 0 (the production sampler: --top-p, --seed), beside the greedy figures:
  sampled_accept_len and sampled_accept_rate_j from a second, sampled speculative decoding of each
  prompt (rejection sampling, eagle/decode/sampling.py), each prompt with its own generator seeded
  from --seed (serving.client.request_seed), so a run is reproducible; sample_temperature and
  sample_top_p say which sampler. At temperature 0 nothing of this runs: the greedy report is the
  same with or without the flags;
- per suite and category (eagle/prompts.py reads MT-Bench, SPEED-Bench, GSM8K and HumanEval files
  besides chat files): accept_len_suite_<suite> for a standard suite, accept_len_cat_<category>
  for each category its prompts carry (and sampled_accept_len_suite_ / _cat_ with a sampler);
  the report's `by_category` has each category's prompts, verify steps and acceptance;
- accept_len's spread over the prompts (`prompt_spread`): accept_len_min / accept_len_max, the lowest
  and highest prompt's, and accept_len_ci_lo / accept_len_ci_hi, a 95% interval of the run's figure
  from resampling the prompts (a percentile bootstrap, seeded: the same prompts give the same interval).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from eagle.common import EagleError, check_file, pick_device, pick_dtype, progress
from eagle.prompts import TokenizedSuite, metric_key
from eagle.serving.client import Sampling, request_seed

if TYPE_CHECKING:
    import torch


class PromptResult(BaseModel):
    prompt_tokens: int
    new_tokens: int
    verify_steps: int
    accepted: int
    matches_greedy: bool | None = None  # speculative output == plain greedy (same decoder, dtype)
    first_greedy_mismatch: int | None = None
    matches_reference: bool | None = None  # speculative output == transformers' generate
    first_mismatch: int | None = None
    sampled_tokens: list[int] | None = None  # the sampled speculative output (--temperature > 0)
    sampled_accepted: list[int] | None = None  # drafts accepted per verify step of that run


class CategoryAcceptance(BaseModel):
    """One category's share of a run (or the whole suite's): prompts, verify steps, acceptance."""

    prompts: int
    verify_steps: int
    accept_len: float
    sampled_accept_len: float | None = None


class EvalReport(BaseModel):
    k: int
    prompts: int
    decoder: str = "fast"  # which path decoded: fast (eagle/decode/fast.py) or generic (transformers forward)
    attention: str = "sdpa"  # the fast decoder's kernels that ran (--attention, auto resolved)
    dtype: str = "float32"
    accept_len: float
    accept_rates: list[float]
    greedy_match: int | None
    generate_match: int | None = None
    sampling: Sampling | None = None  # the sampler of the sampled figures (None: greedy only)
    sampled_accept_len: float | None = None
    sampled_accept_rates: list[float] | None = None
    suite: str | None = None  # the prompt file's format (eagle/prompts.py): chat, mt-bench, gsm8k, ...
    by_category: dict[str, CategoryAcceptance] = {}  # the prompts' categories, where they carry one
    spread: dict[str, float] = {}  # prompt_spread: accept_len_min / _max / _ci_lo / _ci_hi
    per_prompt: list[PromptResult]

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"accept_len": self.accept_len}
        out.update({f"accept_rate_{j}": r for j, r in enumerate(self.accept_rates)})
        if self.greedy_match is not None:
            out["greedy_match"] = self.greedy_match
        if self.generate_match is not None:
            out["generate_match"] = self.generate_match
        out.update(self.spread)
        out["fast_decoder"] = int(self.decoder == "fast")
        if self.sampling is not None and self.sampled_accept_len is not None:
            out["sampled_accept_len"] = self.sampled_accept_len
            out.update({f"sampled_accept_rate_{j}": r for j, r in enumerate(self.sampled_accept_rates or [])})
            out["sample_temperature"] = self.sampling.temperature
            out["sample_top_p"] = self.sampling.top_p
        groups = [(f"suite_{metric_key(self.suite)}", self.sampled_accept_len, self.accept_len)] \
            if self.suite not in (None, "chat") else []
        groups += [(f"cat_{metric_key(name)}", c.sampled_accept_len, c.accept_len)
                   for name, c in self.by_category.items()]
        for key, sampled, greedy in groups:
            out[f"accept_len_{key}"] = greedy
            if sampled is not None and self.sampling is not None:
                out[f"sampled_accept_len_{key}"] = sampled
        return out


def by_category(categories: Sequence[str | None], rows: Sequence[PromptResult], k: int) -> dict[str, CategoryAcceptance]:
    """Each category's acceptance (greedy, and sampled where the rows carry it), in first-seen order;
    prompts without a category are left out."""
    out: dict[str, CategoryAcceptance] = {}
    for name in dict.fromkeys(c for c in categories if c is not None):
        mine = [r for c, r in zip(categories, rows, strict=True) if c == name]
        steps = sum(r.verify_steps for r in mine)
        sampled = [m for r in mine for m in (r.sampled_accepted or [])]
        out[name] = CategoryAcceptance(
            prompts=len(mine), verify_steps=steps,
            accept_len=1.0 + sum(r.accepted for r in mine) / steps if steps else float("nan"),
            sampled_accept_len=acceptance_stats(sampled, k)[0] if any(r.sampled_accepted is not None for r in mine)
            else None)
    return out


def prompt_spread(rows: Sequence[PromptResult], resamples: int = 2000, seed: int = 0) -> dict[str, float]:
    """accept_len's spread over the prompts: the lowest and highest prompt's (accept_len_min / _max),
    and a 95% interval of the run's own figure, 1 + accepted / verify steps over all prompts
    (accept_len_ci_lo / _hi): the prompts drawn with replacement `resamples` times, each draw's pooled
    figure, the 2.5th and 97.5th percentiles (seeded, so the same prompts give the same interval).
    Empty with fewer than two prompts that took a verify step."""
    import random

    used = [(r.accepted, r.verify_steps) for r in rows if r.verify_steps > 0]
    if len(used) < 2:
        return {}
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        pick = [used[rng.randrange(len(used))] for _ in used]
        draws.append(1.0 + sum(a for a, _ in pick) / sum(n for _, n in pick))
    draws.sort()
    each = [1.0 + a / n for a, n in used]
    return {"accept_len_min": min(each), "accept_len_max": max(each),
            "accept_len_ci_lo": draws[int(0.025 * (resamples - 1))], "accept_len_ci_hi": draws[int(0.975 * (resamples - 1))]}


def acceptance_stats(accepted_per_step: list[int], k: int) -> tuple[float, list[float]]:
    """(accept_len, per-position rates) from the drafts accepted at each verify step."""
    steps = len(accepted_per_step)
    if steps == 0:
        return float("nan"), [float("nan")] * k
    accept_len = 1.0 + sum(accepted_per_step) / steps
    rates = [sum(1 for m in accepted_per_step if m > j) / steps for j in range(k)]
    return accept_len, rates


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def reference_greedy(model_dir: str | Path, prompts: list[list[int]], max_new_tokens: int,
                     device: Any, dtype: Any, trust_remote_code: bool = False) -> list[list[int]]:
    """transformers' own greedy decoding of each prompt (the reference for generate_match)."""
    import torch

    from eagle.target import input_device, open_target

    target = open_target(model_dir, trust_remote_code)
    model = target.load_model(device, dtype)
    dev = input_device(model)
    gen = model.generation_config
    pad = gen.pad_token_id
    if pad is None:
        pad = gen.eos_token_id if gen.eos_token_id is not None else (target.eos_ids() or [0])
        pad = pad[0] if isinstance(pad, list) else pad
    eos = target.eos_ids() or None
    outs = []
    with torch.inference_mode():
        for ids in progress(prompts, desc="reference", unit="prompt"):
            x = torch.tensor([ids], device=dev)
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                               do_sample=False, pad_token_id=pad, eos_token_id=eos)
            outs.append(y[0, len(ids):].tolist())
    del model
    return outs


def run_evaluate(model_dir: str | Path, draft_dir: str | Path, prompts: list[list[int]], k: int,
                 max_new_tokens: int, device: Any, dtype: Any, check: bool | None = True, decoder: str = "auto",
                 trust_remote_code: bool = False, attention: str = "auto",
                 sampling: Sampling | None = None, categories: Sequence[str | None] | None = None,
                 suite: str | None = None) -> EvalReport:
    """check: compare with transformers' generate (True), skip it (False), or do it in float32 only (None).
    sampling with temperature > 0: also a sampled speculative run of each prompt (module docstring).
    categories (one per prompt) and suite: the acceptance per category and the suite's name."""
    import torch

    from eagle.decode.factory import load_decoder
    from eagle.decode.interface import required_len
    from eagle.decode.sampling import Sampler, check_sampling

    if sampling is not None:
        bad = check_sampling(sampling)
        if bad is not None:
            raise EagleError(bad, code=2)
        if sampling.temperature == 0:
            sampling = None  # greedy: exactly the run without the flags

    longest = max(len(p) for p in prompts)
    dec = load_decoder(model_dir, draft_dir, max_len=required_len(longest, max_new_tokens, k),
                       device=device, dtype=dtype, path=decoder, trust_remote_code=trust_remote_code,
                       attention=attention)
    outputs, all_accepted, per_prompt, sampled_accepted = [], [], [], []
    for i, ids in enumerate(progress(prompts, desc=f"speculative ({dec.path})", unit="prompt")):
        res = dec.generate_speculative(ids, max_new_tokens, k)
        plain = dec.generate_greedy(ids, max_new_tokens)
        outputs.append(res.tokens)
        all_accepted.extend(res.accepted)
        miss = first_mismatch(res.tokens, plain)
        row = PromptResult(prompt_tokens=len(ids), new_tokens=len(res.tokens), verify_steps=len(res.accepted),
                           accepted=sum(res.accepted), matches_greedy=miss is None, first_greedy_mismatch=miss)
        if sampling is not None:
            sampled = dec.generate_speculative(ids, max_new_tokens, k,
                                               sampler=Sampler(sampling, dec.device, request_seed(sampling.seed, i)))
            row.sampled_tokens, row.sampled_accepted = sampled.tokens, sampled.accepted
            sampled_accepted.extend(sampled.accepted)
        per_prompt.append(row)
    path, attention = dec.path, dec.attention
    del dec
    generate_match = None
    if check is None:
        check = dtype == torch.float32
    if check:
        refs = reference_greedy(model_dir, prompts, max_new_tokens, device, dtype, trust_remote_code)
        for row, out, ref in zip(per_prompt, outputs, refs, strict=True):
            row.first_mismatch = first_mismatch(out, ref)
            row.matches_reference = row.first_mismatch is None
        generate_match = int(all(r.matches_reference for r in per_prompt))
    accept_len, rates = acceptance_stats(all_accepted, k)
    report = EvalReport(k=k, prompts=len(prompts), decoder=path, attention=attention,
                        dtype=str(dtype).removeprefix("torch."), accept_len=accept_len, accept_rates=rates,
                        greedy_match=int(all(r.matches_greedy for r in per_prompt)), generate_match=generate_match,
                        per_prompt=per_prompt, suite=suite, spread=prompt_spread(per_prompt))
    if sampling is not None:
        report.sampling = sampling
        report.sampled_accept_len, report.sampled_accept_rates = acceptance_stats(sampled_accepted, k)
    if categories is not None:
        report.by_category = by_category(categories, per_prompt, k)
    return report


def load_inputs(model: Path, prompts_file: Path, limit: int | None, draft: Path | None, trust_remote_code: bool,
                device: str, dtype: str, attention: str = "auto",
                suite_format: str = "auto") -> tuple[list[list[int]], torch.device, torch.dtype]:
    """The shared inputs of evaluate / bench / probe: the prompts' token ids, the device and the dtype,
    after checking the attention kernel can run on the device (first: it needs no file), the target
    and the drafter; raises EagleError with a fix."""
    suite, dev, dt = load_suite_inputs(model, prompts_file, limit, draft, trust_remote_code, device, dtype, attention,
                                       suite_format)
    return suite.token_ids, dev, dt


def load_suite_inputs(model: Path, prompts_file: Path, limit: int | None, draft: Path | None,
                      trust_remote_code: bool, device: str, dtype: str, attention: str = "auto",
                      suite_format: str = "auto") -> tuple[TokenizedSuite, torch.device, torch.dtype]:
    """load_inputs with the whole suite (its format and the prompts' categories besides the ids)."""
    from eagle.prompts import PromptFileError, load_prompt_suite
    from eagle.target import open_target

    if attention == "triton":
        from eagle.decode.triton_attention import require

        require(pick_device(device))
    open_target(model, trust_remote_code)
    if draft is not None and not check_file(draft / "config.json", "JSON file"):  # a FIFO: named as one
        raise EagleError(f"{draft}: not a drafter checkpoint (no config.json); pass `eagle train --out` DIR")
    try:
        suite = load_prompt_suite(model, prompts_file, limit, trust_remote_code, suite_format)
    except PromptFileError as exc:
        raise EagleError(str(exc)) from exc
    dev = pick_device(device)
    return suite, dev, pick_dtype(dtype, dev)
