"""Llama building blocks over a static KV cache, shared by the fast target (decode.py) and the
pure-torch drafter (draft_infer.py).

Every forward takes the rows' rope positions and their cache slots as device tensors, writes the
rows' keys/values at those slots and attends to every slot <= the row's own slot. Shapes never
depend on how far decoding has got, so one forward can be captured once as a CUDA graph and
replayed for every step. Numerics follow transformers' Llama (RMSNorm in float32, rope cos/sin in
float32 cast to the activation dtype), so float32 outputs agree with transformers to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from eagle.common import ATTENTION_KERNELS

# Attention kernels the layers may use (None: torch's own choice). cuDNN's is left out: on the H200
# (torch 2.11) it was the kernel torch picked for the decode step and took 14 us per layer call,
# and it builds its kernel per new sequence length (a cost on every new prompt length). The
# memory-efficient kernel takes the additive mask; CPUs use flash or math.
SDPA_BACKENDS: list[SDPBackend] | None = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION,
                                          SDPBackend.MATH]

# How a cache's layers attend (common.ATTENTION_KERNELS; the decoder picks one per cache,
# `KVCache(attention=...)`): "sdpa": torch's SDPA (SDPA_BACKENDS) over all S slots under the
# additive mask, rope and norms in torch; "triton": eagle/decode/triton_attention.py's split-KV kernels,
# reading only the slots up to the last row's, for steps of at most triton_attention.MAX_ROWS query
# rows per kv head (decode, verify, draft steps; SDPA for longer ones: prefill), with rope + cache
# write in one kernel before them (reading the cache's rope tables: KVCache.rope), and
# eagle/decode/triton_ops.py's RMSNorm and SwiGLU kernels in every step of the layers.


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, fused: bool = False,
             keep: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' LlamaRMSNorm. With `fused` (a "triton" cache's layers) triton_ops' kernel; on
    CUDA torch's fused kernel (one launch instead of eight; both apply the weight before the cast
    back, one rounding fewer, so bf16 results may differ from transformers in the last bit);
    elsewhere transformers' exact formula. `keep` (a [T, N] view, e.g. the target's aux columns)
    receives a copy of x: in the fused kernel's same launch, else by a copy."""
    if fused and x.dim() == 2:
        from eagle.decode import triton_ops

        return triton_ops.rms_norm(x, weight, eps, keep=keep)
    if keep is not None:
        keep.copy_(x)
    if x.is_cuda:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor, fused: bool = False, keep: torch.Tensor | None = None) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, fused, keep)


def rope_inv_freq(config) -> tuple[torch.Tensor, float]:
    """inv_freq and attention scaling for a transformers LlamaConfig (any rope type it knows)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = LlamaRotaryEmbedding(config)
    return rope.inv_freq.detach().float().cpu(), float(rope.attention_scaling)


class Rope(nn.Module):
    inv_freq: torch.Tensor  # a buffer

    """Rope tables for the rows' positions: (cos [T, D], signed sin [T, D]).

    The sign of rotate_half is folded into the sin table (its first half negated), so that
    rope(x) = x * cos + swap_halves(x) * sin_signed, which equals transformers'
    x * cos + rotate_half(x) * sin exactly (a sign flip is exact)."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.scaling = scaling

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        cos = torch.cat((freqs, freqs), dim=-1).cos() * self.scaling
        sin = freqs.sin() * self.scaling
        return cos.to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)

    def table(self, rows: int, dtype: torch.dtype, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) [rows, D] of positions offset .. offset + rows - 1, computed once: the
        same elementwise ops as `forward`, so row r equals forward([offset + r]) bit for bit."""
        return self(torch.arange(offset, offset + rows, device=self.inv_freq.device), dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin_signed: [T, head_dim] from `Rope` (three kernels)."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos[:, None], swapped, sin_signed[:, None])


class AttnMask:
    """Which slots each row may attend in one forward: row t sees every slot <= slots[t].

    `additive` is that as an additive mask [T, S] (0 allowed, -inf not) in the activation dtype,
    built on first use and shared by every layer; `grouped(g)` is the same for g query heads
    stacked per kv head (rows g*T + t). The Triton kernel reads `slots` itself and never builds
    the mask. `kernel` is the cache's attention (one of ATTENTION_KERNELS); `fused` says whether the
    layers use triton_ops' kernels (a "triton" cache)."""

    def __init__(self, slot_ids: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype,
                 kernel: str = "sdpa") -> None:
        self.slot_ids, self.slots, self.dtype, self.kernel = slot_ids, slots, dtype, kernel
        self._additive: torch.Tensor | None = None
        self._grouped: dict[int, torch.Tensor] = {}

    @property
    def fused(self) -> bool:
        return self.kernel == "triton"

    @property
    def additive(self) -> torch.Tensor:
        if self._additive is None:
            allowed = self.slot_ids[None, :] <= self.slots[:, None]
            zero = torch.zeros((), dtype=self.dtype, device=allowed.device)
            self._additive = torch.where(allowed, zero, float("-inf"))
        return self._additive

    def grouped(self, groups: int) -> torch.Tensor:
        if groups not in self._grouped:
            self._grouped[groups] = self.additive.repeat(groups, 1) if groups > 1 else self.additive
        return self._grouped[groups]


