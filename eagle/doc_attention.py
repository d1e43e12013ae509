"""Per-document attention for the drafter's packed training batches (an SDPA backend).

speculators' Eagle3DraftModel takes one packed row [1, T] and, on its sdpa path, builds a dense
[T, (k+1)T] mask (causal + same document in the first block, the diagonal in the k draft blocks),
so attention costs O(T^2) over the whole pack although a token only sees its own document.
This backend gathers the pack's documents into a batch [B, Lmax] (index `doc_index`, padding
marked by `doc_mask`, both from eagle.dataset.collate), runs SDPA per document with the same
mask restricted to it, and scatters the result back (`doc_pos`): the same attention, B times fewer
FLOPs for B equal documents. Without `doc_index` (drafting) it is transformers' plain SDPA.

Use: `drafter.set_attn_impl(model, doc_attention.register())`, then pass the LAYOUT_KEYS tensors
to the model's forward (they reach the attention through its **kwargs).
"""

from __future__ import annotations

from typing import Any

import torch

IMPL = "eagle_doc_sdpa"


LAYOUT_KEYS = ("doc_index", "doc_pos", "doc_mask")


def layout(lengths: list[int], multiple: int = 1, total: int | None = None) -> dict[str, torch.Tensor]:
    """Where the documents of a pack (back to back, then `total - sum(lengths)` padding tokens) sit
    in the per-document grid [B, Lmax]:

      doc_index [B, Lmax] long   the pack position each grid cell reads (padding cells repeat the
                                 document's last token)
      doc_mask  [B, Lmax] bool   the cells that hold a real token
      doc_pos   [total] long     the grid cell (flat, in [0, B * Lmax)) of each pack position; the pack's
                                 padding tokens read cell 0 (their outputs carry no loss, so no gradient)

    `multiple` rounds Lmax up (extra columns are padding, masked like the rest): packs of varying
    document lengths then share a few attention shapes. Every tensor is built on the host, so the
    attention gathers and scatters without a host sync."""
    total = sum(lengths) if total is None else total
    if total < sum(lengths):
        raise ValueError(f"a pack of {total} tokens cannot hold documents of {sum(lengths)}")
    lmax, starts = -(-max(lengths) // max(1, multiple)) * max(1, multiple), [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    pos = torch.arange(lmax)
    index = torch.stack([s + pos.clamp(max=n - 1) for s, n in zip(starts, lengths, strict=True)])
    mask = pos[None, :] < torch.tensor(lengths)[:, None]
    cells = mask.flatten().nonzero().squeeze(1)
    doc_pos = torch.cat([cells, cells.new_zeros(total - cells.shape[0])])
    return {"doc_index": index, "doc_pos": doc_pos, "doc_mask": mask}


def doc_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: torch.Tensor | None, doc_index: torch.Tensor | None = None,
             doc_pos: torch.Tensor | None = None, doc_mask: torch.Tensor | None = None,
             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key/value [1, Hkv, (j+1)T, D] (the draft steps' caches back to back)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if doc_index is None or doc_pos is None or doc_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    t = query.shape[2]
    blocks = key.shape[2] // t
    b, lmax = doc_index.shape
    q = query[0][:, doc_index].transpose(0, 1)  # [B, H, L, D]
    cols = (doc_index[:, None, :] + t * torch.arange(blocks, device=query.device)[None, :, None]).reshape(b, -1)
    k = key[0][:, cols].transpose(0, 1)  # [B, Hkv, (j+1)L, D]
    v = value[0][:, cols].transpose(0, 1)
    ar = torch.arange(lmax, device=query.device)
    diag = (ar[:, None] == ar[None, :]).expand(b, lmax, lmax)  # draft step i sees its own position
    # causal within the document; every cell also sees itself, so no row is fully masked (a padding
    # cell's output is never read, but a NaN there would poison the backward)
    first = ((ar[:, None] >= ar[None, :])[None] & doc_mask[:, None, :]) | diag
    mask = torch.cat([first] + [diag] * (blocks - 1), dim=-1)[:, None]  # [B, 1, L, (j+1)L]
    kwargs.pop("is_causal", None)
    out, _ = sdpa_attention_forward(module, q, k, v, mask, is_causal=False, **kwargs)  # [B, L, H, D]
    return out.reshape(b * lmax, *out.shape[2:]).index_select(0, doc_pos).unsqueeze(0), None  # [1, T, H, D]


def register() -> str:
    """Register the backend with transformers (idempotent); returns its name for set_attn_impl."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPL, doc_sdpa)
    return IMPL
