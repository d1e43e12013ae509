"""The MLA drafter's attention over a static cache (eagle/decode/draft_infer.py), built on transformers'
DeepseekV3Attention rather than written anew.

The layer IS a transformers `DeepseekV3Attention` (q_a_proj / q_a_layernorm / q_b_proj or
q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj: the checkpoint's names), with the
two projections that read the layer's input widened to 2H (EAGLE-3's cat(embeds, hidden), as vLLM's
DeepseekV2Eagle3DecoderLayer does). Its forward is transformers' with the cache made static:

- the cache holds the compressed latents, as transformers' own MLA cache does: `k` [1, S, kv_lora_rank]
  (kv_a_layernorm applied) and `v` [1, S, qk_rope_head_dim] (the shared rope key, rotated), written at
  the rows' slots;
- every step expands the latents of all S slots with the attention's own `expand_kv` (kv_b_proj) and
  attends (scaled_dot_product_attention) with its `scaling` (yarn's mscale folded in) under the cache's slot mask;
- rope: transformers' DeepseekV3RotaryEmbedding (every rope type it knows, yarn included) at the
  rows' positions, applied interleaved or not as the config's `rope_interleave` says.

A "triton" cache is not used here (`Drafter.new_cache` gives an MLA drafter an sdpa cache).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
    apply_rotary_pos_emb,
    apply_rotary_pos_emb_interleave,
)

from eagle.decode.llama_ops import AttnMask, KVCache, Rope
from eagle.drafter.mla import widen_eagle3_inputs

if TYPE_CHECKING:
    from transformers import DeepseekV3Config


class MlaRope(Rope):
    """(cos, sin) [T, qk_rope_head_dim] of the rows' positions from transformers' DeepseekV3RotaryEmbedding."""

    def __init__(self, config: Any, device=None) -> None:
        rotary = DeepseekV3RotaryEmbedding(config).to(device)
        super().__init__(rotary.inv_freq, float(rotary.attention_scaling))
        self.rotary = rotary

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        dummy = torch.empty(0, dtype=dtype, device=positions.device)
        cos, sin = self.rotary(dummy, positions[None])
        return cos[0], sin[0]

    def table(self, rows: int, dtype: torch.dtype, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError("an MLA drafter's cache is sdpa, never triton: it has no rope tables")


class MlaAttention(DeepseekV3Attention):
    """The EAGLE-3 MLA attention over a static latent cache (see the module docstring)."""

    def __init__(self, config: DeepseekV3Config) -> None:
        super().__init__(config, layer_idx=0)
        widen_eagle3_inputs(self, config)
        self.interleave = bool(getattr(config, "rope_interleave", True))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,  # type: ignore[override]
                slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: AttnMask) -> torch.Tensor:
        """x [T, 2H] at cache `slots` -> the attention output [T, H]; cos / sin [T, rope dim]."""
        t = x.shape[0]
        a: Any = self  # (transformers types q_proj / q_a_proj / q_b_proj Optional: the config sets which exist)
        q = a.q_proj(x) if self.q_lora_rank is None else a.q_b_proj(a.q_a_layernorm(a.q_a_proj(x)))
        q = q.view(1, t, -1, self.qk_head_dim).transpose(1, 2)  # [1, nh, T, qk]
        q_pass, q_rot = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        kv_nope, k_rot = torch.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        kv_nope = self.kv_a_layernorm(kv_nope)
        rotate = apply_rotary_pos_emb_interleave if self.interleave else apply_rotary_pos_emb
        q_rot, k_rot = rotate(q_rot, k_rot.view(1, 1, t, -1), cos[None], sin[None])
        k_cache.index_copy_(1, slots, kv_nope[None].to(k_cache.dtype))
        v_cache.index_copy_(1, slots, k_rot[0].to(v_cache.dtype))
        key, value = self.expand_kv(k_cache[None], v_cache[None])  # [1, nh, S, qk], [1, nh, S, v]
        query = torch.cat((q_pass, q_rot), dim=-1)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask.additive[None, None],
                                             scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(t, -1))


def new_latent_cache(config: Any, max_len: int, device, dtype) -> KVCache:
    """A one-layer sdpa cache of latents: k [1, S, kv_lora_rank], v [1, S, qk_rope_head_dim]."""
    cache = KVCache(1, 1, config.kv_lora_rank, max_len, device, dtype, "sdpa")
    cache.v = [torch.zeros(1, cache.max_len, config.qk_rope_head_dim, device=device, dtype=dtype)]
    return cache
