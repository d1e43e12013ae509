"""`eagle probe`: how alike two targets' hidden states are, and does a drafter carry over?

Both targets read the same token ids: each prompt followed by --model's own greedy continuation
(the text a drafter for --model was trained on). Per aux layer (decoder-layer inputs, the layers a
drafter reads) it reports the mean over tokens of the cosine similarity and of the relative norm
difference ||h_other - h_model|| / ||h_model||. With --draft it also runs real speculative
decoding of the drafter against --other (accept_len) and against --model (base_accept_len), and
how much of --other's own greedy output the drafter's draft vocabulary covers (vocab_coverage:
the share of --other's greedy tokens the drafter could ever propose; base_vocab_coverage the same
for --model): the quick check of whether a drafter carries over to a new target, and with which
vocabulary, before fine-tuning it.
"""

from __future__ import annotations

from pathlib import Path

import click
from pydantic import BaseModel

from eagle.command import device_option, dtype_option, finish, json_option, refusals, trust_remote_code_option
from eagle.common import EagleError, print_table, quiet_hf, split_layer_ids
from eagle.decode.evaluate import decoder_option, load_inputs


class LayerStats(BaseModel):
    layer: int
    cos_sim: float
    rel_norm_diff: float


class ProbeReport(BaseModel):
    layers: list[LayerStats]
    tokens: int
    decoder: str = "fast"  # which decoding path ran (fast: eagle/decode/fast.py; generic: transformers forward)
    accept_len: float | None = None
    base_accept_len: float | None = None
    vocab_coverage: float | None = None  # share of --other's greedy tokens in the drafter's draft vocabulary
    vocab_coverage_distinct: float | None = None  # the same over distinct token ids
    base_vocab_coverage: float | None = None  # share of --model's greedy tokens (what the drafter was built on)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.layers:
            out[f"cos_sim_l{s.layer}"] = s.cos_sim
            out[f"rel_norm_diff_l{s.layer}"] = s.rel_norm_diff
        if self.accept_len is not None:
            out["accept_len"] = self.accept_len
        if self.base_accept_len is not None:
            out["base_accept_len"] = self.base_accept_len
        for name in ("vocab_coverage", "vocab_coverage_distinct", "base_vocab_coverage"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


def vocab_coverage(tokens: list[int], draft_ids: set[int]) -> tuple[float, float]:
    """(share of `tokens` in `draft_ids`, share of the distinct ones): how much of a target's output
    a drafter with that draft vocabulary could ever propose."""
    if not tokens:
        return 0.0, 0.0
    distinct = set(tokens)
    return (sum(t in draft_ids for t in tokens) / len(tokens), len(distinct & draft_ids) / len(distinct))


def parse_layer_ids(text: str | None) -> list[int] | None:
    return split_layer_ids(text) if text else None


def layer_similarity(a, b) -> tuple[float, float]:
    """Mean cosine similarity and mean relative norm difference of rows of a and b ([T, H])."""
    import torch

    a, b = a.float(), b.float()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    rel = (b - a).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-12)
    return float(cos.mean()), float(rel.mean())


def _check_pair(model_dir: Path, other_dir: Path, trust_remote_code: bool) -> None:
    from eagle.target import open_target

    a = open_target(model_dir, trust_remote_code)
    b = open_target(other_dir, trust_remote_code, what="--other")
    for field in ("num_layers", "hidden_size", "vocab_size"):
        if getattr(a, field) != getattr(b, field):
            raise EagleError(f"{other_dir}: {field} is {getattr(b, field)} but {model_dir} has "
                             f"{getattr(a, field)}; probe compares targets of the same architecture")


def run_probe(model_dir: Path, other_dir: Path, prompts: list[list[int]], layer_ids: list[int] | None,
              draft_dir: Path | None, k: int, max_new_tokens: int, device, dtype, decoder: str = "auto",
              trust_remote_code: bool = False) -> ProbeReport:
    from eagle.decode.draft_infer import read_draft_spec
    from eagle.decode.fast import load_decoder, required_len
    from eagle.target import check_layer_ids, open_target

    _check_pair(model_dir, other_dir, trust_remote_code)
    n_layers = open_target(model_dir, trust_remote_code).num_layers
    if draft_dir is not None:
        layer_ids = layer_ids or read_draft_spec(draft_dir).layer_ids
    layer_ids = check_layer_ids(layer_ids or open_target(model_dir).default_layer_ids(), n_layers, "--layer-ids")
    max_len = required_len(max(len(p) for p in prompts), max_new_tokens, k)
    kw = {"max_len": max_len, "device": device, "dtype": dtype, "path": decoder,
          "trust_remote_code": trust_remote_code}
    # each target decodes with the drafter as vLLM would serve it there (its own embeddings where the
    # checkpoint has none); without --draft, plain decoders only
    base = load_decoder(model_dir, draft_dir, layer_ids=layer_ids if draft_dir else None, **kw)
    other = load_decoder(other_dir, draft_dir, layer_ids=layer_ids if draft_dir else None, **kw)
    sums = {i: [0.0, 0.0] for i in layer_ids}
    tokens = 0
    ordered = sorted(layer_ids)
    h = open_target(model_dir).hidden_size
    base_out: list[int] = []
    for ids in prompts:
        continuation = base.generate_greedy(ids, max_new_tokens)
        base_out += continuation
        seq = ids + continuation
        aux_a, aux_b = base.aux_states(seq, ordered), other.aux_states(seq, ordered)
        for j, layer in enumerate(ordered):
            cos, rel = layer_similarity(aux_a[:, j * h:(j + 1) * h], aux_b[:, j * h:(j + 1) * h])
            sums[layer][0] += cos * len(seq)
            sums[layer][1] += rel * len(seq)
        tokens += len(seq)
    stats = [LayerStats(layer=i, cos_sim=sums[i][0] / tokens, rel_norm_diff=sums[i][1] / tokens) for i in ordered]
    report = ProbeReport(layers=stats, tokens=tokens, decoder=base.path)
    if draft_dir is not None:
        from eagle.drafter.checkpoint import read_drafter

        draft_ids = set(read_drafter(draft_dir).draft_token_ids())
        other_out = [t for ids in prompts for t in other.generate_greedy(ids, max_new_tokens)]
        report.vocab_coverage, report.vocab_coverage_distinct = vocab_coverage(other_out, draft_ids)
        report.base_vocab_coverage = vocab_coverage(base_out, draft_ids)[0]
        for name, dec in (("accept_len", other), ("base_accept_len", base)):
            accepted = [m for ids in prompts for m in dec.generate_speculative(ids, max_new_tokens, k).accepted]
            setattr(report, name, 1.0 + sum(accepted) / max(1, len(accepted)))
    return report


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
