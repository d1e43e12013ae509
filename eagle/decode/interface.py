"""The decoder contract: what `eagle evaluate`, `bench` and `probe` ask of a decoder, and what a
decoder asks of a drafter.

Two decoders implement `SpeculativeDecoder`: eagle/decode/fast.py (Llama and Qwen3 in a page of
torch: static cache, CUDA graphs) and eagle/decode/generic.py (the target's own transformers forward
with a KV cache; any architecture). They share this module and never import each other;
eagle/decode/factory.py's `load_decoder` picks one. eagle/decode/draft_infer.py's Drafter
implements `Proposer`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from eagle.decode.llama_ops import KVCache
    from eagle.decode.sampling import Sampler


class Proposer(Protocol):
    """What the decoder needs from a drafter (eagle.decode.draft_infer.Drafter implements it)."""

    @property
    def hidden_size(self) -> int: ...

    def new_cache(self, max_len: int, attention: str = "sdpa") -> KVCache: ...

    def propose_rows(self, aux: torch.Tensor, tokens: torch.Tensor, slots: torch.Tensor,
                     cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]: ...

    def propose_step(self, token: torch.Tensor, feat: torch.Tensor, slot: torch.Tensor,
                     cache: KVCache, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(target id [1], feature [1, H]); the id written into `out` when given."""
        ...


@dataclass
class SpecResult:
    tokens: list[int]
    accepted: list[int] = field(default_factory=list)  # drafts accepted per verify step (0..k)

    @property
    def accept_len(self) -> float:
        """Mean tokens per verify step, bonus included (vLLM: 1 + accepted / drafts)."""
        return 1.0 + sum(self.accepted) / len(self.accepted) if self.accepted else float("nan")


class SpeculativeDecoder(Protocol):
    """Greedy and speculative (EAGLE-3 chain) decoding of one target with an optional drafter."""

    path: str  # which decoder this is: "fast" or "generic" (evaluate / probe / bench report it)
    attention: str  # the attention kernels it runs (llama_ops.ATTENTION_KERNELS)
    device: torch.device  # where the target's inputs go
    max_len: int  # the longest prompt + answer its caches hold (required_len)
    last_timing: dict[str, float]  # the last generate call's prefill_s / decode_s

    def generate_greedy(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """The target's own greedy answer (up to max_new_tokens, stopping at an EOS id)."""
        ...

    def generate_speculative(self, prompt_ids: Sequence[int], max_new_tokens: int, k: int,
                             sampler: Sampler | None = None) -> SpecResult:
        """The same answer, drafted k tokens at a time and verified in one target forward; with a
        sampler (eagle/decode/sampling.py), sampled: the drafts accepted by rejection sampling."""
        ...

    def aux_states(self, ids: Sequence[int], layer_ids: Sequence[int]) -> torch.Tensor:
        """The residual stream entering each of `layer_ids` for `ids` ([T, len(layer_ids) * H])."""
        ...

    def time_stages(self, k: int, prompt_ids: Sequence[int], iters: int = 20) -> dict[str, float]:
        """Seconds per call of target_step, verify (k+1 tokens) and, with a drafter, draft_step
        and catchup (`eagle bench`)."""
        ...


def required_len(prompt_len: int, max_new_tokens: int, k: int = 0, sync_every: int = 4) -> int:
    """Cache length a Decoder needs: up to `sync_every` launches (cycles of k+1 tokens) run past
    the end before the host sees it."""
    return prompt_len + max_new_tokens + (sync_every + 1) * (k + 1) + 2


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], None], iters: int, device: torch.device) -> float:
    """Seconds per call of `fn` (two warm-up calls, then `iters` timed back to back, the device
    synchronised around them): what both decoders' `time_stages` report."""
    for _ in range(2):
        fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / iters
