"""`eagle evaluate`: greedy speculative decoding, acceptance and exactness (eagle/decode/evaluate.py). The
verb's options, its refusals and its table.
"""

from __future__ import annotations

from pathlib import Path

import click

from eagle.commands._options import (
    attention_option,
    decoder_option,
    device_option,
    dtype_option,
    finish,
    json_option,
    refusals,
    sampling_of,
    sampling_options,
    suite_format_option,
    trust_remote_code_option,
)
from eagle.common import quiet_hf, warn
from eagle.decode.evaluate import load_suite_inputs, run_evaluate


@click.command("evaluate")
@click.option("--model", "model", type=click.Path(path_type=Path), required=True, help="Target model dir.")
@click.option("--draft", "draft", type=click.Path(path_type=Path), required=True, help="Drafter checkpoint dir.")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), required=True,
              help="Prompts: JSONL (OpenAI `messages`, ShareGPT `conversations` or `prompt`) or a standard suite "
                   "(MT-Bench question.jsonl, SPEED-Bench, GSM8K, HumanEval; see --suite-format).")
@click.option("-k", "k", type=click.IntRange(1, 16), default=3, show_default=True, help="Draft tokens per step.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=None, help="Use only the first N prompts.")
@device_option()
@dtype_option()
@click.option("--check/--no-check", "check", default=None,
              help="Compare the output with transformers' generate token for token (generate_match) "
                   "[default: in float32 only].")
@decoder_option
@attention_option
@trust_remote_code_option
@sampling_options
@suite_format_option
@json_option("Print the full report as JSON.")
def command(model: Path, draft: Path, prompts_file: Path, k: int, max_new_tokens: int, limit: int | None,
            device: str, dtype: str, check: bool | None, decoder: str, attention: str, trust_remote_code: bool,
            temperature: float, top_p: float, seed: int, suite_format: str, as_json: bool) -> None:
    """Greedy speculative decoding: acceptance length, per-position acceptance, exactness.

    \b
    Metrics ($RUNBOOK_METRICS): accept_len (tokens per verify step, bonus included, as vLLM
    counts it), accept_rate_0 .. accept_rate_{k-1}, greedy_match (1 when the speculative output
    equals plain greedy decoding with the same decoder and dtype for every prompt), generate_match
    (1 when it also equals transformers' generate; float32 by default), fast_decoder (1 fast path,
    0 generic). An untrained drafter gives accept_len ~1.0.

    \b
    With --temperature T > 0 (and --top-p, --seed), each prompt is also decoded sampled, drafts
    accepted by rejection sampling as vLLM does it (accept x with p_target(x) / p_draft(x), drafts
    greedy), reported beside the greedy figures: sampled_accept_len, sampled_accept_rate_0 ..,
    sample_temperature, sample_top_p. The same --seed gives the same numbers.

    \b
    Standard suites (MT-Bench, SPEED-Bench, GSM8K, HumanEval files in their published formats)
    add accept_len_suite_<suite> and accept_len_cat_<category> per category (sampled_... too).
    The spread over the prompts: accept_len_min / accept_len_max (the lowest and highest prompt's)
    and accept_len_ci_lo / accept_len_ci_hi (a 95% interval of accept_len, the prompts resampled).

    \b
    Examples:
      eagle evaluate --model work/target --draft work/draft --prompts plans/data/prompts.jsonl -k 3
      eagle evaluate --model work/target --draft work/draft --prompts plans/data/prompts.jsonl -k 3 \\
          --temperature 1.0 --top-p 0.95 --seed 0
    """
    quiet_hf()
    with refusals(ValueError, FileNotFoundError):
        suite, dev, dt = load_suite_inputs(model, prompts_file, limit, draft, trust_remote_code, device, dtype,
                                           attention, suite_format)
        report = run_evaluate(model, draft, suite.token_ids, k, max_new_tokens, dev, dt, check=check,
                              decoder=decoder, trust_remote_code=trust_remote_code, attention=attention,
                              sampling=sampling_of(temperature, top_p, seed), categories=suite.categories,
                              suite=suite.format)

    def mismatches() -> None:
        if report.greedy_match == 0:
            bad = [i for i, r in enumerate(report.per_prompt) if not r.matches_greedy]
            warn(f"speculative output differs from plain greedy decoding on prompts {bad[:10]} "
                 f"({report.decoder} decoder): a decoding bug")
        if report.generate_match == 0:
            bad = [i for i, r in enumerate(report.per_prompt) if not r.matches_reference]
            warn(f"output differs from transformers' generate on prompts {bad[:10]}")

    finish(report, as_json, metrics=report.metrics(), show=mismatches,
           table={"prompts": report.prompts, "k": k, "decoder": report.decoder, "attention": report.attention,
                  "dtype": report.dtype,
                  **{m: v for m, v in report.metrics().items() if m != "fast_decoder"}})
