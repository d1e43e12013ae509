"""`eagle bench`: tok/s of plain vs speculative decoding (eagle/decode/bench.py). The verb's options, its
refusals and its table.
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
    trust_remote_code_option,
)
from eagle.common import quiet_hf, warn
from eagle.decode.bench import run_bench
from eagle.decode.evaluate import load_inputs


@click.command("bench")
@click.option("--model", "model", type=click.Path(path_type=Path), required=True, help="Target model dir.")
@click.option("--draft", "draft", type=click.Path(path_type=Path), required=True, help="Drafter checkpoint dir.")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), required=True, help="Prompts JSONL.")
@click.option("-k", "k", type=click.IntRange(1, 16), default=3, show_default=True, help="Draft tokens per step.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=None, help="Use only the first N prompts.")
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True, help="Timed passes over the prompts.")
@device_option()
@dtype_option()
@decoder_option
@attention_option
@trust_remote_code_option
@json_option("Print the full report as JSON.")
def command(model: Path, draft: Path, prompts_file: Path, k: int, max_new_tokens: int, limit: int | None,
            repeats: int, device: str, dtype: str, decoder: str, attention: str, trust_remote_code: bool,
            as_json: bool) -> None:
    """tok/s of plain greedy vs speculative decoding, cost ratio, Leviathan bound.

    \b
    Metrics ($RUNBOOK_METRICS): plain_tok_s, spec_tok_s, speedup, accept_len, cost_ratio (drafting
    time per draft token / one target decode step), verify_cost (the k+1-token verify step / one
    decode step), leviathan_bound ((1-a^(k+1))/(1-a) / (k*c+1) for the measured acceptance),
    bound_fraction (speedup / leviathan_bound), best_k (the k in 1..8 with the highest bound at the
    measured a and c: the draft length to bench and serve next) and best_k_bound (the bound there).
    The bound assumes i.i.d. per-token acceptance a, estimated from the accept_len measured at -k.

    \b
    Example:
      eagle bench --model work/target --draft work/draft --prompts plans/data/prompts.jsonl -k 3
    """
    quiet_hf()
    with refusals(ValueError, FileNotFoundError):
        prompts, dev, dt = load_inputs(model, prompts_file, limit, draft, trust_remote_code, device, dtype, attention)
        report = run_bench(model, draft, prompts, k, max_new_tokens, dev, dt, repeats,
                           decoder, trust_remote_code, attention)
    if not report.spec_matches_plain:
        warn("speculative output differs from plain greedy output (see `eagle evaluate`)")
    finish(report, as_json, metrics=report.metrics(), table={
        "device": report.device, "decoder": report.decoder, "attention": report.attention, "k": k, "prompts": report.prompts,
        "plain_tok_s": report.plain_tok_s, "spec_tok_s": report.spec_tok_s, "speedup": report.speedup,
        "accept_len": report.accept_len, "per_token_accept": report.per_token_accept,
        "target_step_ms": report.target_step_ms, "verify_ms": report.verify_ms,
        "verify_cost": report.verify_cost, "cost_ratio": report.cost_ratio,
        "leviathan_bound": report.leviathan_bound, "bound_fraction": report.bound_fraction,
        "best_k": report.best_k, "best_k_bound": report.best_k_bound})
