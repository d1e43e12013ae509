"""Exact greedy speculative decoding through the target's own transformers forward: any architecture.

eagle/decode/fast.py's fast decoder reimplements Llama and Qwen3 in a page of torch so that each step
can be a CUDA graph. Every other target (DeepSeek-V3 / Kimi-K2 MoE + MLA, a multimodal wrapper's
text model, custom code run with --trust-remote-code) decodes here, through the model transformers
loads for it, with its own KV cache (`DynamicCache`). Same algorithm, same interface
(`generate_greedy`, `generate_speculative`, `time_stages`, `aux_states`), same drafter
(eagle/decode/draft_infer.py's Drafter with its static cache):

1. prefill the prompt; the aux hidden states (inputs of decoder layers `layer_ids`, caught by
   forward pre-hooks, as eagle extract does) feed the drafter, whose last row proposes d1;
2. draft d2..dk with k-1 drafter steps on its own features;
3. verify: one target forward over [seq[n], d1..dk] (positions n..n+k, after the n cached tokens)
   gives greedy g0..gk; m = the matching prefix of drafts; keep g0..gm;
4. crop the target's cache back to n + m + 1 tokens (the rejected drafts' entries go), and let the
   drafter re-read rows n..n+k with the target's features; row m's proposal is the next d1.

The output equals plain greedy decoding with the same model and dtype (`generate_greedy` here) up
to the rounding of a (k+1)-row forward against k+1 one-row forwards, which flips only near-tied
logits. The host drives every step (no CUDA graphs): it is the slower path, and `path` says
"generic" wherever a result is reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from eagle.decode.interface import Proposer, SpecResult, required_len, synchronize, time_call
from eagle.target import check_layer_ids, input_device

if TYPE_CHECKING:
    from eagle.decode.sampling import Sampler


class GenericDecoder:
    """Greedy and speculative decoding with a transformers model (`model(input_ids, past_key_values)`)."""

    path = "generic"
    attention = "sdpa"  # (the fast decoder's choice of kernels; this decoder has one)

    def __init__(self, model: Any, proposer: Proposer | None = None, *, max_len: int,
                 layer_ids: Sequence[int] | None = None, eos_ids: Sequence[int] = ()) -> None:
        from eagle.data.capture import decoder_of

        self.model = model
        self.proposer = proposer
        self.max_len = max_len
        self.device = input_device(model)
        self.decoder = decoder_of(model)
        self.num_layers = len(self.decoder.layers)
        self.layer_ids = (check_layer_ids(layer_ids or [], self.num_layers, "the drafter's layer ids")
                          if proposer is not None else [])
        self.eos_ids = {int(e) for e in eos_ids}
        self.last_timing: dict[str, float] = {}
        self._store: dict[int, torch.Tensor] = {}
        self._wanted: set[int] = set()
        self._hooks = [layer.register_forward_pre_hook(self._hook(i), with_kwargs=True)
                       for i, layer in enumerate(self.decoder.layers)]
        self._drafter_device = (next(proposer.parameters()).device
                                if isinstance(proposer, torch.nn.Module) else self.device)

    def _hook(self, i: int) -> Callable[..., None]:
        def fn(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if i in self._wanted:
                self._store[i] = args[0] if args else kwargs["hidden_states"]

        return fn

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- one forward ---------------------------------------------------------------------
    def new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)  # per-layer kinds (sliding windows) from the config
        except TypeError:  # a transformers without the argument
            return DynamicCache()

    @torch.inference_mode()
    def forward(self, tokens: Sequence[int] | torch.Tensor, cache: Any, aux_ids: Sequence[int] = (),
                last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens [T] after the cache's tokens -> (logits [T or 1, V], aux [T, L*H] or None), the
        aux layers in ascending order (decoder-layer inputs, as speculators and vLLM take them)."""
        x = torch.as_tensor(tokens, dtype=torch.long, device=self.device).view(1, -1)
        self._wanted = set(aux_ids)
        self._store.clear()
        try:
            out = self.model(input_ids=x, past_key_values=cache, use_cache=True,
                             logits_to_keep=1 if last_only else 0)
        finally:
            self._wanted = set()
        aux = None
        if aux_ids:
            aux = torch.cat([self._store[i][0].to(self._drafter_device) for i in sorted(aux_ids)], dim=-1)
        self._store.clear()
        return out.logits[0], aux

    def aux_states(self, ids: Sequence[int], layer_ids: Sequence[int]) -> torch.Tensor:
        """The aux hidden states [T, L*H] of a whole sequence (probe compares targets with them)."""
        _, aux = self.forward(ids, self.new_cache(), layer_ids, last_only=True)
        assert aux is not None
        return aux

    @staticmethod
    def _crop(cache: Any, keep: int) -> None:
        extra = cache.get_seq_length() - keep
        if extra > 0:
            cache.crop(-extra)

    # -- decoding --------------------------------------------------------------------------
    def _room(self, p: int, max_new: int, k: int) -> None:
        need = required_len(p, max_new, k, 0)
        if need > self.max_len:
            raise ValueError(f"prompt of {p} tokens + {max_new} new tokens needs max_len >= {need} "
                             f"(decoder built with {self.max_len})")

    def _done(self, new: list[int], max_new: int) -> tuple[bool, list[int]]:
        for i, tok in enumerate(new[:max_new]):
            if tok in self.eos_ids:
                return True, new[: i + 1]
        return len(new) >= max_new, new[:max_new]

    def generate_greedy(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Plain greedy decoding: the new tokens (up to and including an EOS)."""
        p = len(prompt_ids)
        if p == 0:
            raise ValueError("empty prompt")
        self._room(p, max_new_tokens, 0)
        cache = self.new_cache()
        t0 = time.perf_counter()
        logits, _ = self.forward(prompt_ids, cache, last_only=True)
        new = [int(logits[-1].argmax())]
        synchronize(self.device)
        t1 = time.perf_counter()
        done, new = self._done(new, max_new_tokens)
        while not done:
            logits, _ = self.forward(new[-1:], cache)
            new.append(int(logits[-1].argmax()))
            done, new = self._done(new, max_new_tokens)
        synchronize(self.device)
        self.last_timing = {"prefill_s": t1 - t0, "decode_s": time.perf_counter() - t1}
        return new

    def generate_speculative(self, prompt_ids: Sequence[int], max_new_tokens: int, k: int,
                             sampler: Sampler | None = None) -> SpecResult:
        """Greedy speculative decoding with chain drafts of length k; output = greedy decoding's.
        With a sampler: the first token sampled and every verify step rejection-sampled
        (eagle/decode/sampling.py)."""
        if self.proposer is None:
            raise ValueError("generate_speculative needs a drafter")
        if k < 1:
            raise ValueError("k must be >= 1")
        p = len(prompt_ids)
        if p == 0:
            raise ValueError("empty prompt")
        self._room(p, max_new_tokens, k)
        dev = self._drafter_device
        long = {"dtype": torch.long, "device": dev}
        cache, dcache = self.new_cache(), self.proposer.new_cache(self.max_len)
        t0 = time.perf_counter()
        # 1. prefill: the target's greedy token after the prompt, and the drafter's first proposal
        logits, aux = self.forward(prompt_ids, cache, self.layer_ids)
        assert aux is not None  # the drafter's layers were asked for
        seq = list(prompt_ids) + [int(logits[-1].argmax() if sampler is None else sampler.sample(logits[-1:])[0])]
        with torch.inference_mode():
            ids, feats = self.proposer.propose_rows(aux, torch.tensor(seq[1:p + 1], **long),
                                                    torch.arange(p, **long), dcache)
        d1, feat = ids[-1:], feats[-1:]
        synchronize(self.device)
        t1 = time.perf_counter()
        n = p  # tokens in the target's cache; seq[n] is decided but not yet cached
        history: list[tuple[int, int]] = []  # (accepted m, n at the cycle's start)
        done, new = self._done(seq[p:], max_new_tokens)
        while not done:
            with torch.inference_mode():
                # 2. draft d2..dk from the drafter's own features
                drafts = [d1]
                for j in range(1, k):
                    tok, feat = self.proposer.propose_step(drafts[-1], feat, torch.tensor([n + j - 1], **long), dcache)
                    drafts.append(tok)
                draft_ids = torch.cat(drafts).tolist()
            # 3. verify all k drafts in one forward
            logits, aux = self.forward([seq[n]] + draft_ids, cache, self.layer_ids)
            assert aux is not None
            picked = (logits.argmax(-1) if sampler is None
                      else sampler.verify(logits, torch.tensor(draft_ids, dtype=torch.long, device=logits.device)))
            greedy = picked.tolist()  # (sampled: the drafts' accepted prefix, then the drawn token)
            m = 0
            while m < k and draft_ids[m] == greedy[m]:
                m += 1
            seq[n + 1:] = greedy[: m + 1]
            history.append((m, n))
            # 4. the rejected drafts leave the target's cache; the drafter catches up on rows n..n+k
            self._crop(cache, n + m + 1)
            with torch.inference_mode():
                ids, feats = self.proposer.propose_rows(aux, torch.tensor(greedy, **long),
                                                        n + torch.arange(k + 1, **long), dcache)
            d1, feat = ids[m:m + 1], feats[m:m + 1]
            n += m + 1
            done, new = self._done(seq[p:], max_new_tokens)
        synchronize(self.device)
        self.last_timing = {"prefill_s": t1 - t0, "decode_s": time.perf_counter() - t1, "cycles": len(history)}
        last_index = p + len(new) - 1  # seq index of the last token kept
        return SpecResult(tokens=new, accepted=[m for m, n0 in history if n0 < last_index])

    # -- timing (bench) -----------------------------------------------------------------------
    def time_stages(self, k: int, prompt_ids: Sequence[int], iters: int = 20) -> dict[str, float]:
        """Seconds per call of: one target decode step, the (k+1)-token verify, one drafter step and
        the drafter's catch-up over k+1 rows, at the position reached by prefilling `prompt_ids`
        (the target's cache is cropped back after each call)."""
        p = len(prompt_ids)
        self._room(p, 1, k)
        cache = self.new_cache()
        logits, aux = self.forward(prompt_ids, cache, self.layer_ids if self.proposer is not None else ())
        tok = int(logits[-1].argmax())

        def step() -> None:
            self.forward([tok], cache)
            self._crop(cache, p)

        def verify() -> None:
            self.forward([tok] * (k + 1), cache, self.layer_ids)
            self._crop(cache, p)

        out = {"target_step": time_call(step, iters, self.device), "verify": time_call(verify, iters, self.device)}
        proposer = self.proposer
        if proposer is not None:
            assert aux is not None  # the drafter's layers were asked for
            dev = self._drafter_device
            long = {"dtype": torch.long, "device": dev}
            dcache = proposer.new_cache(self.max_len)
            with torch.inference_mode():
                ids, feats = proposer.propose_rows(aux, torch.tensor(list(prompt_ids[1:]) + [tok], **long),
                                                        torch.arange(p, **long), dcache)
            slot = torch.tensor([p], **long)
            rows = p + torch.arange(k + 1, **long)
            row_aux = aux[-1:].expand(k + 1, -1).contiguous()
            row_tokens = ids[-1:].expand(k + 1).contiguous()

            @torch.inference_mode()
            def draft_step() -> None:
                proposer.propose_step(ids[-1:], feats[-1:], slot, dcache)

            @torch.inference_mode()
            def catchup() -> None:
                proposer.propose_rows(row_aux, row_tokens, rows, dcache)

            out["draft_step"] = time_call(draft_step, iters, self.device)
            out["catchup"] = time_call(catchup, iters, self.device)
        return out
