"""Fast greedy and speculative (EAGLE-3 chain) decoding for Llama and Qwen3 targets.

Other architectures (DeepSeek-V3 / Kimi MoE + MLA, custom code, ...) decode through their own
transformers forward in eagle/decode/generic.py; eagle/decode/factory.py's `load_decoder` picks the
path. Both implement eagle/decode/interface.py's `SpeculativeDecoder`.

Why our own compact target module instead of transformers' model with a StaticCache: every step
here reads its position from a device tensor and writes the KV cache at device-computed slots, so
the target's 1-token step, its (k+1)-token verify step, the acceptance rule and the drafter's steps
can be captured once as CUDA graphs and replayed with no host sync per token. transformers' forward
takes host-side cache positions, builds masks in Python and differs between 5.17 (the GPU host) and
5.19 (here); a page of torch that loads the same safetensors is easier to make graph-safe and keeps
the numerics identical on both. transformers stays the reference: tests compare against its
`generate(do_sample=False)` token for token.

Verbs (gpt-fast style): `prefill`, `plain_step`, `spec_cycle`, and the host loops
`generate_greedy` / `generate_speculative`. On CUDA the step and the cycle are CUDA graphs; on CPU
they run eagerly (same code).

One speculative cycle, with n = tokens committed to the target's KV cache and seq[n] the next
token (already decided, not yet in the cache), over two small persistent buffers: `tokens` =
[seq[n], d1, .., dk] and `pos` = [n, .., n+k], which the previous cycle's accept stage left ready:
1. draft: the drafter's first proposal d1 came from the previous cycle; k-1 more single-row steps
   feed the drafter's own feature back, each writing its draft into `tokens`;
2. verify: one target forward over `tokens` at positions `pos` gives greedy g0..gk;
3. catch-up: the drafter re-reads rows n..n+k with the target's features and tokens g0..gk (rows
   past m are junk that later writes overwrite);
4. accept (`accept_cycle`): m = length of the prefix where d_j == g_{j-1}; seq[n+1..n+m+1] =
   g0..gm (m drafts plus the bonus token); n += m + 1; the catch-up's row m is the next d1 --
   all on the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from eagle.common import ATTENTION_KERNELS
from eagle.decode.interface import Proposer, SpecResult, required_len, synchronize, time_call
from eagle.decode.llama_ops import (
    DecoderLayer,
    KVCache,
    RMSNorm,
    Rope,
    check_and_assign,
    check_llama_config,
    fuse_projections,
    head_dim_of,
    rope_inv_freq,
)
from eagle.target import check_layer_ids

if TYPE_CHECKING:
    from eagle.decode.sampling import Sampler


class TargetModel(nn.Module):
    """A Llama causal LM over a static KV cache; returns logits and the aux hidden states."""

    def __init__(self, config, device=None, dtype=None) -> None:
        super().__init__()
        check_llama_config(config, "target")
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(config, device, dtype) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device=device, dtype=dtype)
        self.rope: Rope | None = None
        if device is not None and torch.device(device).type != "meta":
            inv_freq, scaling = rope_inv_freq(config)
            self.rope = Rope(inv_freq.to(device), scaling)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32, trust_remote_code: bool = False) -> TargetModel:
        """The text model of the target at `model_dir` (also nested under a multimodal wrapper's
        text_config), from its safetensors; ValueError naming the reason when this decoder does not
        implement it (eagle/decode/generic.py then runs it through transformers)."""
        from eagle.target import open_target

        target = open_target(model_dir, trust_remote_code)
        if not target.fast_decoder:
            raise ValueError(f"{target.config_file}: text model_type {target.text_model_type!r}; the fast decoder "
                             "implements Llama and Qwen3 targets (use the generic decoder)")
        config = target.text_config()
        check_llama_config(config, f"{target.config_file}")
        tensors = target.read_text_state()
        model = cls(config, device="meta")
        check_and_assign(model, tensors, f"{model_dir} (safetensors)", device, dtype)
        inv_freq, scaling = rope_inv_freq(config)
        model.rope = Rope(inv_freq.to(device), scaling)
        return model.eval()

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def new_cache(self, max_len: int, attention: str = "sdpa") -> KVCache:
        assert self.rope is not None
        c, w = self.config, self.lm_head.weight
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, head_dim_of(c), max_len, w.device, w.dtype,
                       attention).attach_rope(self.rope)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                aux_ids: Sequence[int] = (), last_only: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """tokens/positions [T] -> (logits [T or 1, V], aux [T, L*H] or None, pre-norm last layer [T, H]).

        Aux id i is the input of decoder layer i (transformers' `hidden_states[i]`), collected in
        ascending layer order as vLLM and speculators do.
        """
        assert self.rope is not None
        x = self.embed_tokens(tokens)
        cos, sin = cache.rope_of(self.rope, positions, x.dtype)
        mask = cache.mask(positions)
        column = {layer: j for j, layer in enumerate(sorted(set(aux_ids)))}
        if column and not 0 <= min(column) <= max(column) < len(self.layers):
            raise ValueError(f"aux layer ids {sorted(column)}: the target has {len(self.layers)} layers")
        h = x.shape[-1]
        aux = x.new_empty(x.shape[0], len(column) * h) if column else None
        for i, layer in enumerate(self.layers):
            keep = aux[:, column[i] * h:(column[i] + 1) * h] if aux is not None and i in column else None
            x = layer(x, cos, sin, positions, cache.k[i], cache.v[i], mask, keep)  # (x updated in place)
        rows = x[-1:] if last_only else x
        logits = self.lm_head(self.norm(rows, mask.fused))
        return logits, aux, x


def _graphed(fn: Callable[[], None], use_graph: bool) -> Callable[[], None]:
    """Capture `fn` (no arguments; reads and writes only persistent tensors) as a CUDA graph."""
    if not use_graph:
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class Decoder:
    """Greedy and speculative decoding over static caches sized `max_len` tokens."""

    path = "fast"  # which decoder ran (evaluate / probe / bench report it); see eagle/decode/generic.py

    def __init__(self, target: TargetModel, proposer: Proposer | None = None, *, max_len: int,
                 layer_ids: Sequence[int] | None = None, eos_ids: Sequence[int] = (),
                 use_graphs: bool | None = None, sync_every: int = 2, attention: str = "sdpa") -> None:
        device = target.lm_head.weight.device
        if attention not in ATTENTION_KERNELS:
            raise ValueError(f"attention {attention!r}: use one of {', '.join(ATTENTION_KERNELS)}")
        if attention == "triton":
            from eagle.decode.triton_attention import require

            require(device)
        fuse_projections(target)  # one q/k/v and one gate/up matrix per layer (fewer, larger reads)
        if isinstance(proposer, nn.Module):
            fuse_projections(proposer)
        self.target, self.proposer, self.device = target, proposer, device
        self.max_len = max_len
        self.layer_ids = (check_layer_ids(layer_ids or (), target.num_layers, "the drafter's layer ids")
                          if proposer is not None else [])
        if proposer is not None and not self.layer_ids:
            raise ValueError("speculative decoding needs the drafter's aux layer ids")
        self.eos_ids = {int(e) for e in eos_ids}
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        self.sync_every = max(1, sync_every)  # steps/cycles in flight ahead of the host's end check
        self.last_timing: dict[str, float] = {}
        self._t_start = 0.0
        long: dict[str, Any] = {"dtype": torch.long, "device": device}
        self.attention = attention  # how both caches' layers attend (llama_ops.ATTENTION_KERNELS)
        self.cache = target.new_cache(max_len, attention)
        self.dcache = proposer.new_cache(max_len, attention) if proposer is not None else None
        # n (tokens in the target's cache) and seq (the tokens) in one tensor: the host's snapshot
        # of both after a launch is one device-to-host copy
        self.state = torch.zeros(max_len + 2, **long)
        self.n, self.seq = self.state[:1], self.state[1:]
        self.counter = torch.zeros(1, **long)
        self.hist_m = torch.zeros(max_len, **long)
        self.hist_n = torch.zeros(max_len, **long)
        self.arange = torch.arange(max_len, **long)
        # the speculative cycle's rows (module docstring): tokens [seq[n], d1..dk], positions n..n+k
        self.tokens = torch.zeros(SPEC_ROWS, **long)
        self.pos = torch.zeros(SPEC_ROWS, **long)
        hidden = proposer.hidden_size if proposer is not None else 1
        self.feat = torch.zeros(1, hidden, device=device, dtype=target.lm_head.weight.dtype)
        self._steps: dict[str, Callable[[], None]] = {}
        self._sampler: Sampler | None = None  # set during a sampled generate_speculative (eagle/decode/sampling.py)

    def _drafting(self) -> tuple[Proposer, KVCache]:
        """The drafter and its cache: the stages below run only when decoding speculatively."""
        assert self.proposer is not None
        return self.proposer, cast("KVCache", self.dcache)  # what proposer.new_cache gave

    # -- device-side stages (graph-capturable: no host syncs, fixed shapes) -------------------
    @torch.inference_mode()
    def _plain_step(self) -> None:
        n = self.n
        logits, _, _ = self.target(self.seq.index_select(0, n), n, self.cache)
        self.seq.index_copy_(0, n + 1, logits.argmax(-1))
        self.n.add_(1)

    def _spec_rows(self, k: int) -> None:
        """Room for k + 1 rows in `tokens` and `pos` (graphs captured over smaller buffers are dropped)."""
        if self.tokens.shape[0] < k + 1:
            self.tokens = torch.zeros(k + 1, dtype=torch.long, device=self.device)
            self.pos = torch.zeros(k + 1, dtype=torch.long, device=self.device)
            self._steps.clear()

    @torch.inference_mode()
    def _draft(self, k: int) -> None:
        """d2..dk from k-1 drafter steps at slots n..n+k-2, written into tokens[2..k] (d1 is there)."""
        proposer, dcache = self._drafting()
        feat = self.feat
        for j in range(1, k):
            _, feat = proposer.propose_step(self.tokens[j:j + 1], feat, self.pos[j - 1:j], dcache,
                                            out=self.tokens[j + 1:j + 2])

    @torch.inference_mode()
    def _verify(self, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (greedy g0..gk, aux states; None without a drafter) of the target over tokens[:k+1]
        at pos[:k+1]; with a sampler, its rejection-sampled tokens instead of g (their prefix equal
        to the drafts is the accepted count, as with greedy)."""
        logits, aux, _ = self.target(self.tokens[: k + 1], self.pos[: k + 1], self.cache, self.layer_ids)
        if self._sampler is not None:
            return self._sampler.verify(logits, self.tokens[1: k + 1]), aux
        return logits.argmax(-1), aux

    @torch.inference_mode()
    def _spec_cycle(self, k: int) -> None:
        self._draft(k)
        greedy, aux = self._verify(k)
        proposer, dcache = self._drafting()
        assert aux is not None  # (a drafter: its aux layer ids)
        ids, feats = proposer.propose_rows(aux, greedy, self.pos[: k + 1], dcache)
        if self.cache.attention == "triton":  # accept_cycle's bookkeeping in one kernel
            from eagle.decode import triton_ops

            accept = triton_ops.accept
        else:
            accept = accept_cycle
        accept(self.tokens, self.pos, greedy, ids, feats, self.state, self.counter, self.hist_m, self.hist_n,
               self.feat)

    def _stage(self, name: str, fn: Callable[[], None], graph: bool = True) -> Callable[[], None]:
        if name not in self._steps:
            saved = self.n.clone()
            self.n.zero_()
            self._steps[name] = _graphed(fn, self.use_graphs and graph)
            self.n.copy_(saved)
            self.counter.zero_()
        return self._steps[name]

    # -- prefill ------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompt_ids: Sequence[int], speculative: bool) -> None:
        p = len(prompt_ids)
        if p == 0:
            raise ValueError("empty prompt")
        ids = torch.tensor(list(prompt_ids), dtype=torch.long, device=self.device)
        self.seq[:p].copy_(ids)
        aux_ids = self.layer_ids if speculative else ()
        logits, aux, _ = self.target(ids, self.arange[:p], self.cache, aux_ids, last_only=True)
        self.seq[p:p + 1].copy_(logits.argmax(-1) if self._sampler is None else self._sampler.sample(logits))
        self.n.fill_(p)
        self.counter.zero_()
        if speculative:
            proposer, dcache = self._drafting()
            ids_, feats = proposer.propose_rows(aux, self.seq[1:p + 1], self.arange[:p], dcache)
            self.tokens[:1].copy_(self.seq[p:p + 1])
            self.tokens[1:2].copy_(ids_[-1:])
            self.pos.copy_(self.arange[: self.pos.shape[0]] + p)
            self.feat.copy_(feats[-1:])

    # -- host loops ---------------------------------------------------------------------------
    # The host never waits for the step it just launched: after each launch it queues an async
    # copy of (n, seq) into pinned memory and an event, and checks the end condition (EOS or
    # max_new tokens) on the snapshot of an older launch while up to `sync_every` launches are in
    # flight. The GPU never idles on the host, and at most `sync_every` launches overshoot the end.
    def _finished(self, p: int, max_new: int, n: int | None = None,
                  seq: torch.Tensor | None = None) -> tuple[bool, list[int]]:
        if n is None:
            n = int(self.n.item())
        new = (self.seq if seq is None else seq)[p:n + 1].tolist()[:max_new]
        for i, tok in enumerate(new):
            if tok in self.eos_ids:
                return True, new[: i + 1]
        return len(new) >= max_new, new

    def _run(self, launch: Callable[[], None], p: int, max_new: int, max_launches: int) -> list[int]:
        done, new = self._finished(p, max_new)  # syncs: the prefill is done
        t1 = time.perf_counter()
        ring = self._snapshot_ring()
        pending: list[int] = []
        launched = 0
        while not done:
            while len(pending) < self.sync_every and launched < max_launches:
                launch()
                slot = launched % len(ring)
                state_buf, event = ring[slot]
                state_buf.copy_(self.state, non_blocking=True)
                if event is not None:
                    event.record()
                pending.append(slot)
                launched += 1
            if not pending:
                break
            state_buf, event = ring[pending.pop(0)]
            if event is not None:
                event.synchronize()
            done, new = self._finished(p, max_new, int(state_buf[0]), state_buf[1:])
        synchronize(self.device)
        self.last_timing = {"prefill_s": t1 - self._t_start, "decode_s": time.perf_counter() - t1}
        return new

    def _snapshot_ring(self) -> list[tuple[torch.Tensor, torch.cuda.Event | None]]:
        if not hasattr(self, "_ring"):
            cuda = self.device.type == "cuda"
            self._ring = [(torch.empty(self.state.shape[0], dtype=torch.long, pin_memory=cuda),
                           torch.cuda.Event() if cuda else None) for _ in range(self.sync_every + 1)]
        return self._ring

    def _room(self, p: int, max_new: int, k: int) -> None:
        need = required_len(p, max_new, k, self.sync_every)
        if need > self.max_len:
            raise ValueError(f"prompt of {p} tokens + {max_new} new tokens needs max_len >= {need} "
                             f"(decoder built with {self.max_len})")

    def generate_greedy(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Plain greedy decoding: the new tokens (up to and including an EOS). `last_timing`
        then holds the prefill's and the decode loop's wall seconds."""
        p = len(prompt_ids)
        self._room(p, max_new_tokens, 0)
        step = self._stage("plain", self._plain_step)
        self._t_start = time.perf_counter()
        self.prefill(prompt_ids, speculative=False)
        return self._run(step, p, max_new_tokens, max_new_tokens - 1)

    def generate_speculative(self, prompt_ids: Sequence[int], max_new_tokens: int, k: int,
                             sampler: Sampler | None = None) -> SpecResult:
        """Greedy speculative decoding with chain drafts of length k; identical output to greedy.
        With a sampler: the first token sampled and every verify step rejection-sampled
        (eagle/decode/sampling.py); those cycles run eagerly, never as CUDA graphs."""
        if self.proposer is None:
            raise ValueError("generate_speculative needs a drafter")
        if k < 1:
            raise ValueError("k must be >= 1")
        p = len(prompt_ids)
        self._room(p, max_new_tokens, k)
        self._spec_rows(k)
        if sampler is None:
            cycle = self._stage(f"cycle{k}", lambda: self._spec_cycle(k))
        else:
            cycle = self._stage(f"sampled{k}", lambda: self._spec_cycle(k), graph=False)
        self._sampler = sampler
        try:
            self._t_start = time.perf_counter()
            self.prefill(prompt_ids, speculative=True)
            new = self._run(cycle, p, max_new_tokens, max_new_tokens - 1)
        finally:
            self._sampler = None
        cycles = int(self.counter.item())
        ms = self.hist_m[:cycles].tolist()
        starts = self.hist_n[:cycles].tolist()
        last_index = p + len(new) - 1  # seq index of the last token kept
        accepted = [m for m, n0 in zip(ms, starts, strict=True) if n0 < last_index]
        self.last_timing["cycles"] = cycles
        return SpecResult(tokens=new, accepted=accepted)

    @torch.inference_mode()
    def aux_states(self, ids: Sequence[int], layer_ids: Sequence[int]) -> torch.Tensor:
        """The aux hidden states [T, L*H] of a whole sequence (probe compares targets with them)."""
        x = torch.tensor(list(ids), dtype=torch.long, device=self.device)
        pos = torch.arange(len(ids), device=self.device)
        _, aux, _ = self.target(x, pos, self.target.new_cache(len(ids)), sorted(layer_ids), last_only=True)
        assert aux is not None
        return aux

    # -- timing (bench) -----------------------------------------------------------------------
    def time_stages(self, k: int, prompt_ids: Sequence[int], iters: int = 20) -> dict[str, float]:
        """Seconds per call of: one target decode step, the (k+1)-token verify, one drafter step,
        the drafter catch-up over k+1 rows, and the whole speculative cycle (each graph-captured
        on CUDA). Runs at the position reached by prefilling `prompt_ids`."""
        p = len(prompt_ids)
        self._room(p, 1, k)  # the timed stages never advance n
        self._spec_rows(k)
        stages: dict[str, Callable[[], None]] = {
            "target_step": self._stage("t_step", self._timed_target_step),
            "verify": self._stage(f"t_verify{k}", lambda: self._timed_verify(k)),
        }
        if self.proposer is not None:
            stages["draft_step"] = self._stage("t_draft", self._timed_draft_step)
            stages["catchup"] = self._stage(f"t_catchup{k}", lambda: self._timed_catchup(k))
        out = {}
        for name, fn in stages.items():
            self.prefill(prompt_ids, speculative=self.proposer is not None)
            out[name] = time_call(fn, iters, self.device)
        return out

    @torch.inference_mode()
    def _timed_target_step(self) -> None:
        """What plain greedy does a token, less the commit of it: the forward and the argmax (the
        verify step timed against it takes its argmax too)."""
        self.target(self.seq.index_select(0, self.n), self.n, self.cache)[0].argmax(-1)

    @torch.inference_mode()
    def _timed_verify(self, k: int) -> None:
        self._verify(k)

    @torch.inference_mode()
    def _timed_draft_step(self) -> None:
        proposer, dcache = self._drafting()
        proposer.propose_step(self.tokens[1:2], self.feat, self.pos[:1], dcache)

    @torch.inference_mode()
    def _timed_catchup(self, k: int) -> None:
        pos = self.pos[: k + 1]
        aux = self.feat.new_zeros(k + 1, self.target.config.hidden_size * len(self.layer_ids))
        proposer, dcache = self._drafting()
        proposer.propose_rows(aux, self.seq.index_select(0, pos), pos, dcache)


def accept_cycle(tokens: torch.Tensor, pos: torch.Tensor, greedy: torch.Tensor, ids: torch.Tensor,
                 feats: torch.Tensor, state: torch.Tensor, counter: torch.Tensor, hist_m: torch.Tensor,
                 hist_n: torch.Tensor, feat: torch.Tensor) -> None:
    """The accept stage of a speculative cycle (module docstring), in torch ops, all in place; with
    k = len(greedy) - 1, n = state[0], seq = state[1:], drafts = tokens[1:k+1]: m = the length of
    the prefix where drafts equal greedy[:k]; seq[n+1 .. n+k+1] = greedy (pos[:k+1] = n..n+k);
    hist_m[counter] = m, hist_n[counter] = n; counter += 1; n += m + 1; the next cycle's rows:
    pos[:k+1] += m + 1, tokens[0] = greedy[m] (= seq[n]), tokens[1] = ids[m] (its d1), feat =
    feats[m]. triton_ops.accept does the same in one launch."""
    k = greedy.shape[0] - 1
    n, seq = state[:1], state[1:]
    m = torch.cumprod((tokens[1:k + 1] == greedy[:k]).long(), 0).sum().view(1)
    seq.index_copy_(0, pos[: k + 1] + 1, greedy)
    hist_m.index_copy_(0, counter, m)
    hist_n.index_copy_(0, counter, n)
    counter.add_(1)
    n.add_(m + 1)
    pos[: k + 1].add_(m + 1)
    tokens[:1].copy_(greedy.index_select(0, m))
    tokens[1:2].copy_(ids.index_select(0, m))
    feat.copy_(feats.index_select(0, m))


SPEC_ROWS = 9  # rows of the cycle's buffers made at start (k <= 8; a larger k enlarges them)
