"""`eagle probe`: how alike two targets are (eagle/decode/probe.py). The verb's options, its refusals and
its table.
"""

from __future__ import annotations

from pathlib import Path

import click

from eagle.commands._options import (
    decoder_option,
    device_option,
    dtype_option,
    finish,
    json_option,
    refusals,
    trust_remote_code_option,
)
from eagle.common import print_table, quiet_hf
from eagle.decode.evaluate import load_inputs
from eagle.decode.probe import parse_layer_ids, run_probe


@click.command("probe")
@click.option("--model", "model", type=click.Path(path_type=Path), required=True,
              help="The target the drafter was trained for.")
@click.option("--other", "other", type=click.Path(path_type=Path), required=True,
              help="The target to compare with (e.g. its successor).")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), required=True, help="Prompts JSONL.")
@click.option("--draft", "draft", type=click.Path(path_type=Path), default=None,
              help="Drafter trained for --model: also measure its accept_len on --other.")
@click.option("--layer-ids", default=None, help="Aux layers to compare, e.g. 2,4,5 (default: the drafter's, "
              "else [2, N//2, N-3]).")
@click.option("-k", "k", type=click.IntRange(1, 16), default=3, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(1), default=32, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=None, help="Use only the first N prompts.")
@device_option()
@dtype_option()
@decoder_option
@trust_remote_code_option
@json_option("Print the report as JSON.")
def command(model: Path, other: Path, prompts_file: Path, draft: Path | None, layer_ids: str | None, k: int,
            max_new_tokens: int, limit: int | None, device: str, dtype: str, decoder: str, trust_remote_code: bool,
            as_json: bool) -> None:
    """How alike two targets are; does a drafter carry over?

    \b
    Metrics ($RUNBOOK_METRICS): cos_sim_l{layer}, rel_norm_diff_l{layer} per aux layer; with
    --draft, accept_len (the drafter against --other) and base_accept_len (against --model), and
    vocab_coverage: the share of --other's own greedy tokens on these prompts that lie in the
    drafter's draft vocabulary, i.e. that it could ever propose (vocab_coverage_distinct: over
    distinct tokens; base_vocab_coverage: the same for --model's tokens). Cosine near 1 and a small
    norm difference at the drafter's layers suggest the drafter's layers carry over; a low
    vocab_coverage says to fine-tune them with a new draft vocabulary (eagle vocab --draft-vocab N).
    The drafter may be of any published EAGLE-3 layout.

    \b
    Example:
      eagle probe --model work/target --other work/target-v2 --prompts plans/data/prompts.jsonl \\
          --draft work/draft
    """
    from eagle.target import open_target

    quiet_hf()
    with refusals(ValueError, FileNotFoundError):
        open_target(other, trust_remote_code, what="--other")
        prompts, dev, dt = load_inputs(model, prompts_file, limit, draft, trust_remote_code, device, dtype)
        report = run_probe(model, other, prompts, parse_layer_ids(layer_ids), draft, k, max_new_tokens, dev, dt,
                           decoder, trust_remote_code)

    def show() -> None:
        print_table([(f"l{s.layer}", s.cos_sim, s.rel_norm_diff) for s in report.layers],
                    headers=["layer", "cos_sim", "rel_norm_diff"])
        click.echo(f"decoder: {report.decoder}")
        if report.accept_len is not None:
            click.echo(f"accept_len on --other: {report.accept_len:.3f}   on --model: {report.base_accept_len:.3f}")
            click.echo(f"draft vocabulary covers {report.vocab_coverage:.1%} of --other's greedy tokens "
                       f"({report.vocab_coverage_distinct:.1%} of the distinct ones), "
                       f"{report.base_vocab_coverage:.1%} of --model's")

    finish(report, as_json, metrics=report.metrics(), show=show)
