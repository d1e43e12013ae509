"""`eagle evaluate`: real greedy speculative decoding with the target and the drafter.

For each prompt: draft k tokens, verify them in one target forward, accept the longest matching
prefix plus the bonus token (eagle/decode.py). Reports

- accept_len: mean tokens per verify step, bonus included (vLLM's 1 + accepted / drafts);
- accept_rate_j: the fraction of verify steps whose first j+1 drafts were all accepted (vLLM's
  per-position counter divided by the number of drafts);
- greedy_match: 1 when every prompt's output equals transformers' own
  `generate(do_sample=False)` token for token, else 0 -- a check of the decoding code, not of the
  drafter (a random drafter must still give 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from eagle.common import EagleError, fail, pick_device, pick_dtype, print_kv, progress
from eagle.metrics import write_metrics


class PromptResult(BaseModel):
    prompt_tokens: int
    new_tokens: int
    verify_steps: int
    accepted: int
    matches_reference: bool | None = None
    first_mismatch: int | None = None


class EvalReport(BaseModel):
    k: int
    prompts: int
    accept_len: float
    accept_rates: list[float]
    greedy_match: int | None
    per_prompt: list[PromptResult]

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"accept_len": self.accept_len}
        out.update({f"accept_rate_{j}": r for j, r in enumerate(self.accept_rates)})
        if self.greedy_match is not None:
            out["greedy_match"] = self.greedy_match
        return out


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
                     device: Any, dtype: Any) -> list[list[int]]:
    """transformers' own greedy decoding of each prompt (the reference for greedy_match)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.generation_config.eos_token_id
        pad = pad[0] if isinstance(pad, list) else pad
    outs = []
    with torch.inference_mode():
        for ids in progress(prompts, desc="reference", unit="prompt"):
            x = torch.tensor([ids], device=device)
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                               do_sample=False, pad_token_id=pad)
            outs.append(y[0, len(ids):].tolist())
    del model
    return outs


def run_evaluate(model_dir: str | Path, draft_dir: str | Path, prompts: list[list[int]], k: int,
                 max_new_tokens: int, device: Any, dtype: Any, check: bool = True) -> EvalReport:
    from eagle.decode import load_decoder, required_len

    longest = max(len(p) for p in prompts)
    decoder = load_decoder(model_dir, draft_dir, max_len=required_len(longest, max_new_tokens, k),
                           device=device, dtype=dtype)
    outputs, all_accepted, per_prompt = [], [], []
    for ids in progress(prompts, desc="speculative", unit="prompt"):
        res = decoder.generate_speculative(ids, max_new_tokens, k)
        outputs.append(res.tokens)
        all_accepted.extend(res.accepted)
        per_prompt.append(PromptResult(prompt_tokens=len(ids), new_tokens=len(res.tokens),
                                       verify_steps=len(res.accepted), accepted=sum(res.accepted)))
    del decoder
    match = None
    if check:
        refs = reference_greedy(model_dir, prompts, max_new_tokens, device, dtype)
        for row, out, ref in zip(per_prompt, outputs, refs, strict=True):
            row.first_mismatch = first_mismatch(out, ref)
            row.matches_reference = row.first_mismatch is None
        match = int(all(r.matches_reference for r in per_prompt))
    accept_len, rates = acceptance_stats(all_accepted, k)
    return EvalReport(k=k, prompts=len(prompts), accept_len=accept_len, accept_rates=rates,
                      greedy_match=match, per_prompt=per_prompt)


def load_inputs(model: Path, prompts_file: Path, limit: int | None, draft: Path | None = None) -> list[list[int]]:
    """Shared input checks of evaluate / bench / probe; raises EagleError with a fix."""
    from eagle.prompts import PromptFileError, load_prompt_token_ids

    if not (model / "config.json").is_file():
        raise EagleError(f"{model}: not a model directory (no config.json); pass the target's save_pretrained dir")
    if draft is not None and not (draft / "config.json").is_file():
        raise EagleError(f"{draft}: not a drafter checkpoint (no config.json); pass `eagle train --out` DIR")
    try:
        return load_prompt_token_ids(model, prompts_file, limit)
    except PromptFileError as exc:
        raise EagleError(str(exc)) from exc


@click.command("evaluate")
@click.option("--model", "model", type=click.Path(path_type=Path), required=True, help="Target model dir.")
@click.option("--draft", "draft", type=click.Path(path_type=Path), required=True, help="Drafter checkpoint dir.")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), required=True,
              help="Prompts JSONL (OpenAI `messages`, ShareGPT `conversations` or `prompt`).")
@click.option("-k", "k", type=click.IntRange(1, 16), default=3, show_default=True, help="Draft tokens per step.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=None, help="Use only the first N prompts.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda[:N].")
@click.option("--dtype", default="auto", show_default=True, help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16.")
@click.option("--no-check", is_flag=True, help="Skip the token-for-token comparison with transformers' generate.")
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def command(model: Path, draft: Path, prompts_file: Path, k: int, max_new_tokens: int, limit: int | None,
            device: str, dtype: str, no_check: bool, as_json: bool) -> None:
    """Greedy speculative decoding: acceptance length, per-position acceptance, exactness.

    \b
    Metrics ($RUNBOOK_METRICS): accept_len (tokens per verify step, bonus included, as vLLM
    counts it), accept_rate_0 .. accept_rate_{k-1}, greedy_match (1 when the output equals
    transformers' greedy generate for every prompt). An untrained drafter gives accept_len ~1.0.

    \b
    Example:
      eagle evaluate --model work/target --draft work/draft --prompts plans/data/prompts.jsonl -k 3
    """
    try:
        prompts = load_inputs(model, prompts_file, limit, draft)
        dev = pick_device(device)
        report = run_evaluate(model, draft, prompts, k, max_new_tokens, dev, pick_dtype(dtype, dev),
                              check=not no_check)
    except (EagleError, ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    write_metrics(report.metrics())
    if as_json:
        click.echo(json.dumps(report.model_dump(), indent=1))
        return
    print_kv({"prompts": report.prompts, "k": k, **report.metrics()})
    if report.greedy_match == 0:
        bad = [i for i, r in enumerate(report.per_prompt) if not r.matches_reference]
        click.echo(f"warning: output differs from transformers' greedy decoding on prompts {bad[:10]}", err=True)