class KVCache:
    """Static per-layer key/value buffers [kv_heads, S, head_dim]; S is max_len rounded up to a
    multiple of 64 (aligned rows for the fused attention kernels' masks). `attention` (one of
    ATTENTION_KERNELS) is how the layers attend over it.

    `rope` (a "triton" cache's, set by `attach_rope`): the (cos, signed sin) tables [S, head_dim]
    of the rope position of every slot, built once; the fused layers read the rows' entries by slot
    inside their rope kernel, so a step computes no rope tables (eleven small kernels a forward)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_len: int, device, dtype,
                 attention: str = "sdpa") -> None:
        if attention not in ATTENTION_KERNELS:
            raise ValueError(f"attention {attention!r}: use one of {', '.join(ATTENTION_KERNELS)}")
        self.max_len = -(-max_len // 64) * 64
        self.dtype = dtype
        self.attention = attention
        self.k = [torch.zeros(kv_heads, self.max_len, head_dim, device=device, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(kv_heads, self.max_len, head_dim, device=device, dtype=dtype) for _ in range(layers)]
        self.slot_ids = torch.arange(self.max_len, device=device)
        self.rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.rope_offset = 0

    def attach_rope(self, rope: Rope, offset: int = 0) -> KVCache:
        """Slot s holds rope position s + offset (the target: 0; the EAGLE-3 drafter, whose rows sit
        one position ahead: 1); a "triton" cache builds its `rope` tables for every slot here."""
        self.rope_offset = offset
        if self.attention == "triton":
            self.rope = rope.table(self.max_len, self.dtype, offset)
        return self

    def rope_of(self, rope: Rope, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """What a forward over rows at `slots` hands its layers as (cos, sin): the cache's tables
        when the layers are fused (their rope kernel reads them by slot), else `rope`'s rows."""
        if self.attention == "triton":
            if self.rope is None:
                raise ValueError("a triton cache needs its rope tables: KVCache.attach_rope")
            return self.rope
        return rope(slots + self.rope_offset if self.rope_offset else slots, dtype)

    def mask(self, slots: torch.Tensor) -> AttnMask:
        """Row t may attend to every slot <= slots[t]."""
        return AttnMask(self.slot_ids, slots, self.dtype, self.attention)


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: AttnMask,
           groups: int) -> torch.Tensor:
    """q [hkv, g*t, d] (the g query heads of each kv head as rows) over the caches [hkv, S, d],
    row r = j*t + i seeing the slots <= mask.slots[i] -> [hkv, g*t, d], by the mask's kernel."""
    if mask.kernel == "triton":
        from eagle.decode import triton_attention

        if triton_attention.supports(q.shape[1], q.shape[2]):
            return triton_attention.decode_attention(q, k_cache, v_cache, mask.slots, groups)
    if SDPA_BACKENDS is None:
        return F.scaled_dot_product_attention(q[None], k_cache[None], v_cache[None],
                                              attn_mask=mask.grouped(groups)[None, None])[0]
    with sdpa_kernel(SDPA_BACKENDS):
        return F.scaled_dot_product_attention(q[None], k_cache[None], v_cache[None],
                                              attn_mask=mask.grouped(groups)[None, None])[0]


