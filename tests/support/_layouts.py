"""Every published EAGLE-3 checkpoint layout, written from one of our trained drafters (no network).

Each builder takes a drafter checkpoint written by `eagle train` and writes the same weights in
another layout, the way its publishers write it. Imported by name (tests/ is on sys.path).

- `specforge`: SpecForge / SGLang / original EAGLE: a top-level llama config, architectures
  ["LlamaForCausalLMEagle3"], eagle_config.eagle_aux_hidden_state_layer_ids, weights under
  midlayer.*, bf16, no embedding;
- `specforge_wide`: the same with a decoder layer wider than the target's (intermediate size
  padded with zero rows/columns: the same function, another shape), as the Kimi-K2 drafters are;
- `null_ids`: `speculators convert` without layer ids: eagle_aux_hidden_state_layer_ids null;
- `no_ids_key`: a speculators checkpoint older than that key;
- `speculators_save`: what speculators 0.9's own `save_pretrained` writes (architectures
  Eagle3DraftModel, auto_map, float32, embedding included); used with a drafter trained with its
  default norm flags (norm_before_fc, norm_output, norm_before_residual).
- `specforge_kimi_k2`: SpecForge's own Kimi-K2 draft config (configs/kimi-k2-eagle3.json): the
  `specforge` layout with model_type "kimi_k2" and that file's keys in its order (bos/eos ids,
  max_window_layers, sliding_window, transformers_version ...);
- `specforge_output_ids`: the `specforge` layout with its ids in SGLang's output-of-layer
  convention (ours minus one: [2, 4, 5] -> [1, 3, 4]), as SpecForge writes the ids it trained on;
- `with_embedding(src, out, embedding)`: ours plus an embed_tokens.weight: `garbage_embedding` (the
  bytes torch.empty hands back after a buffer of int64 token ids, read as bf16) or all zeros.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

_LAYER_KEYS_DROPPED = ("architectures", "dtype", "torch_dtype", "transformers_version", "_attn_implementation")


def _ours(src: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((src / "config.json").read_text()), load_file(str(src / "model.safetensors"))


def _write(out: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


def specforge(src: Path, out: Path, widen: int = 0) -> Path:
    cfg, tensors = _ours(src)
    layer = {k: v for k, v in cfg["transformer_layer_config"].items() if k not in _LAYER_KEYS_DROPPED}
    config = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "torch_dtype": "bfloat16",
              "draft_vocab_size": cfg["draft_vocab_size"],
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": cfg["eagle_aux_hidden_state_layer_ids"],
                               "use_aux_hidden_state": True}}
    for flag in ("norm_before_residual", "norm_output", "fc_norm"):
        if cfg.get(flag):
            config[flag] = True
    if cfg.get("norm_before_fc"):
        config["eagle_config"]["norm_before_fc"] = True
    renamed = {}
    for name, t in tensors.items():
        if name == "embed_tokens.weight":
            continue
        name = name.replace("layers.0.", "midlayer.", 1)
        renamed[name] = t.to(torch.bfloat16) if t.is_floating_point() else t
    if widen:
        config["intermediate_size"] = layer["intermediate_size"] + widen
        for proj in ("gate_proj", "up_proj"):
            w = renamed[f"midlayer.mlp.{proj}.weight"]
            renamed[f"midlayer.mlp.{proj}.weight"] = torch.cat([w, w.new_zeros(widen, w.shape[1])])
        w = renamed["midlayer.mlp.down_proj.weight"]
        renamed["midlayer.mlp.down_proj.weight"] = torch.cat([w, w.new_zeros(w.shape[0], widen)], dim=1)
    return _write(out, config, renamed)


def specforge_wide(src: Path, out: Path) -> Path:
    return specforge(src, out, widen=48)


def null_ids(src: Path, out: Path) -> Path:
    cfg, tensors = _ours(src)
    cfg["eagle_aux_hidden_state_layer_ids"] = None
    return _write(out, cfg, tensors)


def no_ids_key(src: Path, out: Path) -> Path:
    cfg, tensors = _ours(src)
    del cfg["eagle_aux_hidden_state_layer_ids"]
    return _write(out, cfg, tensors)


def speculators_save(src: Path, out: Path, target: Path) -> Path:
    """speculators' own save_pretrained of the drafter in `src` (loaded by speculators)."""
    from eagle.drafter import model as drafter

    model = drafter.load_drafter(src, target_dir=target)
    model.save_pretrained(str(out))
    return out


def copy_tree(src: Path, out: Path) -> Path:
    shutil.copytree(src, out)
    return out


LAYOUTS: dict[str, Callable[..., Path]] = {
    "specforge": specforge,
    "specforge_wide": specforge_wide,
    "null_ids": null_ids,
    "no_ids_key": no_ids_key,
}


def specforge_kimi_k2(src: Path, out: Path) -> Path:
    specforge(src, out)
    cfg = json.loads((out / "config.json").read_text())
    layer = {k: v for k, v in cfg.items() if k not in ("architectures", "eagle_config", "torch_dtype",
                                                      "draft_vocab_size")}
    kimi = {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": cfg["eagle_config"],
            "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,  # the toy's
            "head_dim": layer.get("head_dim") or layer["hidden_size"] // layer["num_attention_heads"]}
    kimi.update({k: v for k, v in layer.items() if k not in kimi})
    kimi.update({"max_window_layers": 48, "model_type": "kimi_k2", "num_hidden_layers": 1, "rope_scaling": None,
                 "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                 "transformers_version": "4.53.2", "use_cache": True, "use_sliding_window": False,
                 "draft_vocab_size": cfg["draft_vocab_size"]})
    (out / "config.json").write_text(json.dumps(kimi, indent=2))
    return out


def specforge_output_ids(src: Path, out: Path) -> Path:
    specforge(src, out)
    cfg = json.loads((out / "config.json").read_text())
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in ids]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def garbage_embedding(vocab: int, hidden: int, seed: int = 0) -> torch.Tensor:
    """[vocab, hidden] bf16 as torch.empty returns it from memory that last held int64 token ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (vocab * hidden // 4,), generator=g, dtype=torch.int64)
    return ids.view(torch.bfloat16).reshape(vocab, hidden).clone()


def with_embedding(src: Path, out: Path, embedding: torch.Tensor) -> Path:
    cfg, tensors = _ours(src)
    return _write(out, cfg, {**tensors, "embed_tokens.weight": embedding})
