"""An MLA EAGLE-3 drafter as vLLM's Eagle3DeepseekV2ForCausalLM reads it, with random weights: for
tests/eagle/drafter/test_mla_drafters.py and the GPU suite (imported by name: tests/support is on
sys.path)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from eagle.fsutil import atomic_write_json

HIDDEN, VOCAB, DRAFT_VOCAB, HEADS = 128, 2048, 256, 2
Q_LORA, KV_LORA, NOPE, ROPE, V = 32, 32, 16, 16, 16
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def mla_drafter(out: Path, seed: int = 0, kv_lora: int = KV_LORA, drop: str | None = None, heads: int = HEADS,
                q_lora: int = Q_LORA, nope: int = NOPE, rope: int = ROPE, v: int = V, yarn: bool = True) -> Path:
    """An MLA drafter as vLLM's Eagle3DeepseekV2ForCausalLM reads it: a top-level DeepSeek config typed
    deepseek_v2 (vLLM turns a deepseek_v3 one into its MTP model), yarn rope, eagle_config, weights under
    midlayer.*, bf16, no embedding; random weights."""
    config = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": HIDDEN,
              "intermediate_size": 256, "num_attention_heads": heads, "num_key_value_heads": heads,
              "q_lora_rank": q_lora, "kv_lora_rank": kv_lora, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
              "v_head_dim": v, "rms_norm_eps": 1e-6, "vocab_size": VOCAB, "max_position_embeddings": 512,
              "rope_parameters": YARN if yarn else {"rope_type": "default", "rope_theta": 10000.0},
              "rope_interleave": True, "hidden_act": "silu", "num_hidden_layers": 1,
              "draft_vocab_size": DRAFT_VOCAB, "torch_dtype": "bfloat16",
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5], "use_aux_hidden_state": True}}
    g = torch.Generator().manual_seed(seed)
    a, h = "midlayer.self_attn.", HIDDEN
    shapes = {"fc.weight": (h, 3 * h), a + "q_a_proj.weight": (q_lora, 2 * h), a + "q_b_proj.weight":
              (heads * (nope + rope), q_lora), a + "kv_a_proj_with_mqa.weight": (kv_lora + rope, 2 * h),
              a + "kv_b_proj.weight": (heads * (nope + v), kv_lora), a + "o_proj.weight": (h, heads * v),
              "midlayer.mlp.gate_proj.weight": (256, h), "midlayer.mlp.up_proj.weight": (256, h),
              "midlayer.mlp.down_proj.weight": (h, 256), "lm_head.weight": (DRAFT_VOCAB, h)}
    tensors = {k: (torch.randn(s, generator=g) * 0.05).to(torch.bfloat16) for k, s in shapes.items()}
    norms = {a + "q_a_layernorm.weight": q_lora, a + "kv_a_layernorm.weight": kv_lora, "norm.weight": h,
             "midlayer.hidden_norm.weight": h, "midlayer.input_layernorm.weight": h,
             "midlayer.post_attention_layernorm.weight": h}
    tensors.update({k: (1 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16) for k, n in norms.items()})
    tensors["d2t"] = torch.zeros(DRAFT_VOCAB, dtype=torch.int64)  # draft ids 0..255 = target ids 0..255
    tensors["t2d"] = torch.arange(VOCAB) < DRAFT_VOCAB
    if drop:
        del tensors[drop]
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    atomic_write_json(out / "config.json", config, indent=2)
    return out
