"""The MLA drafter's decoder layer (vLLM's Eagle3DeepseekV2ForCausalLM, SGLang's DeepseekV3ForCausalLMEagle3):
its transformers config and the widening of transformers' DeepseekV3Attention to EAGLE-3's 2H input.

Shared by the trainable drafter (eagle/drafter/model.py, speculators) and the pure-torch one
(eagle/decode/mla_ops.py); torch and transformers are imported when called.
"""

from __future__ import annotations

from typing import Any


def mla_layer_config(layer: dict[str, Any]) -> Any:
    """transformers' DeepseekV3Config of an MLA drafter's layer dict (transformer_layer_config): one
    layer, dense (first_k_dense_replace 1: its MLP is intermediate_size wide, as vLLM builds it)."""
    from transformers import DeepseekV3Config

    keep = {k: v for k, v in layer.items()
            if k not in ("model_type", "architectures", "dtype", "torch_dtype", "transformers_version", "auto_map",
                         "_name_or_path", "head_dim")}
    cfg = DeepseekV3Config(**keep)
    cfg.num_hidden_layers = 1
    cfg.first_k_dense_replace = 1
    cfg.tie_word_embeddings = False
    return cfg



def widen_eagle3_inputs(attn: Any, config: Any) -> None:
    """Make a transformers DeepseekV3Attention read 2 * hidden_size (EAGLE-3's cat(embeds, hidden)):
    q_a_proj (q_proj without q_lora_rank) and kv_a_proj_with_mqa, on the default device."""
    from torch import nn

    two_h, bias = 2 * config.hidden_size, bool(config.attention_bias)
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    if config.q_lora_rank is None:
        attn.q_proj = nn.Linear(two_h, config.num_attention_heads * qk, bias=False)
    else:
        attn.q_a_proj = nn.Linear(two_h, config.q_lora_rank, bias=bias)
    attn.kv_a_proj_with_mqa = nn.Linear(two_h, config.kv_lora_rank + config.qk_rope_head_dim, bias=bias)


