"""The EAGLE-3 draft model: the only module in `eagle` that imports speculators.

Build a speculators `Eagle3DraftModel` for a target (its config, aux layer ids, the draft vocabulary
mapping), run its training forward, export it to the servable checkpoint (eagle/checkpoint.py), and
load it back. On CPU the attention is "sdpa" (speculators' default flex attention has no CPU
backward) and the loss is the "eager" KL divergence (the fused one needs Triton).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from loguru import logger
from speculators.losses import resolve_loss_config
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from transformers import LlamaConfig

from eagle import checkpoint
from eagle.common import EagleError
from eagle.target import DraftShape, Target, open_target

logger.remove()  # speculators logs every file it opens at INFO; our commands print their own tables

ATTN_IMPL = "sdpa"
LOSS = "kl_div"


def draft_layer_config(target_dir: str | os.PathLike[str], shape: DraftShape | None = None,
                       trust_remote_code: bool = False) -> LlamaConfig:
    """The drafter's decoder layer: one Llama layer for every target, its shape the target's unless
    `shape` sets it (eagle/target.py)."""
    return open_target(target_dir, trust_remote_code).draft_layer_config(shape)


def set_attn_impl(model: Eagle3DraftModel, impl: str = ATTN_IMPL) -> None:
    """Switch the drafter's attention backend ("sdpa", "eager" or "simple_flex_attention")."""
    from speculators.models.attention import create_float_mask
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    model.config.transformer_layer_config._attn_implementation = impl
    model._attn_impl = impl
    model._create_mask_fn = (
        create_block_mask if impl == "simple_flex_attention" else create_float_mask if impl == "eager" else create_mask
    )


def build_drafter(
    target_dir: str | os.PathLike[str],
    *,
    layer_ids: list[int],
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    ttt_steps: int,
    norm_before_residual: bool = False,
    attn_impl: str = ATTN_IMPL,
    shape: DraftShape | None = None,
    trust_remote_code: bool = False,
) -> Eagle3DraftModel:
    """A fresh drafter for the target at `target_dir`: one Llama decoder layer (its shape the
    target's, or `shape`), the target's embeddings, its lm_head restricted to the draft vocabulary
    and its final norm, read from the target's safetensors (eagle/target.py) without loading the
    target, and without running its code: custom-code targets need no trust here."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    target = open_target(target_dir, trust_remote_code)
    layer_config = target.draft_layer_config(shape)
    layer_config._attn_implementation = attn_impl
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=int(d2t.shape[0]),
        norm_before_residual=norm_before_residual,
        eagle_aux_hidden_state_layer_ids=list(layer_ids),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=ttt_steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(target_dir), architectures=target.raw.get("architectures") or []),
        ),
    )
    model = Eagle3DraftModel(config=config)
    model.load_vocab_mappings(t2d.to(torch.bool), d2t.to(torch.long))
    load_target_rows(model, target)
    set_attn_impl(model, attn_impl)
    return model


def load_target_rows(model: Eagle3DraftModel, target: Target) -> None:
    """The verifier-owned tensors of a drafter, from the target's files: embed_tokens, lm_head and
    verifier_lm_head (the target's lm_head rows of the draft vocabulary) and verifier_norm; frozen."""
    w = target.read_weights(["embed_tokens.weight", "lm_head.weight", "norm.weight"])
    with torch.no_grad():
        model.embed_tokens.weight.copy_(w["embed_tokens.weight"])
        rows = w["lm_head.weight"]
        if model.use_draft_vocab:
            rows = rows[model.t2d.to(torch.bool)]
        model.lm_head.weight.copy_(rows)
        model.verifier_lm_head.weight.copy_(rows)
        model.verifier_norm.weight.copy_(w["norm.weight"])
    for p in (model.embed_tokens.weight, model.lm_head.weight, model.verifier_lm_head.weight,
              model.verifier_norm.weight):
        p.requires_grad_(False)


def load_drafter(
    drafter_dir: str | os.PathLike[str],
    target_dir: str | os.PathLike[str] | None = None,
    attn_impl: str = ATTN_IMPL,
) -> Eagle3DraftModel:
    """Load a checkpoint with speculators' from_pretrained.

    With `target_dir`, the verifier is that target: tensors missing from the checkpoint
    (embed_tokens) come from it, and so do the frozen verifier norm/head used for training targets.
    """
    drafter_dir = Path(drafter_dir)
    checkpoint.read_draft_config(drafter_dir)  # clear error before speculators' own
    config = Eagle3SpeculatorConfig.from_pretrained(str(drafter_dir))
    if target_dir is not None:
        config.speculators_config.verifier.name_or_path = str(target_dir)
    config.transformer_layer_config._attn_implementation = attn_impl
    model = Eagle3DraftModel.from_pretrained(str(drafter_dir), config=config)
    set_attn_impl(model, attn_impl)
    if "embed_tokens.weight" not in checkpoint.load_draft_state(drafter_dir):
        # transformers leaves a missing tensor uninitialised (not NaN, which speculators checks for):
        # take the verifier's embeddings explicitly.
        verifier = config.speculators_config.verifier.name_or_path
        if not verifier or not Path(verifier, "config.json").exists():
            raise EagleError(f"{drafter_dir}: the checkpoint has no embed_tokens and its verifier "
                             f"{verifier!r} is not a local model directory; pass the target")
        model._load_verifier_weights(overwrite_embed_tokens=True)
    return model


def loss_config() -> dict[str, Any]:
    return resolve_loss_config(LOSS, "eager")


def train_forward(model: torch.nn.Module, batch: dict[str, torch.Tensor], ttt_steps: int,
                  losses: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, metrics) of one packed batch (tensors shaped [1, T, ...], see eagle/dataset.py)."""
    _, loss, metrics = model(
        hidden_states=batch["hidden_states"],
        input_ids=batch["input_ids"],
        document_ids=batch["document_ids"],
        loss_mask=batch["loss_mask"],
        position_ids=batch["position_ids"],
        verifier_last_hidden_states=batch["verifier_last_hidden_states"],
        ttt_steps=ttt_steps,
        loss_config=losses,
    )
    return loss, metrics


@torch.no_grad()
def draft_tokens(model: Eagle3DraftModel, batch: dict[str, torch.Tensor], ttt_steps: int) -> list[torch.Tensor]:
    """The drafter's argmax (draft-vocab ids) at every step, without the loss (used by tests)."""
    return model(
        hidden_states=batch["hidden_states"],
        input_ids=batch["input_ids"],
        document_ids=batch["document_ids"],
        position_ids=batch["position_ids"],
        ttt_steps=ttt_steps,
    )


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained parameters only (fc, layers, norm): what per-epoch states need to store."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def export(model: Eagle3DraftModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json dict, tensors) in the servable format (see eagle/checkpoint.py)."""
    config = model.config.to_dict()
    skip = set(model._keys_to_ignore_on_save or [])
    tensors = {k: v.detach().float() if v.is_floating_point() else v.detach()
               for k, v in model.state_dict().items() if k not in skip}
    return config, tensors


def save(model: Eagle3DraftModel, out: str | os.PathLike[str]) -> checkpoint.DraftConfig:
    config, tensors = export(model)
    return checkpoint.write_checkpoint(out, config, tensors)


def describe(model: Eagle3DraftModel) -> checkpoint.DraftConfig:
    """The DraftConfig of a live model (as its checkpoint would declare it)."""
    return checkpoint.DraftConfig.from_config_json(checkpoint.normalize_config(model.config.to_dict()))
