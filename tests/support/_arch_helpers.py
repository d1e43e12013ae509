"""Targets of every architecture for the tests (test_target, test_generic_decode, test_arch_e2e); loaded by path.

- `random_target(arch, out)`: an untrained toy-shaped target (eagle/toy.py's config for the arch, the
  toy tokenizer), in a second, for tests of reading, shapes and decoding code;
- `remote_code_target(src, out)`: a copy of a target whose config, model and tokenizer are custom
  code that the directory itself carries (auto_map), as Kimi's are: loading it needs
  trust_remote_code. Its classes subclass transformers' Llama ones, so it computes exactly what
  the source llama target computes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch


def random_target(arch: str, out: Path, seed: int = 0, **overrides: int) -> Path:
    """An untrained target of `arch` (llama, qwen3, deepseek_v3, kimi_k25) with the toy tokenizer."""
    from eagle import toy

    cfg = toy.ToyConfig(arch=arch, steps=0, **overrides)
    tok = toy.build_tokenizer(cfg.vocab)
    text_cfg = cfg.model_copy(update={"arch": "deepseek_v3"}) if arch == "kimi_k25" else cfg
    torch.manual_seed(seed)
    model = toy.build_model(text_cfg, tok).eval()
    with torch.no_grad():  # sharper logits than the default init: fewer near-ties in greedy decoding
        model.lm_head.weight.mul_(20)
    meta = toy.ToyMeta(config=cfg, final_loss=float("nan"), build_seconds=0.0, chain_seed=cfg.seed)
    if arch == "kimi_k25":
        model = toy.wrap_kimi_k25(model)
    toy._save(out, model, tok, meta, 0.0)
    return out


CONFIG_PY = '''from transformers import LlamaConfig


class ToyRemoteConfig(LlamaConfig):
    model_type = "toy_remote"
'''
MODELING_PY = '''from transformers import LlamaForCausalLM, LlamaModel

from .configuration_toy_remote import ToyRemoteConfig


class ToyRemoteModel(LlamaModel):
    config_class = ToyRemoteConfig


class ToyRemoteForCausalLM(LlamaForCausalLM):
    config_class = ToyRemoteConfig
'''
TOKENIZER_PY = '''from transformers import PreTrainedTokenizerFast


class ToyRemoteTokenizer(PreTrainedTokenizerFast):
    pass
'''


def remote_code_target(src: Path, out: Path) -> Path:
    """`src` (a llama target) as a custom-code model: model_type toy_remote, auto_map for
    AutoConfig / AutoModelForCausalLM / AutoTokenizer pointing at Python files in `out`."""
    shutil.copytree(src, out)
    (out / "configuration_toy_remote.py").write_text(CONFIG_PY)
    (out / "modeling_toy_remote.py").write_text(MODELING_PY)
    (out / "tokenization_toy_remote.py").write_text(TOKENIZER_PY)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(model_type="toy_remote", architectures=["ToyRemoteForCausalLM"], auto_map={
        "AutoConfig": "configuration_toy_remote.ToyRemoteConfig",
        "AutoModel": "modeling_toy_remote.ToyRemoteModel",
        "AutoModelForCausalLM": "modeling_toy_remote.ToyRemoteForCausalLM"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    tk = json.loads((out / "tokenizer_config.json").read_text())
    tk.update(tokenizer_class="ToyRemoteTokenizer",
              auto_map={"AutoTokenizer": [None, "tokenization_toy_remote.ToyRemoteTokenizer"]})
    (out / "tokenizer_config.json").write_text(json.dumps(tk, indent=2))
    return out


ARCHS = ["llama", "qwen3", "deepseek_v3", "kimi_k25"]


def random_targets(root: Path) -> dict[str, Path]:
    """A random target of every architecture in `ARCHS` under `root`, and "remote": the llama one
    as a custom-code model (test_target, test_generic_decode)."""
    out = {arch: random_target(arch, root / arch) for arch in ARCHS}
    out["remote"] = remote_code_target(out["llama"], root / "remote")
    return out
