"""The servable EAGLE-3 drafter checkpoint: `config.json` + one `model.safetensors`.

This is the contract between `eagle train` (writes), `eagle evaluate` / `decode` (read it with
their own torch code) and vLLM (serves it). It is speculators' format as vLLM loads it:

config.json
    speculators_model_type "eagle3", transformer_layer_config (a 1-layer llama config whose
    vocab_size is the TARGET's vocab), speculators_config (proposal_methods[0].speculative_tokens,
    verifier.name_or_path), draft_vocab_size, norm_before_residual (always written: vLLM defaults it
    to True, speculators to False), eagle_aux_hidden_state_layer_ids; norm_before_fc, fc_norm and
    norm_output False; NO top-level model_type.
model.safetensors (H hidden, V target vocab, DV draft vocab, I intermediate, nh/nkv heads, hd head dim)
    fc.weight [H, 3H]; layers.0.self_attn.{q,k,v}_proj.weight [nh*hd | nkv*hd, 2H];
    layers.0.self_attn.o_proj.weight [H, nh*hd]; layers.0.mlp.{gate,up}_proj.weight [I, H];
    layers.0.mlp.down_proj.weight [H, I]; layers.0.{hidden_norm,input_layernorm,
    post_attention_layernorm}.weight [H]; norm.weight [H]; lm_head.weight [DV, H]; d2t int64 [DV];
    optional: t2d bool [V], embed_tokens.weight [V, H] (absent -> use the target's embeddings).

This module never imports speculators (eagle/drafter.py is the only one that does), so readers of the
checkpoint need only torch + safetensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from eagle.common import EagleError

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
REQUIRED_KEYS = (
    "speculators_model_type",
    "transformer_layer_config",
    "speculators_config",
    "draft_vocab_size",
    "norm_before_residual",
    "eagle_aux_hidden_state_layer_ids",
)
OPTIONAL_TENSORS = ("t2d", "embed_tokens.weight")
# Config keys speculators' save_pretrained writes that do not belong in a servable checkpoint.
_DROP_KEYS = ("model_type", "auto_map", "_name_or_path", "transformers_version_speculators")


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
    layer_ids: list[int]  # eagle_aux_hidden_state_layer_ids
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

    @classmethod
    def from_config_json(cls, data: dict[str, Any], source: str = "config.json") -> DraftConfig:
        """Parse a checkpoint's config.json dict; EagleError naming every problem."""
        missing = [k for k in REQUIRED_KEYS if k not in data]
        problems = [f"missing key {k!r}" for k in missing]
        if data.get("speculators_model_type", "eagle3") != "eagle3":
            problems.append(f"speculators_model_type is {data['speculators_model_type']!r}, expected 'eagle3'")
        if "model_type" in data:
            problems.append("has a top-level 'model_type' (vLLM then does not treat it as a speculators checkpoint)")
        if problems:
            raise EagleError(f"{source}: not an EAGLE-3 drafter checkpoint: " + "; ".join(problems))
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
            return cls(
                hidden_size=int(tl["hidden_size"]),
                intermediate_size=int(tl["intermediate_size"]),
                num_attention_heads=heads,
                num_key_value_heads=int(tl.get("num_key_value_heads") or heads),
                head_dim=int(tl.get("head_dim") or int(tl["hidden_size"]) // heads),
                vocab_size=int(tl["vocab_size"]),
                draft_vocab_size=int(data["draft_vocab_size"]),
                layer_ids=[int(i) for i in data["eagle_aux_hidden_state_layer_ids"]],
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
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EagleError(f"{source}: malformed EAGLE-3 config ({type(exc).__name__}: {exc})") from None


# Fields that must agree between a drafter and the target/data it is trained or run with.
FIT_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "draft_vocab_size",
    "layer_ids",
)


def fit_problems(have: DraftConfig, want: DraftConfig, fields: tuple[str, ...] = FIT_FIELDS) -> list[str]:
    """`field: drafter has X, target/data need Y` for every field in which `have` differs from `want`."""
    return [
        f"{name}: drafter has {getattr(have, name)}, target/data need {getattr(want, name)}"
        for name in fields
        if getattr(have, name) != getattr(want, name)
    ]


def expected_draft_config(target_config: dict[str, Any], layer_ids: list[int], draft_vocab_size: int,
                          speculative_tokens: int, norm_before_residual: bool = False,
                          verifier: str | None = None) -> DraftConfig:
    """The DraftConfig a drafter for this target (its config.json dict) and this data must have."""
    return DraftConfig.from_config_json({
        "speculators_model_type": "eagle3",
        "transformer_layer_config": target_config,
        "speculators_config": {"proposal_methods": [{"speculative_tokens": speculative_tokens}],
                               "verifier": {"name_or_path": verifier}},
        "draft_vocab_size": draft_vocab_size,
        "norm_before_residual": norm_before_residual,
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
    }, source="target config.json")


def expected_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every required tensor (optional ones: see `optional_shapes`)."""
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv, n_aux = cfg.num_attention_heads, cfg.num_key_value_heads, len(cfg.layer_ids)
    return {
        "fc.weight": (h, n_aux * h),
        "layers.0.self_attn.q_proj.weight": (nh * hd, 2 * h),
        "layers.0.self_attn.k_proj.weight": (nkv * hd, 2 * h),
        "layers.0.self_attn.v_proj.weight": (nkv * hd, 2 * h),
        "layers.0.self_attn.o_proj.weight": (h, nh * hd),
        "layers.0.mlp.gate_proj.weight": (i, h),
        "layers.0.mlp.up_proj.weight": (i, h),
        "layers.0.mlp.down_proj.weight": (h, i),
        "layers.0.hidden_norm.weight": (h,),
        "layers.0.input_layernorm.weight": (h,),
        "layers.0.post_attention_layernorm.weight": (h,),
        "norm.weight": (h,),
        "lm_head.weight": (cfg.draft_vocab_size, h),
        "d2t": (cfg.draft_vocab_size,),
    }


def optional_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    return {"t2d": (cfg.vocab_size,), "embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}


def shape_problems(cfg: DraftConfig, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """Every missing, unexpected or mis-shaped tensor, one line each."""
    want = expected_shapes(cfg)
    opt = optional_shapes(cfg)
    problems = [f"missing tensor {name} {list(shape)}" for name, shape in want.items() if name not in shapes]
    for name, shape in shapes.items():
        target = want.get(name, opt.get(name))
        if target is None:
            problems.append(f"unexpected tensor {name}")
        elif tuple(shape) != target:
            problems.append(f"{name} has shape {list(shape)}, expected {list(target)}")
    return problems


def _jsonable(value: Any) -> Any:
    """torch.dtype values (transformers puts them in configs after loading) -> "float32" etc."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if type(value).__module__ == "torch" and str(value).startswith("torch."):
        return str(value).removeprefix("torch.")
    return value


def normalize_config(data: dict[str, Any]) -> dict[str, Any]:
    """The config.json vLLM wants from what speculators' config.to_dict() gives (pure)."""
    out = {k: _jsonable(v) for k, v in data.items() if k not in _DROP_KEYS}
    out["speculators_model_type"] = "eagle3"
    out["norm_before_residual"] = bool(out.get("norm_before_residual", False))
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        if out.get(flag):
            raise EagleError(f"{flag}=True is not supported by every vLLM version; train with it off")
        out[flag] = False
    tl = dict(out["transformer_layer_config"])
    tl["num_hidden_layers"] = 1
    tl.pop("_attn_implementation", None)
    tl.pop("_name_or_path", None)
    tl["architectures"] = ["LlamaForCausalLM"]
    out["transformer_layer_config"] = tl
    out["architectures"] = ["Eagle3Speculator"]
    return out


def _atomic_write_bytes(path: Path, write: Any) -> None:
    """Write via `write(tmp_path)` to a temp file in the same dir, fsync, rename over `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_checkpoint(out: str | os.PathLike[str], config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> DraftConfig:
    """Validate and write `out/config.json` + `out/model.safetensors`, each atomically.

    The weights are replaced first, then the config; a failed validation writes nothing.
    """
    from safetensors.torch import save_file

    out = Path(out)
    config = normalize_config(config)
    cfg = DraftConfig.from_config_json(config, source=str(out / CONFIG_FILE))
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    problems = shape_problems(cfg, {k: tuple(v.shape) for k, v in tensors.items()})
    if problems:
        raise EagleError(f"refusing to write a malformed checkpoint to {out}: " + "; ".join(problems))
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(out / WEIGHTS_FILE, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    _atomic_write_bytes(out / CONFIG_FILE, lambda p: p.write_text(text))
    return cfg


def read_config_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    file = path / CONFIG_FILE if path.is_dir() else path
    if not file.exists():
        raise EagleError(f"{file}: not found (is {path} a drafter checkpoint written by `eagle train`?)")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise EagleError(f"{file}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None


def read_draft_config(path: str | os.PathLike[str]) -> DraftConfig:
    """The DraftConfig of the checkpoint directory `path` (EagleError if it is not one)."""
    path = Path(path)
    return DraftConfig.from_config_json(read_config_json(path), source=str(path / CONFIG_FILE))


def load_draft_state(path: str | os.PathLike[str], device: str = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint in `path`, validated against its config.json."""
    from eagle.common import load_safetensors

    path = Path(path)
    cfg = read_draft_config(path)
    file = path / WEIGHTS_FILE
    if not file.exists():
        raise EagleError(f"{file}: not found (the checkpoint has a config.json but no weights)")
    state = load_safetensors(file, device=device, what="drafter weights file")
    problems = shape_problems(cfg, {k: tuple(v.shape) for k, v in state.items()})
    if problems:
        raise EagleError(f"{file}: does not match its config.json: " + "; ".join(problems))
    return state
