"""Per-document attention for the drafter's packed training batches (an SDPA backend).

speculators' Eagle3DraftModel takes one packed row [1, T] and, on its sdpa path, builds a dense
[T, (k+1)T] mask (causal + same document in the first block, the diagonal in the k draft blocks),
so attention costs O(T^2) over the whole pack although a token only sees its own document.
This backend gathers the pack's documents into a batch [B, Lmax] (index `doc_index`, padding
marked by `doc_mask`, both from eagle.train.dataset.collate), runs the same attention per document as
one causal, mask-free SDPA (the draft blocks' diagonal folded in as anchor keys: see doc_sdpa), and
scatters the result back (`doc_pos`): B times fewer FLOPs for B equal documents, no mask to build
or read, and the kernels that skip the upper triangle. Without `doc_index` (drafting) it is transformers' plain SDPA.

Two forms of the same attention, `use_varlen` choosing (None, the default: varlen where
`varlen_available`, i.e. on a GPU in bf16/fp16 with torch >= 2.9; the grid elsewhere):
  grid    the documents gathered into [B, Lmax] and one SDPA (cuDNN's kernel on an H200): pays
          B x Lmax cells, so a pack of 5 documents of 1024-2048 tokens costs a [5, 2048] grid;
  varlen  the pack as it lies, one causal sequence per document (torch's variable-length flash
          attention, `doc_varlen`): pays each document's own triangle.
Measured on an H200 (1.1B-shape drafter, 1,000 rows of 1024-2048 tokens; docs/benchmarks.md,
session 11): `eagle train`'s eager real loop 248.0k tok/s with varlen against the grid's 232.0k
(session 10); as CUDA graphs equal (265.1k); on fixed packs of 4 x 2047 tokens the grid is faster
(its step 30.19 ms eager, 27.35 ms as graphs, against 31.13 and 29.26): flash's kernels are slower
per cell than cuDNN's there, and the grid of equal documents wastes nothing.

Use: `train.use_doc_attention(model)` (the backend, and `no_mask` as the drafter's mask builder),
then pass the LAYOUT_KEYS tensors to the model's forward (they reach the attention through its
**kwargs).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
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
                             "and no mask: build batches with eagle.train.dataset.collate(layout=True)")
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    scaling = kwargs.pop("scaling", None)
    scaling = float(scaling) if scaling is not None else query.shape[3] ** -0.5
    if value.shape[3] != query.shape[3]:  # MLA: values narrower (or wider) than queries and keys
        return _padded_heads(module, query, key, value, attention_mask, doc_index, doc_pos, doc_mask, scaling,
                             **kwargs)
    if varlen_available(query, key.shape[2] // query.shape[2] - 1) if use_varlen is None else use_varlen:
        return doc_varlen(query, key, value, doc_mask, scaling), None
    t, d = query.shape[2], query.shape[3]
    steps = key.shape[2] // t - 1
    b, lmax = doc_index.shape
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


def _padded_heads(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Any, doc_index: torch.Tensor, doc_pos: torch.Tensor, doc_mask: torch.Tensor,
                  scaling: float, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """doc_sdpa where the value head size differs from the query's (DeepSeek MLA: v_head_dim against
    qk_nope + qk_rope): all three zero-padded to the larger size (zero columns change no score; the
    scale is given), the output cut back to the value's size."""
    d = max(query.shape[3], value.shape[3])

    def pad(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, d - x.shape[3]))

    out, _ = doc_sdpa(module, pad(query), pad(key), pad(value), attention_mask, doc_index=doc_index,
                      doc_pos=doc_pos, doc_mask=doc_mask, scaling=scaling, **kwargs)
    return out[..., : value.shape[3]], None


use_varlen: bool | None = None  # None: doc_varlen where varlen_available, else the grid; True/False force one
_varlen_attn: Any = None  # torch >= 2.9's varlen_attn; None on an older torch (the grid form only)
_VARLEN_PARAMS: frozenset[str] = frozenset()  # its keyword arguments, which changed between releases
try:  # read once here, not under torch.compile
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn

    _VARLEN_PARAMS = frozenset(inspect.signature(_varlen_attn).parameters)
except ImportError:
    pass
_flash_gpus: dict[int, bool] = {}  # device index -> compute capability >= 8.0 (flash attention's floor)


@contextlib.contextmanager
def forced(varlen: bool | None) -> Iterator[None]:
    """Within: doc_sdpa runs the varlen form (True), the grid (False) or picks (None); `use_varlen`
    is given its earlier value back on leaving (the benches and tests compare the forms with it)."""
    global use_varlen
    before, use_varlen = use_varlen, varlen
    try:
        yield
    finally:
        use_varlen = before


