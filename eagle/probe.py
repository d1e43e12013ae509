"""`eagle probe`: how alike two targets' hidden states are, and does a drafter carry over?

Both targets read the same token ids: each prompt followed by --model's own greedy continuation
(the text a drafter for --model was trained on). Per aux layer (decoder-layer inputs, the layers a
drafter reads) it reports the mean over tokens of the cosine similarity and of the relative norm
difference ||h_other - h_model|| / ||h_model||. With --draft it also runs real speculative
decoding of the drafter against --other (accept_len) and against --model (base_accept_len): the
quick check of whether a drafter carries over to a new target before fine-tuning it.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from pydantic import BaseModel

from eagle.common import EagleError, fail, pick_device, pick_dtype, print_table, split_layer_ids
from eagle.metrics import write_metrics


class LayerStats(BaseModel):
    layer: int
    cos_sim: float
    rel_norm_diff: float


class ProbeReport(BaseModel):
    layers: list[LayerStats]
    tokens: int
    accept_len: float | None = None
    base_accept_len: float | None = None

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.layers:
            out[f"cos_sim_l{s.layer}"] = s.cos_sim
            out[f"rel_norm_diff_l{s.layer}"] = s.rel_norm_diff
        if self.accept_len is not None:
            out["accept_len"] = self.accept_len
        if self.base_accept_len is not None:
            out["base_accept_len"] = self.base_accept_len
        return out


def parse_layer_ids(text: str | None) -> list[int] | None:
    return split_layer_ids(text) if text else None


def layer_similarity(a, b) -> tuple[float, float]:
    """Mean cosine similarity and mean relative norm difference of rows of a and b ([T, H])."""
    import torch

    a, b = a.float(), b.float()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    rel = (b - a).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-12)
    return float(cos.mean()), float(rel.mean())


def _check_pair(model_dir: Path, other_dir: Path, a, b) -> None:
    for field in ("num_hidden_layers", "hidden_size", "vocab_size"):
        if getattr(a.config, field) != getattr(b.config, field):
            raise EagleError(f"{other_dir}: {field} is {getattr(b.config, field)} but {model_dir} has "
                             f"{getattr(a.config, field)}; probe compares targets of the same architecture")


def run_probe(model_dir: Path, other_dir: Path, prompts: list[list[int]], layer_ids: list[int] | None,
              draft_dir: Path | None, k: int, max_new_tokens: int, device, dtype) -> ProbeReport:
    import torch

    from eagle.decode import (
        Decoder,
        TargetModel,
        check_layer_ids,
        default_layer_ids,
        eos_ids_of,
        required_len,
    )
    from eagle.draft_infer import load_drafter

    base = TargetModel.from_pretrained(model_dir, device=device, dtype=dtype)
    other = TargetModel.from_pretrained(other_dir, device=device, dtype=dtype)
    _check_pair(model_dir, other_dir, base, other)
    drafter = None
    if draft_dir is not None:
        drafter = load_drafter(draft_dir, target_embed=base.embed_tokens.weight,
                               target_vocab_size=base.config.vocab_size, device=device, dtype=dtype)
        layer_ids = layer_ids or drafter.spec.layer_ids
    layer_ids = check_layer_ids(layer_ids or default_layer_ids(base.num_layers), base.num_layers, "--layer-ids")
    max_len = required_len(max(len(p) for p in prompts), max_new_tokens, k)
    plain = Decoder(base, None, max_len=max_len, eos_ids=eos_ids_of(model_dir))
    sums = {i: [0.0, 0.0] for i in layer_ids}
    tokens = 0
    ordered = sorted(layer_ids)
    with torch.inference_mode():
        for ids in prompts:
            seq = ids + plain.generate_greedy(ids, max_new_tokens)
            x = torch.tensor(seq, device=device)
            pos = torch.arange(len(seq), device=device)
            _, aux_a, _ = base(x, pos, base.new_cache(len(seq)), ordered, last_only=True)
            _, aux_b, _ = other(x, pos, other.new_cache(len(seq)), ordered, last_only=True)
            h = base.config.hidden_size
            for j, layer in enumerate(ordered):
                cos, rel = layer_similarity(aux_a[:, j * h:(j + 1) * h], aux_b[:, j * h:(j + 1) * h])
                sums[layer][0] += cos * len(seq)
                sums[layer][1] += rel * len(seq)
            tokens += len(seq)
    stats = [LayerStats(layer=i, cos_sim=sums[i][0] / tokens, rel_norm_diff=sums[i][1] / tokens) for i in ordered]
    report = ProbeReport(layers=stats, tokens=tokens)
    if drafter is not None:
        del plain
        for name, target, where in (("accept_len", other, other_dir), ("base_accept_len", base, model_dir)):
            dec = Decoder(target, drafter, max_len=max_len, layer_ids=layer_ids, eos_ids=eos_ids_of(where))
            accepted = [m for ids in prompts for m in dec.generate_speculative(ids, max_new_tokens, k).accepted]
            setattr(report, name, 1.0 + sum(accepted) / max(1, len(accepted)))
            del dec
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
@click.option("--device", default="auto", show_default=True)
@click.option("--dtype", default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(model: Path, other: Path, prompts_file: Path, draft: Path | None, layer_ids: str | None, k: int,
            max_new_tokens: int, limit: int | None, device: str, dtype: str, as_json: bool) -> None:
    """How alike two targets are; does a drafter carry over?

    \b
    Metrics ($RUNBOOK_METRICS): cos_sim_l{layer}, rel_norm_diff_l{layer} per aux layer; with
    --draft, accept_len (the drafter against --other) and base_accept_len (against --model).
    Cosine near 1 and a small norm difference at the drafter's layers suggest a drafter carries
    over; accept_len tells for sure.

    \b
    Example:
      eagle probe --model work/target --other work/target-v2 --prompts plans/data/prompts.jsonl \\
          --draft work/draft
    """
    from eagle.evaluate import load_inputs

    try:
        if not (other / "config.json").is_file():
            raise EagleError(f"{other}: not a model directory (no config.json)")
        prompts = load_inputs(model, prompts_file, limit, draft)
        dev = pick_device(device)
        report = run_probe(model, other, prompts, parse_layer_ids(layer_ids), draft, k, max_new_tokens, dev,
                           pick_dtype(dtype, dev))
    except (EagleError, ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    write_metrics(report.metrics())
    if as_json:
        click.echo(json.dumps(report.model_dump(), indent=1))
        return
    print_table([(f"l{s.layer}", s.cos_sim, s.rel_norm_diff) for s in report.layers],
                headers=["layer", "cos_sim", "rel_norm_diff"])
    if report.accept_len is not None:
        click.echo(f"accept_len on --other: {report.accept_len:.3f}   on --model: {report.base_accept_len:.3f}")
