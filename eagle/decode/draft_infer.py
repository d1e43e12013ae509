"""EAGLE-3 drafter inference in plain torch, straight from a servable checkpoint directory.

The checkpoint is any layout eagle/drafter/checkpoint.py reads (the speculators / vLLM `eagle3` format, or
EAGLE / SpecForge's `midlayer.*` one; see docs/eagle.md). No speculators import: this module
reimplements the drafter's forward so the decoder runs where speculators is not installed (the GPU
host) and can be captured in CUDA graphs.

Forward semantics (the same as speculators' Eagle3DraftModel and vLLM's llama_eagle3):

- target features: the aux hidden states of the target layers in `eagle_aux_hidden_state_layer_ids`
  (decoder-layer inputs, ascending layer order) concatenated to [T, L*H] and projected by `fc` to
  [T, H] (after `input_norm` / `fc_norm` when the config asks for them);
- layer 0 takes cat(input_layernorm(embed(token)), hidden_norm(hidden)) -> q/k/v of input size 2H;
  its residual is `hidden` (or hidden_norm(hidden) with `norm_before_residual`); further layers are
  plain Llama layers;
- logits = lm_head(norm(h)) over the draft vocabulary; draft id i is target id i + d2t[i];
- the feature fed back for the next draft step is h before the final norm (after it with
  `norm_output`).
- row alignment: the row holding the target feature of position t carries the token at position
  t+1 and predicts position t+2. Its rope position is t+1 (speculators' training convention; rope
  is relative, so vLLM's t works the same) and it lives in drafter cache slot t.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from eagle.decode.llama_ops import (
    MLP,
    Attention,
    DecoderLayer,
    KVCache,
    RMSNorm,
    Rope,
    check_and_assign,
    check_llama_config,
    head_dim_of,
    rope_inv_freq,
)
from eagle.drafter.checkpoint import CheckpointError

if TYPE_CHECKING:
    from transformers import LlamaConfig

    from eagle.drafter.checkpoint import Checkpoint


class DraftCheckpointError(CheckpointError, ValueError):
    """A drafter checkpoint this module cannot load; the message names the file and the field
    (an EagleError with exit code 2, and a ValueError for callers that catch those)."""


@dataclass
class DraftSpec:
    layer_config: LlamaConfig  # of the drafter's decoder layers (an MLA drafter's: a DeepseekV3Config)
    draft_vocab_size: int
    target_hidden_size: int
    layer_ids: list[int] | None
    norm_before_residual: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    speculative_tokens: int | None
    mla: bool = False  # the first layer's attention is DeepSeek MLA (layer_config: a DeepseekV3Config)

    @property
    def hidden_size(self) -> int:
        return self.layer_config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.layer_config.vocab_size

    @property
    def num_aux(self) -> int:
        return len(self.layer_ids) if self.layer_ids else 3


def _spec_of(ck: Checkpoint) -> DraftSpec:
    from transformers import LlamaConfig

    path = ck.source / "config.json"
    tlc = ck.config["transformer_layer_config"]
    model_type = tlc.get("model_type", "llama")
    if ck.cfg.is_mla:
        from eagle.drafter.mla import mla_layer_config

        if int(tlc.get("num_hidden_layers", 1)) != 1:
            raise DraftCheckpointError(f"{path}: an MLA drafter of {tlc['num_hidden_layers']} layers; eagle reads "
                                       "one (EAGLE-3's first layer)")
        return _spec(ck, mla_layer_config(tlc))
    if model_type != "llama":
        raise DraftCheckpointError(f"{path}: transformer_layer_config.model_type {model_type!r} is not "
                                   "supported by the pure-torch drafter (only llama)")
    layer_config = LlamaConfig(**{k: v for k, v in tlc.items() if k != "model_type"})
    try:
        check_llama_config(layer_config, str(path))
    except ValueError as exc:
        raise DraftCheckpointError(str(exc)) from exc
    return _spec(ck, layer_config)


def _spec(ck: Checkpoint, layer_config: Any) -> DraftSpec:
    cfg = ck.cfg
    return DraftSpec(
        layer_config=layer_config,
        draft_vocab_size=cfg.draft_vocab_size,
        target_hidden_size=cfg.aux_hidden_size,
        layer_ids=cfg.layer_ids,
        norm_before_residual=cfg.norm_before_residual,
        norm_before_fc=cfg.norm_before_fc,
        fc_norm=cfg.fc_norm,
        norm_output=cfg.norm_output,
        speculative_tokens=cfg.speculative_tokens,
        mla=cfg.is_mla,
    )


def _read(draft_dir: str | Path, target_layers: int | None) -> Checkpoint:
    from eagle.common import EagleError
    from eagle.drafter.checkpoint import convention_message, read_drafter

    try:
        ck = read_drafter(draft_dir, target_layers)
    except EagleError as exc:
        raise DraftCheckpointError(str(exc)) from None
    doubt = ck.convention_doubt(target_layers)
    if doubt is not None and ck.stored_ids:
        from eagle.common import warn

        warn(convention_message(ck.stored_ids, doubt, str(ck.source / "config.json")) +
             "; read here as written (as vLLM does): `eagle import-drafter` records which")
    return ck


def read_draft_spec(draft_dir: str | Path, target_layers: int | None = None) -> DraftSpec:
    """The drafter's shapes and semantics, from a checkpoint of any layout eagle/drafter/checkpoint.py reads
    (null layer ids become vLLM's default when `target_layers` is given)."""
    return _spec_of(_read(draft_dir, target_layers))


class _FirstLayer(nn.Module):
    def __init__(self, config, norm_before_residual: bool, device=None, dtype=None, mla: bool = False) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        bias = bool(getattr(config, "attention_bias", False))
        self.norm_before_residual = norm_before_residual
        self.input_layernorm = RMSNorm(h, eps, device, dtype)
        self.hidden_norm = RMSNorm(h, eps, device, dtype)
        self.self_attn: nn.Module
        if mla:  # DeepSeek multi-head latent attention: transformers' DeepseekV3Attention (eagle/decode/mla_ops.py)
            from eagle.decode.mla_ops import MlaAttention

            with torch.device(device or "cpu"):
                self.self_attn = MlaAttention(config).to(dtype=dtype)
        else:
            self.self_attn = Attention(2 * h, h, config.num_attention_heads, config.num_key_value_heads,
                                       head_dim_of(config), bias, device, dtype)
        self.post_attention_layernorm = RMSNorm(h, eps, device, dtype)
        self.mlp = MLP(h, config.intermediate_size, False, device, dtype)

    def forward(self, embeds, hidden, cos, sin, slots, k_cache, v_cache, mask):
        f = mask.fused
        normed = self.hidden_norm(hidden, f)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds, f), normed], dim=-1)
        h = residual + self.self_attn(x, cos, sin, slots, k_cache, v_cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h, f), fused=f)