def varlen_available(query: torch.Tensor, steps: int = 0) -> bool:
    """Whether doc_varlen can run this query with `steps` earlier draft blocks: torch's
    variable-length flash attention exists, the query is fp16/bf16 (autocast's) on a GPU of compute
    capability 8.0 or newer, and its head size is a multiple of 8 that, with the anchors' columns,
    stays within the kernel's 256."""
    if _varlen_attn is None or not query.is_cuda or _half(query) not in (torch.float16, torch.bfloat16):
        return False
    index = query.device.index if query.device.index is not None else torch.cuda.current_device()
    if index not in _flash_gpus:  # register() fills this before the drafter is compiled
        _flash_gpus[index] = torch.cuda.get_device_capability(index) >= (8, 0)
    d = query.shape[-1]
    return _flash_gpus[index] and d % 8 == 0 and -(-(d + 2 * steps) // 8) * 8 <= 256


def _half(x: torch.Tensor) -> torch.dtype:
    """The dtype attention runs x in: autocast's on x's device when it is on (SDPA is autocast to
    it; torch's varlen_attn, a custom op, is not, so doc_varlen casts), else x's own."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
            scale: float) -> torch.Tensor:
    """Causal varlen_attn of [R, H, D] rows in the sequences `cu` marks, on whichever of its
    signatures this torch has (2.9: is_causal and the default scale only; later: scale, window_size,
    enable_gqa)."""
    assert _varlen_attn is not None
    kw: dict[str, Any] = {}
    if "scale" in _VARLEN_PARAMS:
        kw["scale"] = scale
    else:
        q = q * (scale * q.shape[-1] ** 0.5)  # the kernel's own scale is 1/sqrt(D)
    if "window_size" in _VARLEN_PARAMS:
        kw["window_size"] = (-1, 0)
    else:
        kw["is_causal"] = True
    if "enable_gqa" in _VARLEN_PARAMS:
        kw["enable_gqa"] = k.shape[1] != q.shape[1]
    return _varlen_attn(q, k, v, cu, cu, longest, longest, **kw)


def doc_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, doc_mask: torch.Tensor,
               scaling: float) -> torch.Tensor:
    """doc_sdpa's attention on the pack as it lies, with torch's variable-length flash attention
    (one causal sequence per document; the pack's padding tokens join the last document, whose
    real tokens never see them): no [B, Lmax] grid, so a pack costs its documents' own triangles
    however their lengths differ, where the grid pays B rows of the longest. The draft blocks'
    diagonal is the same anchor form (`_with_anchors`): each document's sequence starts with the j
    anchor rows. Only the document lengths are read from the layout (doc_mask's row sums), on the
    device: no host sync. Returns [1, T, H, D]."""
    t, d = query.shape[2], query.shape[3]
    steps = key.shape[2] // t - 1
    half = _half(query)
    query, key, value = query.to(half), key.to(half), value.to(half)
    lens = doc_mask.sum(1)
    lens = torch.cat([lens[:-1], (t - lens[:-1].sum()).view(1)])  # padding (if any) joins the last document
    ends = torch.cumsum(lens, 0)
    cu = torch.cat([lens.new_zeros(1), torch.cumsum(lens + steps, 0)]).to(torch.int32)
    if steps == 0:
        out = _varlen(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), cu, t, scaling)
        return out.unsqueeze(0)
    kd = key[:, :, t:].unflatten(2, (steps, t))  # [1, Hkv, j, T, D]: the diagonal blocks
    qa, ka, va = _with_anchors(query, key[:, :, :t], value[:, :, :t], kd)
    # qa/ka/va [1, h, j + T, D']: the j anchor rows, then the pack's tokens. Row r of the varlen
    # batch (document s's sequence: its j anchor rows, then its tokens) reads row `take` of them.
    rows = torch.arange(t + lens.shape[0] * steps, device=query.device)
    doc = torch.searchsorted(cu, rows.to(torch.int32), right=True) - 1  # (not cu[1:]: Inductor's lowering
    # of a sliced boundary tensor read it from its start on torch 2.11, an index out of bounds)
    offset = rows - cu[doc]
    take = torch.where(offset < steps, offset, (ends - lens)[doc] + offset)
    qr, kr, vr = (x[0].transpose(0, 1).index_select(0, take) for x in (qa, ka, va))  # [R, h, D']
    out = _varlen(qr, kr, vr, cu, t + steps, scaling)
    tokens = torch.arange(t, device=query.device)
    out = out.index_select(0, tokens + steps * (torch.searchsorted(ends, tokens, right=True) + 1))  # [T, H, D']
    hkv = kd.shape[1]
    w = out[:, :, d : d + steps].unflatten(1, (hkv, -1))  # [T, Hkv, g, j]: the diagonal weights
    extra = torch.einsum("tkgi,kitd->tkgd", w, value[0, :, t:].unflatten(1, (steps, t)))
    return (out[..., :d] + extra.flatten(1, 2)).unsqueeze(0)


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
    """Register the backend with transformers (idempotent); returns its name for set_attn_impl.
    On CUDA also reads which GPUs can run doc_varlen, so the compiled drafter reads a plain flag."""
    from transformers import AttentionInterface

    if _varlen_attn is not None and torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            _flash_gpus.setdefault(index, torch.cuda.get_device_capability(index) >= (8, 0))
    AttentionInterface.register(IMPL, doc_sdpa)
    return IMPL
