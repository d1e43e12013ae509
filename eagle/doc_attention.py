"""Per-document attention for the drafter's packed training batches (an SDPA backend).

speculators' Eagle3DraftModel takes one packed row [1, T] and, on its sdpa path, builds a dense
[T, (k+1)T] mask (causal + same document in the first block, the diagonal in the k draft blocks),
so attention costs O(T^2) over the whole pack although a token only sees its own document.
This backend gathers the pack's documents into a batch [B, Lmax] (index `doc_index`, padding
marked by `doc_valid`, both from eagle.dataset.collate), runs SDPA per document with the same
mask restricted to it, and scatters the result back: the same attention, B times fewer FLOPs for
B equal documents. Without `doc_index` (evaluation, drafting) it is transformers' plain SDPA.

Use: `drafter.set_attn_impl(model, doc_attention.register())`, then pass `doc_index=` and
`doc_valid=` to the model's forward (they reach the attention through its **kwargs).
"""

from __future__ import annotations

from typing import Any

import torch

IMPL = "eagle_doc_sdpa"


def layout(lengths: list[int], multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(doc_index [B, Lmax] long, doc_valid [B, Lmax] bool) of documents packed back to back.

    `multiple` rounds Lmax up (the extra columns are padding, masked like the rest): packs of
    varying document lengths then share a few attention shapes (cuDNN builds a plan per shape).

    doc_valid is stored as the flat positions of the real entries in the [B * Lmax] grid (long [T])
    so the attention can gather them back without a host sync; `valid_mask` turns it into the mask."""
    lmax, starts = -(-max(lengths) // max(1, multiple)) * max(1, multiple), [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    pos = torch.arange(lmax)
    index = torch.stack([s + pos.clamp(max=n - 1) for s, n in zip(starts, lengths, strict=True)])
    valid = pos[None, :] < torch.tensor(lengths)[:, None]
    return index, valid.flatten().nonzero().squeeze(1)


def valid_mask(doc_valid: torch.Tensor, b: int, lmax: int) -> torch.Tensor:
    """[B, Lmax] bool from layout()'s flat positions."""
    return torch.zeros(b * lmax, dtype=torch.bool, device=doc_valid.device).index_fill_(0, doc_valid, True).view(b, lmax)


def doc_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: torch.Tensor | None, doc_index: torch.Tensor | None = None,
             doc_valid: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key/value [1, Hkv, (j+1)T, D] (the draft steps' caches back to back)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if doc_index is None or doc_valid is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    t = query.shape[2]
    blocks = key.shape[2] // t
    b, lmax = doc_index.shape
    q = query[0][:, doc_index].transpose(0, 1)  # [B, H, L, D]
    cols = (doc_index[:, None, :] + t * torch.arange(blocks, device=query.device)[None, :, None]).reshape(b, -1)
    k = key[0][:, cols].transpose(0, 1)  # [B, Hkv, (j+1)L, D]
    v = value[0][:, cols].transpose(0, 1)
    ar = torch.arange(lmax, device=query.device)
    first = (ar[:, None] >= ar[None, :])[None] & valid_mask(doc_valid, b, lmax)[:, None, :]  # causal within the document
    diag = (ar[:, None] == ar[None, :]).expand(b, lmax, lmax)  # draft step i sees its own position
    mask = torch.cat([first] + [diag] * (blocks - 1), dim=-1)[:, None]  # [B, 1, L, (j+1)L]
    kwargs.pop("is_causal", None)
    out, _ = sdpa_attention_forward(module, q, k, v, mask, is_causal=False, **kwargs)  # [B, L, H, D]
    # documents are contiguous and in order: the real rows, in grid order, are the pack [1, T, H, D]
    return out.reshape(b * lmax, *out.shape[2:]).index_select(0, doc_valid).unsqueeze(0), None


def register() -> str:
    """Register the backend with transformers (idempotent); returns its name for set_attn_impl."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPL, doc_sdpa)
    return IMPL