def linear_add_(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """residual += x @ weight.T (+ bias), in place: the residual add rides in the GEMM's epilogue
    (beta = 1) instead of a kernel of its own."""
    if bias is not None:
        return residual.add_(F.linear(x, weight, bias))
    return residual.addmm_(x, weight.t())


def _cat_params(mods: list[nn.Linear]) -> tuple[nn.Parameter, nn.Parameter | None]:
    weight = nn.Parameter(torch.cat([m.weight.detach() for m in mods]), requires_grad=False)
    has_bias = mods[0].bias is not None
    bias = nn.Parameter(torch.cat([m.bias.detach() for m in mods]), requires_grad=False) if has_bias else None
    return weight, bias


class Attention(nn.Module):
    """GQA self-attention over a static cache. `fuse_()` replaces q/k/v by one [q; k; v] weight
    (one matrix-vector product per decode step instead of three)."""

    def __init__(self, in_dim: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                 bias: bool = False, device=None, dtype=None, qk_norm_eps: float | None = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(in_dim, heads * head_dim, bias=bias, **kw)
        self.k_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=bias, **kw)
        self.v_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=bias, **kw)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias, **kw)
        # Qwen3: an RMSNorm over each query and key head before rope (None: Llama, no norm)
        self.q_norm = RMSNorm(head_dim, qk_norm_eps, device, dtype) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps, device, dtype) if qk_norm_eps is not None else None
        self.qkv_weight: nn.Parameter | None = None
        self.qkv_bias: nn.Parameter | None = None

    def fuse_(self) -> None:
        if self.qkv_weight is None:
            self.qkv_weight, self.qkv_bias = _cat_params([self.q_proj, self.k_proj, self.v_proj])
            del self.q_proj, self.k_proj, self.v_proj

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        if self.qkv_weight is not None:
            return F.linear(x, self.qkv_weight, self.qkv_bias)
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, mask: AttnMask,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """The attention output [T, hidden]; with `residual`, residual + output, written into
        `residual` in place. cos / sin: the rows' rope [T, d] (Rope), or under a fused mask the
        tables of every slot [S, d] (KVCache.rope), read at `slots`."""
        t, hq, hkv, d = x.shape[0], self.heads, self.kv_heads, self.head_dim
        qkv = self._qkv(x).view(t, hq + 2 * hkv, d)
        qk = qkv[:, : hq + hkv]
        if self.q_norm is not None and self.k_norm is not None:  # both or neither
            qk = torch.cat([self.q_norm(qk[:, :hq]), self.k_norm(qk[:, hq:])], dim=1)
        g = hq // hkv
        if mask.fused:
            from eagle.decode import triton_attention, triton_ops

            if triton_attention.supports(g * t, d):  # rope + cache write, then split-KV attention
                q = triton_ops.rope_write(qk, qkv[:, hq + hkv:], cos, sin, slots, k_cache, v_cache)
                out = triton_attention.decode_attention(q.view(hkv, g * t, d), k_cache, v_cache, slots, g,
                                                        token_major=True)
                return self._out(out, residual)
            cos, sin = cos.index_select(0, slots), sin.index_select(0, slots)  # too many rows: a prefill
        qk = apply_rope(qk, cos, sin)
        k_cache.index_copy_(1, slots, qk[:, hq:].transpose(0, 1))
        v_cache.index_copy_(1, slots, qkv[:, hq + hkv:].transpose(0, 1))
        # GQA without repeating the cache: the g = hq / hkv query heads of each kv head become
        # g*t query rows of that head (a view when t == 1), under a mask repeated g times.
        q = qk[:, :hq].transpose(0, 1).reshape(hkv, g * t, d)
        out = attend(q, k_cache, v_cache, mask, g)
        return self._out(out.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, hq * d), residual)

    def _out(self, out: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """o_proj of the heads' outputs [T, hq*d] (+ residual, in place)."""
        if residual is None:
            return self.o_proj(out)
        return linear_add_(residual, out, self.o_proj.weight, self.o_proj.bias)


class MLP(nn.Module):
    """SwiGLU MLP. `fuse_()` replaces gate/up by one [gate; up] weight."""

    def __init__(self, hidden: int, inter: int, bias: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(hidden, inter, bias=bias, **kw)
        self.up_proj = nn.Linear(hidden, inter, bias=bias, **kw)
        self.down_proj = nn.Linear(inter, hidden, bias=bias, **kw)
        self.gate_up_weight: nn.Parameter | None = None
        self.gate_up_bias: nn.Parameter | None = None

    def fuse_(self) -> None:
        if self.gate_up_weight is None:
            self.gate_up_weight, self.gate_up_bias = _cat_params([self.gate_proj, self.up_proj])
            del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, fused: bool = False) -> torch.Tensor:
        """The MLP output; with `residual`, residual + output, written into `residual` in place.
        `fused`: silu(gate) * up in triton_ops' one kernel (needs the fused [gate; up] weight)."""
        if self.gate_up_weight is not None:
            gate_up = F.linear(x, self.gate_up_weight, self.gate_up_bias)
            if fused and gate_up.dim() == 2:
                from eagle.decode import triton_ops

                h = triton_ops.silu_mul(gate_up)
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                h = F.silu(gate) * up
        else:
            h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        if residual is None:
            return self.down_proj(h)
        return linear_add_(residual, h, self.down_proj.weight, self.down_proj.bias)


def fuse_projections(module: nn.Module) -> nn.Module:
    """Fuse q/k/v and gate/up of every Attention and MLP inside `module` (in place, idempotent).
    Call after loading weights: the fused module's state_dict no longer has the separate names."""
    for sub in module.modules():
        if isinstance(sub, (Attention, MLP)):
            sub.fuse_()
    return module


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def has_qk_norm(config) -> bool:
    """Qwen3's attention: RMSNorm on every query and key head (else Llama's)."""
    return getattr(config, "model_type", "llama") == "qwen3"


def check_llama_config(config, what: str) -> None:
    """Refuse Llama variants this decoder does not implement, naming the field."""
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{what}: hidden_act {act!r} is not supported (only silu, as in Llama)")
    if getattr(config, "mlp_bias", False):
        raise ValueError(f"{what}: mlp_bias=True is not supported")
    rope = getattr(config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type") == "dynamic":
        raise ValueError(f"{what}: dynamic rope scaling is not supported by the static-cache decoder")
    if getattr(config, "use_sliding_window", False) or getattr(config, "layer_types", None) and any(
            t != "full_attention" for t in config.layer_types):
        raise ValueError(f"{what}: sliding-window attention is not supported by the static-cache decoder")


class DecoderLayer(nn.Module):
    """A standard Llama decoder layer (pre-norm attention + SwiGLU MLP, residuals); Qwen3's when
    the config says so (the same plus q/k norms).

    The forward updates its input `x` in place (the residual stream) and returns it: callers that
    keep a layer's input (the target's aux hidden states) pass `keep`. (Writing the residual
    add out of place instead saves nothing: cuBLAS then copies the residual into the output itself.)"""

    def __init__(self, config, device=None, dtype=None) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        bias = bool(getattr(config, "attention_bias", False))
        self.input_layernorm = RMSNorm(h, eps, device, dtype)
        self.self_attn = Attention(h, h, config.num_attention_heads, config.num_key_value_heads,
                                   head_dim_of(config), bias, device, dtype,
                                   qk_norm_eps=eps if has_qk_norm(config) else None)
        self.post_attention_layernorm = RMSNorm(h, eps, device, dtype)
        self.mlp = MLP(h, config.intermediate_size, False, device, dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, mask: AttnMask,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """`keep`: a [T, hidden] view that receives the layer's input (the target's aux state),
        written by the input norm's own kernel on a fused cache."""
        f = mask.fused
        x = self.self_attn(self.input_layernorm(x, f, keep), cos, sin, slots, k_cache, v_cache, mask, residual=x)
        return self.mlp(self.post_attention_layernorm(x, f), residual=x, fused=f)


def check_and_assign(module: nn.Module, tensors: dict[str, torch.Tensor], what: str, device, dtype) -> None:
    """Load `tensors` into `module` (built on the meta device), naming every missing, unexpected or
    mis-shaped tensor in one error."""
    expected = dict(module.state_dict())
    problems = []
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        problems.append(f"missing tensors: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected[:8])}{' ...' if len(unexpected) > 8 else ''}")
    for name in sorted(set(expected) & set(tensors)):
        if tuple(expected[name].shape) != tuple(tensors[name].shape):
            problems.append(f"{name}: shape {tuple(tensors[name].shape)}, expected {tuple(expected[name].shape)}")
    if problems:
        raise ValueError(f"{what}: " + "; ".join(problems))
    state = {}
    for name, t in tensors.items():
        keep_int = not t.is_floating_point()
        state[name] = t.to(device=device, dtype=None if keep_int else dtype)
    module.load_state_dict(state, strict=True, assign=True)
