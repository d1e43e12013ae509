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

from pydantic import BaseModel

from eagle.common import EagleError, split_layer_ids


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
    from eagle.decode.factory import load_decoder
    from eagle.decode.interface import required_len
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
