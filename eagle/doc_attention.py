"""Per-document attention for the drafter's packed training batches (an SDPA backend).

speculators' Eagle3DraftModel takes one packed row [1, T] and, on its sdpa path, builds a dense
[T, (k+1)T] mask (causal + same document in the first block, the diagonal in the k draft blocks),
so attention costs O(T^2) over the whole pack although a token only sees its own document.
This backend gathers the pack's documents into a batch [B, Lmax] (index `doc_index`, padding
marked by `doc_mask`, both from eagle.dataset.collate), runs the same attention per document as
one causal, mask-free SDPA (the draft blocks' diagonal folded in as anchor keys: see doc_sdpa), and
scatters the result back (`doc_pos`): B times fewer FLOPs for B equal documents, no mask to build
or read, and the kernels that skip the upper triangle. Without `doc_index` (drafting) it is transformers' plain SDPA.

Use: `train.use_doc_attention(model)` (the backend, and `no_mask` as the drafter's mask builder),
then pass the LAYOUT_KEYS tensors to the model's forward (they reach the attention through its
**kwargs).
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
    """query [1, H, T, D], key/value [1, Hkv, (j+1)T, D] (the draft steps' caches back to back).

    Draft step j's query at position t sees its document's context causally (block 0) and, in each
    of the j earlier draft blocks, only position t itself (the diagonal). Computed as ONE causal,
    mask-free SDPA per document (flash / cuDNN kernels, the upper triangle skipped) instead of a
    dense masked [L, (j+1)L] one: the j diagonal keys become j "anchor" keys in front of the
    sequence that every query sees, each query carrying its own diagonal score in extra head
    dimensions (`_with_anchors`); the anchors' values are one-hot columns, so the kernel returns the
    diagonal terms' softmax weights beside the context's part, and their values are added outside.
    Padding cells sit at the end of each document's row, so causality alone keeps them from real
    rows (their own outputs are never read)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if doc_index is None or doc_pos is None or doc_mask is None:
        if attention_mask is None and query.shape[2] > 1:
            raise ValueError("per-document attention got a batch without its layout (doc_index, doc_pos, doc_mask) "
                             "and no mask: build batches with eagle.dataset.collate(layout=True)")
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    t, d = query.shape[2], query.shape[3]
    steps = key.shape[2] // t - 1
    b, lmax = doc_index.shape
    kwargs.pop("is_causal", None)
    scaling = kwargs.pop("scaling", None)
    scaling = float(scaling) if scaling is not None else d ** -0.5
    q = query[0][:, doc_index].transpose(0, 1)  # [B, H, L, D]
    k = key[0][:, doc_index].transpose(0, 1)  # [B, Hkv, L, D]: block 0, the context
    v = value[0][:, doc_index].transpose(0, 1)
    if steps == 0:
        out, _ = sdpa_attention_forward(module, q, k, v, None, is_causal=True, scaling=scaling, **kwargs)
    else:
        cols = doc_index[:, None, :] + t * torch.arange(1, steps + 1, device=query.device)[None, :, None]
        kd = key[0][:, cols].transpose(0, 1)  # [B, Hkv, j, L, D]: the diagonal blocks
        vd = value[0][:, cols].transpose(0, 1)
        qa, ka, va = _with_anchors(q, k, v, kd)
        out, _ = sdpa_attention_forward(module, qa, ka, va, None, is_causal=True, scaling=scaling, **kwargs)
        out = out[:, steps:]  # [B, L, H, D + pad]: the anchors' dummy query rows dropped
        hkv = kd.shape[1]
        w = out[..., d : d + steps].unflatten(2, (hkv, -1))  # [B, L, Hkv, g, j]: the diagonal weights
        extra = torch.einsum("blkgi,bkild->blkgd", w, vd).flatten(2, 3)
        out = out[..., :d] + extra
    return out.reshape(b * lmax, *out.shape[2:]).index_select(0, doc_pos).unsqueeze(0), None  # [1, T, H, D]


def _with_anchors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  kd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, H, L, D], k/v [B, Hkv, L, D], diagonal keys kd [B, Hkv, j, L, D] -> (q', k', v') of
    length j + L and head size D + pad (a multiple of 8, as the flash kernels want):

      k'  j anchor keys (anchor i: 1 in columns D + 2i and D + 2i + 1, else 0), then k padded with 0
      q'  j zero rows (their outputs are dropped), then q with, in columns D + 2i and D + 2i + 1, the
          diagonal score q . kd_i in two parts (high and low) so that a bf16 q' carries it to ~16
          bits; the kernel adds the parts in fp32. Scores against k are unchanged.
      v'  anchor i's value is 1 in column D + i; v padded with 0.

    Under a causal mask (top-left aligned, query rows = key rows) every real query sees all anchors
    and its context, so softmax runs over context and diagonal together: the output's columns D..D+j
    are the diagonal keys' weights."""
    bsz, h, length, d = q.shape
    hkv, steps = kd.shape[1], kd.shape[2]
    pad = -(-(d + 2 * steps) // 8) * 8 - d
    score = (q.float().unflatten(1, (hkv, -1)).unsqueeze(3) * kd.float().unsqueeze(2)).sum(-1)  # [B, Hkv, g, j, L]
    score = score.flatten(1, 2).permute(0, 1, 3, 2)  # [B, H, L, j]
    high = score.to(q.dtype)
    low = (score - high.float()).to(q.dtype)
    extra_q = torch.stack([high, low], dim=-1).flatten(-2)  # [B, H, L, 2j]: high_0, low_0, high_1, ...
    zeros_q = q.new_zeros(bsz, h, length, pad - 2 * steps)
    qa = torch.cat([q.new_zeros(bsz, h, steps, d + pad), torch.cat([q, extra_q, zeros_q], dim=-1)], dim=2)
    eye = torch.eye(steps, dtype=q.dtype, device=q.device)
    anchors_k = torch.cat([q.new_zeros(steps, d), eye.repeat_interleave(2, dim=1), q.new_zeros(steps, pad - 2 * steps)], dim=1)
    anchors_v = torch.cat([q.new_zeros(steps, d), eye, q.new_zeros(steps, pad - steps)], dim=1)
    ka = torch.cat([anchors_k.to(k.dtype).expand(bsz, hkv, steps, d + pad), torch.cat([k, k.new_zeros(bsz, hkv, length, pad)], dim=-1)], dim=2)
    va = torch.cat([anchors_v.to(v.dtype).expand(bsz, hkv, steps, d + pad), torch.cat([v, v.new_zeros(bsz, hkv, length, pad)], dim=-1)], dim=2)
    return qa, ka, va


def no_mask(*args: Any, **kwargs: Any) -> None:
    """The drafter's mask builder under this backend (drafter._create_mask_fn): speculators otherwise
    builds a dense [T, T] mask every step and widens it by T columns per draft step ([T, 4T] bools
    by the last of 4: 268 MB at T = 8192), which this backend never reads."""
    return None


def register() -> str:
    """Register the backend with transformers (idempotent); returns its name for set_attn_impl."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPL, doc_sdpa)
    return IMPL