class Drafter(nn.Module):
    """The EAGLE-3 draft model; also the decoder's proposer (see `propose_rows`, `propose_step`)."""

    d2t: torch.Tensor  # a buffer

    def __init__(self, spec: DraftSpec, device=None, dtype=None) -> None:
        super().__init__()
        cfg = spec.layer_config
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        aux_dim = spec.num_aux * spec.target_hidden_size
        self.spec = spec
        self.input_norm = RMSNorm(aux_dim, eps, device, dtype) if spec.norm_before_fc else None
        self.fc_norm = (nn.ModuleList(RMSNorm(spec.target_hidden_size, eps, device, dtype)
                                      for _ in range(spec.num_aux)) if spec.fc_norm else None)
        self.fc = nn.Linear(aux_dim, h, bias=False, device=device, dtype=dtype)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h, device=device, dtype=dtype)
        self.layers = nn.ModuleList([_FirstLayer(cfg, spec.norm_before_residual, device, dtype, spec.mla),
                                     *(DecoderLayer(cfg, device, dtype) for _ in range(1, cfg.num_hidden_layers))])
        self.norm = RMSNorm(h, eps, device, dtype)
        self.lm_head = nn.Linear(h, spec.draft_vocab_size, bias=False, device=device, dtype=dtype)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long, device=device))
        self.rope: Rope | None = None

    # -- shapes ------------------------------------------------------------------------------
    @property
    def hidden_size(self) -> int:
        return self.spec.hidden_size

    def new_cache(self, max_len: int, attention: str = "sdpa") -> KVCache:
        cfg = self.spec.layer_config
        w = self.fc.weight
        assert self.rope is not None
        if self.spec.mla:  # the compressed latents, attended by sdpa (eagle/decode/mla_ops.py)
            from eagle.decode.mla_ops import new_latent_cache

            return new_latent_cache(cfg, max_len, w.device, w.dtype).attach_rope(self.rope, offset=1)
        kv_heads = cfg.num_key_value_heads or cfg.num_attention_heads  # (the config fills it in so)
        cache = KVCache(cfg.num_hidden_layers, kv_heads, head_dim_of(cfg), max_len, w.device, w.dtype, attention)
        return cache.attach_rope(self.rope, offset=1)  # row t's rope position is its slot + 1 (speculators)

    # -- the forward -------------------------------------------------------------------------
    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """Target aux hidden states [T, L*H] -> drafter features [T, H]."""
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        if self.fc_norm is not None:
            chunks = aux.chunk(len(self.fc_norm), dim=-1)
            aux = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(aux)

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor, slots: torch.Tensor,
                cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of (feature [T, H], token [T]) at cache `slots` [T] -> (draft logits [T, DV], feature)."""
        assert self.rope is not None
        cos, sin = cache.rope_of(self.rope, slots, hidden.dtype)  # position = slot + 1 (new_cache)
        mask = cache.mask(slots)
        x = self.layers[0](self.embed_tokens(tokens), hidden, cos, sin, slots, cache.k[0], cache.v[0], mask)
        for i in range(1, len(self.layers)):
            x = self.layers[i](x, cos, sin, slots, cache.k[i], cache.v[i], mask)
        normed = self.norm(x, mask.fused)
        return self.lm_head(normed), (normed if self.spec.norm_output else x)

    def to_target(self, draft_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return torch.add(draft_ids, self.d2t[draft_ids], out=out)

    # -- the proposer interface the decoder uses ---------------------------------------------
    def propose_rows(self, aux: torch.Tensor, tokens: torch.Tensor, slots: torch.Tensor,
                     cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows carrying target features: returns (proposed target ids [T], features [T, H])."""
        logits, feat = self(self.combine(aux), tokens, slots, cache)
        return self.to_target(logits.argmax(-1)), feat

    def propose_step(self, token: torch.Tensor, feat: torch.Tensor, slot: torch.Tensor,
                     cache: KVCache, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step fed by the drafter's own feature: (proposed target id [1], feature [1, H]);
        the id is written into `out` when given (the decoder's token buffer: no copy)."""
        logits, feat = self(feat, token, slot, cache)
        return self.to_target(logits.argmax(-1), out), feat


def load_drafter(draft_dir: str | Path, *, target_embed: torch.Tensor | None = None,
                 target_vocab_size: int | None = None, target_layers: int | None = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Drafter:
    """Build a Drafter from a checkpoint dir of any layout eagle/drafter/checkpoint.py reads. `target_embed`
    fills a missing `embed_tokens` (vLLM shares the target's embedding in that case); null layer ids
    become vLLM's default for a target of `target_layers` layers."""
    ck = _read(draft_dir, target_layers)
    spec = _spec_of(ck)
    where = ck.weights_file
    if target_vocab_size is not None and target_vocab_size != spec.vocab_size:
        raise DraftCheckpointError(f"{ck.source / 'config.json'}: transformer_layer_config.vocab_size is "
                                   f"{spec.vocab_size} but the target's vocabulary has {target_vocab_size} tokens; "
                                   "this drafter was built for another target")
    stored = _read_tensors(ck)
    from eagle.drafter.check import value_problems

    bad = value_problems(ck.cfg, stored, str(where))
    if bad:
        raise DraftCheckpointError("; ".join(str(problem) for problem in bad) + "; this drafter cannot be used "
                                   f"(eagle check-checkpoint {ck.source} --model TARGET lists every problem)")
    tensors = {k: v for k, v in stored.items() if k != "t2d"}
    if "embed_tokens.weight" not in tensors:
        if target_embed is None:
            raise DraftCheckpointError(f"{where}: no embed_tokens.weight and no target embedding given")
        tensors["embed_tokens.weight"] = target_embed.detach()
    if "d2t" not in tensors:  # read_drafter allows this only when the draft vocab is the whole vocab
        tensors["d2t"] = torch.zeros(spec.draft_vocab_size, dtype=torch.long)
    tensors["d2t"] = tensors["d2t"].long()
    model = Drafter(spec, device="meta")
    try:
        check_and_assign(model, tensors, str(where), device, dtype)
    except ValueError as exc:
        raise DraftCheckpointError(str(exc)) from exc
    mapped = torch.arange(spec.draft_vocab_size) + model.d2t.cpu()
    if mapped.min() < 0 or mapped.max() >= spec.vocab_size:
        raise DraftCheckpointError(f"{where}: d2t maps draft ids outside the target vocabulary [0, {spec.vocab_size})")
    if spec.mla:
        from eagle.decode.mla_ops import MlaRope

        model.rope = MlaRope(spec.layer_config, device=device)
    else:
        inv_freq, scaling = rope_inv_freq(spec.layer_config)
        model.rope = Rope(inv_freq.to(device), scaling)
    return model.eval()


def _read_tensors(ck: Checkpoint) -> dict[str, torch.Tensor]:
    from eagle.common import EagleError

    try:
        return ck.tensors()
    except EagleError as exc:
        raise DraftCheckpointError(str(exc)) from None
