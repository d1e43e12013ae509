"""Fast capture of a target's hidden states: the engine behind `eagle extract --backend hf`.

What it does, and why each part is there (figures are the H200 ones in docs/benchmarks.md):

- Runs the decoder only (`model.model`): no LM head, no logits.
- Captures only the wanted layers: forward pre-hooks on decoder layers `layer_ids` (their input =
  HF output_hidden_states[k]) and on the final norm (the last layer's output BEFORE the norm).
- No attention mask: batches are right-padded, and under causal attention a real token never
  attends to a later (pad) position, so its states are exact; attention_mask=None lets SDPA take
  its causal flash kernel instead of a masked one. Samples are bucketed by length and each bucket's
  width rounded up to `pad_multiple`, so padding stays small and the compiled shapes stay few.
- Optionally compiles each decoder layer's `forward` (torch.compile; one graph reused by all
  layers; the hooks stay outside the compiled region): fuses the RMSNorm / RoPE / SiLU*mul
  element-wise work that eager mode does in many memory-bound passes.
  `scope="decoder"` compiles the whole capture as one graph instead (hooks traced; no causal mask
  built: `use_causal_sdpa`; the rotary tables made outside the graph); on the H200 it is 2-3%
  faster (bench/extract_kernels.py, docs/benchmarks.md), and the per-layer graphs stay the default:
  one graph a layer is the form every architecture has been tested with.
- On CUDA, hands each batch to the host without stalling the GPU: the stacked [B, T, L+1, H]
  tensor is copied into one of a few pinned host buffers on a side stream (ordered after the
  forward by an event), and writer threads wait for the copy's event, then write the files
  (header + raw bytes straight from pinned memory, fsync, rename). The main thread only blocks
  when every pinned buffer is still queued for writing: then the disk is the limit, as it should be.

On CPU the same code runs synchronously (no streams, no pinned memory); tests/eagle/data/test_hidden_capture.py
checks it against a plain forward with output_hidden_states.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eagle.common import EagleError, concrete_device
from eagle.fsutil import atomic_path

SCOPES = ("layers", "decoder")  # what HiddenCapture compiles: each decoder layer, or the whole capture
CAUSAL_SDPA = "eagle_causal_sdpa"  # transformers' sdpa attention under a name with no mask function


def plain_causal(config: Any) -> bool:
    """Every layer of this config attends causally to all earlier tokens (no sliding window, no
    bidirectional part): a causal flag alone then says the whole mask."""
    if not getattr(config, "is_causal", True):
        return False
    types = getattr(config, "layer_types", None)
    if types:
        return all(t == "full_attention" for t in types)
    return not getattr(config, "sliding_window", None) or getattr(config, "use_sliding_window", True) is False


def use_causal_sdpa(config: Any) -> str | None:
    """Switch a plain-causal sdpa target to CAUSAL_SDPA; returns the implementation to restore, or None
    where it does not apply. transformers builds no mask for an attention implementation that has no
    mask function (its path for external backends), so SDPA runs its causal kernel. Under
    torch.compile before torch 2.14 transformers cannot skip a plain causal mask itself: a whole-
    decoder graph builds a [B, 1, T, T] mask every forward (with the packed-sequence check from the
    position ids) and cuDNN's masked kernel takes 3x as long (docs/benchmarks.md). Rows stay exact:
    they are right-padded, and under causal attention no real token sees a later pad."""
    if getattr(config, "_attn_implementation", None) != "sdpa" or not plain_causal(config):
        return None
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    AttentionInterface.register(CAUSAL_SDPA, ALL_ATTENTION_FUNCTIONS["sdpa"])
    config._attn_implementation = CAUSAL_SDPA
    return "sdpa"


# ---------------------------------------------------------------- planning (pure)
def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def plan_buckets(lengths: Sequence[int], todo: Sequence[int], batch_tokens: int,
                 pad_multiple: int = 1) -> list[list[int]]:
    """Group sample indices into batches of similar length: width (the longest, rounded up to
    `pad_multiple`) x count <= `batch_tokens`; a sample wider than the budget runs alone."""
    if batch_tokens < 1 or pad_multiple < 1:
        raise EagleError("batch_tokens and pad_multiple must be >= 1")
    order = sorted(todo, key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = round_up(max(lengths[i], 1), pad_multiple)  # sorted: i is the batch's longest
        if cur and width * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def padded_input(rows: Sequence[Sequence[int]], batch: Sequence[int], pad_multiple: int = 1,
                 pad_id: int = 0) -> torch.Tensor:
    """[B, W] int64 of the batch's rows, right-padded with `pad_id` to W = round_up(longest)."""
    width = round_up(max(max(len(rows[i]) for i in batch), 1), pad_multiple)
    x = torch.full((len(batch), width), pad_id, dtype=torch.long)
    for r, i in enumerate(batch):
        x[r, : len(rows[i])] = torch.as_tensor(rows[i], dtype=torch.long)
    return x


