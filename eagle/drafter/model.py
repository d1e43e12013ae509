"""The EAGLE-3 draft model: the only module in `eagle` that imports speculators.

Build a speculators `Eagle3DraftModel` for a target (its config, aux layer ids, the draft vocabulary
mapping), run its training forward, export it to the servable checkpoint (eagle/drafter/checkpoint.py), and
load it back. On CPU the attention is "sdpa" (speculators' default flex attention has no CPU
backward) and the loss is the "eager" KL divergence (the fused one needs Triton).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from speculators.losses import resolve_loss_config
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from transformers import LlamaConfig

from eagle.drafter import checkpoint
from eagle.drafter.mla import mla_layer_config
from eagle.target import DraftShape, Target, open_target

ATTN_IMPL = "sdpa"
LOSS = "kl_div"


def _register_mla_layer() -> None:
    """Teach speculators' Eagle3DraftModel the MLA drafter's first layer (model_type "deepseek_v3"):
    transformers' DeepseekV3 decoder layer (its MLA attention, a dense MLP: first_k_dense_replace 1)
    with q_a_proj / kv_a_proj_with_mqa reading 2H, and speculators' own EAGLE-3 first-layer forward
    (split, norms, residual), as its Llama and Qwen3 layers have. Idempotent."""
    from speculators.models import base_components
    from speculators.models.eagle3 import model_definitions
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3DecoderLayer,
        DeepseekV3RMSNorm,
        DeepseekV3RotaryEmbedding,
    )

    from eagle.drafter.mla import widen_eagle3_inputs

    if "deepseek_v3" in model_definitions.model_classes:
        return

    class DeepseekV3DecoderEagle3FirstLayer(model_definitions.Eagle3FirstLayerMixin,  # type: ignore[misc]
                                            DeepseekV3DecoderLayer):
        def __init__(self, config: Any, layer_idx: int, norm_before_residual: bool = False) -> None:
            super().__init__(config, layer_idx)
            self.norm_before_residual = norm_before_residual
            self.hidden_norm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            widen_eagle3_inputs(self.self_attn, config)

    model_definitions.model_classes["deepseek_v3"] = base_components.ModelComponents(
        DeepseekV3DecoderEagle3FirstLayer, DeepseekV3DecoderLayer, DeepseekV3RMSNorm, DeepseekV3RotaryEmbedding)


_register_mla_layer()


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
    norm_before_fc: bool = False,
    fc_norm: bool = False,
    norm_output: bool = False,
    attn_impl: str = ATTN_IMPL,
    shape: DraftShape | None = None,
    layer_config: Any = None,
    trust_remote_code: bool = False,
) -> Eagle3DraftModel:
    """A fresh drafter for the target at `target_dir`, in float32: one Llama decoder layer (its
    shape the target's, or `shape`; or `layer_config` as a whole), the norm flags asked for, the
    target's embeddings, its lm_head restricted to the draft vocabulary and its final norm, read
    from the target's safetensors (eagle/target.py) without loading the target, and without running
    its code: custom-code targets need no trust here."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    target = open_target(target_dir, trust_remote_code)
    if layer_config is None:
        layer_config = target.draft_layer_config(shape)
    layer_config._attn_implementation = attn_impl
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=int(d2t.shape[0]),
        norm_before_residual=norm_before_residual,
        norm_before_fc=norm_before_fc,
        fc_norm=fc_norm,
        norm_output=norm_output,
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
            assert model.t2d is not None  # set with the draft vocabulary
            rows = rows[model.t2d.to(device=rows.device, dtype=torch.bool)]
        model.lm_head.weight.copy_(rows)
        model.verifier_lm_head.weight.copy_(rows)
        model.verifier_norm.weight.copy_(w["norm.weight"])
    for p in (model.embed_tokens.weight, model.lm_head.weight, model.verifier_lm_head.weight,
              model.verifier_norm.weight):
        p.requires_grad_(False)


def checkpoint_layer_config(ck: checkpoint.Checkpoint) -> Any:
    """The decoder layer's llama config of a checkpoint (its own shape, float32 parameters); an MLA
    drafter's DeepseekV3Config."""
    if ck.cfg.is_mla:
        cfg = mla_layer_config(ck.config["transformer_layer_config"])
        cfg.use_cache = True
        return cfg
    keep = {k: v for k, v in ck.config["transformer_layer_config"].items()
            if k not in ("model_type", "architectures", "dtype", "torch_dtype", "transformers_version")}
    cfg = LlamaConfig(**keep)
    cfg.num_hidden_layers = 1
    cfg.tie_word_embeddings = False
    cfg.use_cache = True
    return cfg


def checkpoint_shape(ck: checkpoint.Checkpoint) -> DraftShape:
    """The decoder-layer shape of a checkpoint, as eagle/target.py's DraftShape."""
    c = ck.cfg
    return DraftShape(intermediate_size=c.intermediate_size, num_attention_heads=c.num_attention_heads,
                      num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim)


def _vocab_maps(ck: checkpoint.Checkpoint) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(d2t, t2d) of a checkpoint; t2d rebuilt from d2t when the checkpoint has none."""
    if "d2t" not in ck.shapes:
        return None, None
    maps = ck.tensors(["d2t", "t2d"])
    d2t = maps["d2t"].long()
    t2d = maps.get("t2d")
    if t2d is None:
        t2d = torch.zeros(ck.cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(d2t.shape[0]) + d2t] = True
    return d2t, t2d.bool()


def load_drafter(
    drafter_dir: str | os.PathLike[str],
    target_dir: str | os.PathLike[str] | None = None,
    attn_impl: str = ATTN_IMPL,
) -> Eagle3DraftModel:
    """The checkpoint in `drafter_dir` (any layout eagle.drafter.checkpoint reads) as speculators'
    Eagle3DraftModel in float32, every stored tensor as it is (lm_head included).

    The verifier is `target_dir` (default: the checkpoint's own): tensors missing from the
    checkpoint (embed_tokens) come from it, and so do the frozen verifier norm/head used for
    training targets.
    """
    ck = checkpoint.read_drafter(drafter_dir)
    verifier = str(target_dir) if target_dir is not None else ck.cfg.verifier
    if not verifier or not Path(verifier, "config.json").exists():
        raise checkpoint.CheckpointError(f"{drafter_dir}: its verifier {verifier!r} is not a local model "
                                         "directory; pass the target")
    target = open_target(verifier)
    ck = ck.for_target(target.num_layers)
    config = Eagle3SpeculatorConfig.from_dict(ck.config)
    assert isinstance(config, Eagle3SpeculatorConfig)  # from_dict is typed as returning the base config
    if ck.cfg.is_mla:  # one dense layer (first_k_dense_replace 1), as vLLM builds it
        config.transformer_layer_config = checkpoint_layer_config(ck)
    config.speculators_config.verifier.name_or_path = verifier
    config.transformer_layer_config._attn_implementation = attn_impl
    for name in ("dtype", "torch_dtype"):
        if hasattr(config.transformer_layer_config, name):
            setattr(config.transformer_layer_config, name, None)
    model = Eagle3DraftModel(config).float()
    set_attn_impl(model, attn_impl)
    d2t, t2d = _vocab_maps(ck)
    model.load_vocab_mappings(t2d, d2t)
    load_target_rows(model, target)  # embed_tokens, lm_head, verifier norm/head: the verifier's ...
    tensors = {k: v for k, v in ck.tensors().items() if k not in ("d2t", "t2d")}
    with torch.no_grad():  # ... then every tensor the checkpoint has (its lm_head, an embedding)
        params = dict(model.named_parameters())
        for name, value in tensors.items():
            params[name].copy_(value)
    return model


def init_from(
    ck: checkpoint.Checkpoint,
    target_dir: str | os.PathLike[str],
    *,
    layer_ids: list[int],
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    ttt_steps: int,
    attn_impl: str = ATTN_IMPL,
    trust_remote_code: bool = False,
    freeze_lm_head: bool = False,
) -> Eagle3DraftModel:
    """A drafter to fine-tune on the target `target_dir`: the trainable layers (fc, the decoder
    layer, the final norm, input/fc norms) of `ck` as float32 masters, whatever their stored dtype;
    its layer shape and norm flags; the embedding from the target, as a fresh drafter has it.

    The lm_head is the published drafter's (SpecForge trains it; dropping it loses what it learnt):
    its row of every token of the draft vocabulary `d2t`/`t2d` that the checkpoint's vocabulary
    also has, the target's lm_head row for a token new to it. It trains unless `freeze_lm_head`."""
    flags: dict[str, Any] = ck.cfg.flags()
    model = build_drafter(target_dir, layer_ids=layer_ids, d2t=d2t, t2d=t2d, ttt_steps=ttt_steps,
                          layer_config=checkpoint_layer_config(ck), attn_impl=attn_impl,
                          trust_remote_code=trust_remote_code, **flags)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    stored = ck.tensors(sorted(params))
    missing = sorted(set(params) - set(stored))
    if missing:
        raise checkpoint.CheckpointError(f"{ck.weights_file}: has no {', '.join(missing)}; it cannot seed a drafter")
    with torch.no_grad():
        for name, value in stored.items():
            params[name].copy_(value)
        old_head = ck.tensors(["lm_head.weight"])["lm_head.weight"]
        old_row = {tid: row for row, tid in enumerate(ck.draft_token_ids())}
        new_ids = (torch.arange(d2t.shape[0]) + d2t.long()).tolist()
        for row, tid in enumerate(new_ids):
            if tid in old_row:
                model.lm_head.weight[row].copy_(old_head[old_row[tid]])
    model.lm_head.weight.requires_grad_(not freeze_lm_head)
    return model


def loss_config() -> dict[str, Any]:
    return resolve_loss_config(LOSS, "eager")


def sync_free_accuracy(pred_ids: torch.Tensor, target_ids: torch.Tensor, loss_mask: torch.Tensor | None,
                       prev_correct: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """speculators' compute_accuracy_single_step without its host sync, same counts: it selects the
    masked positions (`masked_select`, whose output size the host must read back from the device,
    which also splits the compiled forward into several graphs) and then sums them; a masked sum
    needs no selection. Returns (full_correct, full_total, cond_correct, cond_total), updates
    prev_correct in place, as the original."""
    correct = pred_ids == target_ids
    cond_total = torch.full((), correct.numel(), dtype=torch.float, device=correct.device)
    if prev_correct is not None:
        cond_total = prev_correct.sum().float()
        correct = torch.logical_and(prev_correct, correct, out=prev_correct)
    full_total = cond_total.new_full((), correct.numel())
    if loss_mask is not None:
        keep = loss_mask.to(torch.bool)
        correct = torch.logical_and(correct, keep)
        full_total = keep.sum().float()
    correct_sum = correct.float().sum()
    return correct_sum, full_total, correct_sum.clone(), cond_total


def use_sync_free_metrics() -> None:
    """Make the drafter's training forward free of host syncs (idempotent; the counts are unchanged):
    its per-step accuracy is counted by `sync_free_accuracy`. Without it every draft step of every
    training step waits for the GPU, so the host cannot queue the next kernels ahead, and a CUDA
    graph cannot capture the step (eagle/train/step_graph.py)."""
    from speculators.models.eagle3 import metrics

    metrics.compute_accuracy_single_step = sync_free_accuracy  # looked up at call time by compute_metrics


def train_forward(model: torch.nn.Module, batch: dict[str, torch.Tensor], ttt_steps: int,
                  losses: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, metrics) of one packed batch (tensors shaped [1, T, ...], see eagle/train/dataset.py)."""
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
    """(config.json dict, tensors as they are) for eagle/drafter/checkpoint.py's writer."""
    config = model.config.to_dict()
    skip = set(model._keys_to_ignore_on_save or [])
    return config, {k: v.detach() for k, v in model.state_dict().items() if k not in skip}


def save_dtype(keep_float32: bool) -> torch.dtype:
    """bf16, as published drafters are, unless asked to keep the float32 masters."""
    return torch.float32 if keep_float32 else torch.bfloat16


def save(model: Eagle3DraftModel, out: str | os.PathLike[str], keep_float32: bool = False,
         keep_embedding: bool = False) -> checkpoint.DraftConfig:
    """Write the servable checkpoint: bf16 (float32 with `keep_float32`), no frozen embedding."""
    config, tensors = export(model)
    return checkpoint.write_checkpoint(out, config, tensors, dtype=save_dtype(keep_float32),
                                       keep_embedding=keep_embedding)


def check_savable(model: Eagle3DraftModel, out: str | os.PathLike[str]) -> None:
    """Raise CheckpointError now if `save` would refuse this model later (run before training)."""
    config, tensors = export(model)
    checkpoint.check_writable(out, config, {k: tuple(v.shape) for k, v in tensors.items()})