# ---------------------------------------------------------------- capturing on the device
def decoder_of(model: Any) -> Any:
    """The decoder stack (with .layers and .norm) of a CausalLM or of a bare decoder."""
    dec = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    if not hasattr(dec, "layers") or not hasattr(dec, "norm"):
        raise EagleError(f"{type(model).__name__}: expected a decoder with .layers and .norm (Llama-like)")
    return dec


class HiddenCapture:
    """Forward pre-hooks on decoder layers `layer_ids` and on the final norm; `run` returns
    [B, T, L+1, H] (aux layers ascending, then the pre-norm last layer) in the model's dtype."""

    def __init__(self, model: Any, layer_ids: Sequence[int], compile: bool = False,
                 scope: str = "layers") -> None:
        if scope not in SCOPES:
            raise EagleError(f"compile scope {scope!r}: expected one of {', '.join(SCOPES)}")
        self.decoder = decoder_of(model)
        from eagle.target import check_layer_ids

        self.layer_ids = check_layer_ids(layer_ids, len(self.decoder.layers), "layer ids")
        self.store: dict[int | str, torch.Tensor] = {}
        self.handles = [self.decoder.layers[k].register_forward_pre_hook(self._hook(k), with_kwargs=True)
                        for k in self.layer_ids]
        self.handles.append(self.decoder.norm.register_forward_pre_hook(self._hook("last"), with_kwargs=True))
        self.compiled = False
        self._whole: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._graphs = False
        self._restore_attn: str | None = None
        self._eager_rope: torch.nn.Module | None = None  # the rotary module compile_decoder keeps out of the graph
        if compile:
            self.compile_layers() if scope == "layers" else self.compile_decoder()

    def _hook(self, key: int | str) -> Callable[..., None]:
        def fn(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.store[key] = args[0] if args else kwargs["hidden_states"]

        return fn

    def compile_layers(self) -> None:
        """torch.compile each decoder layer's forward (hooks stay eager; one graph for all layers)."""
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        for layer in self.decoder.layers:
            if not getattr(layer, "_eagle_compiled", False):
                layer.forward = torch.compile(layer.forward)
                layer._eagle_compiled = True
        self.compiled = True

    def compile_decoder(self, graphs: bool = False, rope_in_graph: bool = False) -> None:
        """torch.compile the whole capture (decoder, hooks and the stack) as one graph: Inductor fuses
        across layer boundaries (a layer's residual add into the next layer's norm), drops the unused
        final norm and writes the stacked states in place. A plain-causal sdpa target builds no mask
        (`use_causal_sdpa`): until `uncompile` or `close` the target ignores attention masks, so
        run it only through this capture. `graphs`: replay each shape's forward as a CUDA graph
        (torch's "reduce-overhead" mode; each result is cloned out of the graph's memory).
        The decoder's rotary tables (its `rotary_emb`, where it has one) are made outside the graph
        unless `rope_in_graph`: inside it Inductor recomputes them in every layer's rope kernel
        (on the H200, 2.6 ms a 16k-token batch where reading them takes 0.7 ms)."""
        self._restore_attn = use_causal_sdpa(self.decoder.config) if hasattr(self.decoder, "config") else None
        rope = getattr(self.decoder, "rotary_emb", None)
        if not rope_in_graph and isinstance(rope, torch.nn.Module) and "forward" not in vars(rope):
            rope.forward = torch._dynamo.disable(rope.forward)  # a graph break: the tables become inputs
            self._eager_rope = rope
        self._graphs = graphs
        self._whole = torch.compile(self._capture, mode="reduce-overhead" if graphs else None)
        self.compiled = True

    def uncompile(self) -> None:
        """Undo compile_layers / compile_decoder (back to the eager forward of every layer)."""
        for layer in self.decoder.layers:
            if getattr(layer, "_eagle_compiled", False):
                del layer.forward
                del layer._eagle_compiled
        self._whole = None
        self._restore_target()
        self.compiled = False

    def _restore_target(self) -> None:
        """Give the target back what compile_decoder changed: its attention implementation and rotary forward."""
        if self._restore_attn is not None:
            self.decoder.config._attn_implementation = self._restore_attn
            self._restore_attn = None
        if self._eager_rope is not None:
            del self._eager_rope.forward
            self._eager_rope = None

    def _capture(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.store.clear()
        self.decoder(input_ids=input_ids, use_cache=False)
        parts = [self.store[k] for k in self.layer_ids] + [self.store["last"]]
        self.store.clear()
        return torch.stack(parts, dim=2)

    @torch.no_grad()
    def run(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states [B, T, L+1, H] of right-padded `input_ids` [B, T] (no attention mask)."""
        if self._whole is None:
            return self._capture(input_ids)
        if not self._graphs:
            return self._whole(input_ids)
        torch.compiler.cudagraph_mark_step_begin()
        return self._whole(input_ids).clone()

    def close(self) -> None:
        """Remove the hooks and give the target its own attention implementation (and rotary forward) back."""
        for h in self.handles:
            h.remove()
        self.handles = []
        self._restore_target()


# ---------------------------------------------------------------- files
_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64",
              torch.int32: "I32"}


def _raw(t: torch.Tensor) -> memoryview:
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy().data.cast("B")


def write_safetensors(path: str | os.PathLike[str], tensors: dict[str, torch.Tensor], fsync: bool = True) -> int:
    """Write CPU tensors in the safetensors format straight from their memory (no serialised copy);
    atomic (temp file in the same dir, optional fsync, rename). Returns the bytes written."""
    path = Path(path)
    header: dict[str, Any] = {}
    offset = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with atomic_path(path, fsync=fsync) as tmp, open(tmp, "wb") as fh:
        fh.write(len(blob).to_bytes(8, "little"))
        fh.write(blob)
        for t in tensors.values():
            fh.write(_raw(t))
    return 8 + len(blob) + offset


def sample_writer(out_dir: str | os.PathLike[str], rows: Sequence[Sequence[int]],
                  fsync: bool = True) -> Callable[[int, torch.Tensor], int]:
    """A sink that writes row i as OUT/hidden_states/hs_{i}.safetensors (hidden_io's format)."""
    from eagle.data import hidden_io

    hidden_io.hs_dir(out_dir).mkdir(parents=True, exist_ok=True)

    def sink(i: int, hs: torch.Tensor) -> int:
        tid = torch.as_tensor(rows[i], dtype=torch.int64)
        return write_safetensors(hidden_io.hs_path(out_dir, i), {"hidden_states": hs, "token_ids": tid}, fsync)

    return sink


# ---------------------------------------------------------------- the pipeline
@dataclass
class CaptureStats:
    batches: int = 0
    samples: int = 0
    tokens: int = 0  # real (unpadded) tokens
    padded_tokens: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    main_wait_s: float = 0.0  # time the launching thread waited for a free host buffer (disk-bound)
    bad_rows: list[int] = field(default_factory=list)  # rows with NaN/Inf (nothing written for them)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


Sink = Callable[[int, torch.Tensor], int | None]


class CapturePipeline:
    """Run batches through a HiddenCapture and hand every sample to `sink(i, hs[T, L+1, H] cpu)`.

    On CUDA the device-to-host copies run on a side stream into `depth` pinned buffers, and
    `writers` threads call the sink, so the forward of batch n+1 overlaps the copy and the file
    writes of batch n. With sink=None nothing leaves the device (compute-only timing).
    """

    def __init__(self, capture: HiddenCapture, device: torch.device, depth: int = 4, writers: int = 2,
                 pad_multiple: int = 1) -> None:
        self.capture = capture
        self.device = concrete_device(device)  # "cuda" -> "cuda:N": set_device needs the index
        self.cuda = self.device.type == "cuda"
        self.depth = max(1, depth)
        self.writers = max(1, writers)
        self.pad_multiple = pad_multiple
        self._pinned: list[torch.Tensor] = []

    def _slot(self, k: int, numel: int) -> torch.Tensor:
        while len(self._pinned) <= k:
            self._pinned.append(torch.empty(0, dtype=torch.bfloat16))
        if self._pinned[k].numel() < numel:
            self._pinned[k] = torch.empty(numel, dtype=torch.bfloat16, pin_memory=True)
        return self._pinned[k]

    def run(self, rows: Sequence[Sequence[int]], batches: Iterable[Sequence[int]],
            sink: Sink | None = None) -> CaptureStats:
        stats = CaptureStats()
        lock = threading.Lock()
        errors: list[BaseException] = []
        work: queue.Queue[Any] = queue.Queue()
        free: queue.Queue[int] = queue.Queue()
        for k in range(self.depth):
            free.put(k)

        def deliver(batch: Sequence[int], host: torch.Tensor, bad: torch.Tensor | None) -> None:
            for r, i in enumerate(batch):
                if bad is not None and bool(bad[r]):
                    with lock:
                        stats.bad_rows.append(i)
                    continue
                n = sink(i, host[r, : len(rows[i])]) if sink is not None else 0
                with lock:
                    stats.bytes_written += int(n or 0)

        def writer() -> None:
            while True:
                item = work.get()
                if item is None:
                    return
                batch, host, bad, done, slot = item
                try:
                    if not errors:
                        if done is not None:
                            done.synchronize()
                        deliver(batch, host, bad)
                except BaseException as e:  # noqa: BLE001 - re-raised on the main thread
                    errors.append(e)
                finally:
                    free.put(slot)

        threads = [threading.Thread(target=writer, daemon=True) for _ in range(self.writers if self.cuda else 0)]
        for t in threads:
            t.start()
        if self.cuda:
            # Streams, events and compiled kernels follow the *current* device: under torchrun,
            # rank R works on cuda:R, so make that current (an event recorded on cuda:0's stream
            # would let the copy read hidden states before cuda:R has computed them).
            torch.cuda.set_device(self.device)
        copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        t0 = time.perf_counter()
        try:
            for batch in batches:
                if errors:
                    break
                x = padded_input(rows, batch, self.pad_multiple)
                if self.cuda:
                    x = x.pin_memory().to(self.device, non_blocking=True)
                hs = self.capture.run(x)
                stats.batches += 1
                stats.samples += len(batch)
                stats.tokens += sum(len(rows[i]) for i in batch)
                stats.padded_tokens += x.numel()
                if sink is None:
                    continue
                # NaN/Inf check per row on the device: one fused reduction, a few bytes to copy
                bad_dev = ~torch.isfinite(hs).flatten(1).all(dim=1)
                if not self.cuda:
                    deliver(batch, hs.to(torch.bfloat16), bad_dev)
                    continue
                w0 = time.perf_counter()
                slot = free.get()
                stats.main_wait_s += time.perf_counter() - w0
                host = self._slot(slot, hs.numel())[: hs.numel()].view(hs.shape)
                bad = torch.empty(bad_dev.shape, dtype=torch.bool, pin_memory=True)
                assert copy_stream is not None  # made when self.cuda
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(copy_stream):
                    copy_stream.wait_event(ready)
                    host.copy_(hs, non_blocking=True)
                    bad.copy_(bad_dev, non_blocking=True)
                    hs.record_stream(copy_stream)
                    bad_dev.record_stream(copy_stream)
                    done = torch.cuda.Event()
                    done.record(copy_stream)
                work.put((batch, host, bad, done, slot))
        finally:
            for _ in threads:
                work.put(None)
            for t in threads:
                t.join()
        if self.cuda:
            torch.cuda.synchronize(self.device)
        stats.seconds = time.perf_counter() - t0
        if errors:
            raise errors[0]
        return stats


def extract_rows(model: Any, rows: Sequence[Sequence[int]], todo: Sequence[int], layer_ids: Sequence[int],
                 out_dir: str | os.PathLike[str] | None, *, batch_tokens: int = 16384,
                 compile: bool | None = None, pad_multiple: int | None = None, depth: int | None = None,
                 writers: int = 8, fsync: bool = True, sink: Sink | None = None) -> CaptureStats:
    """Capture rows `todo` of `rows` and (with `out_dir`) write their hs files; the whole engine in one call.

    compile / pad_multiple default to (True, 64) on CUDA and (False, 1) on CPU. A `sink` given
    replaces the file writer (it runs on the writer threads on CUDA; it returns bytes written).
    """
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    compile = cuda if compile is None else compile
    pad_multiple = (64 if cuda else 1) if pad_multiple is None else pad_multiple
    lengths = [len(r) for r in rows]
    capture = HiddenCapture(model, layer_ids, compile=compile)
    try:
        pipe = CapturePipeline(capture, device, depth=depth or writers + 2, writers=writers, pad_multiple=pad_multiple)
        if sink is None and out_dir is not None:
            sink = sample_writer(out_dir, rows, fsync=fsync)
        return pipe.run(rows, plan_buckets(lengths, todo, batch_tokens, pad_multiple), sink)
    finally:
        capture.close()
