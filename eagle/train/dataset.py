"""Training data for the drafter: offline hidden states -> shifted, packed batches.

A sample on disk (speculators' offline format, written by `eagle extract`) holds, for T tokens,
`hidden_states [T, L+1, H]` (L aux layers, then the target's last layer before its final norm),
`input_ids [T]` and `loss_mask [T]`. Training pairs position t's aux hidden states with the NEXT
token (as speculators' `shift_batch` does):

    input_ids   x1 .. x_{T-1}        hidden_states  cat(aux layers) at 0 .. T-2   [T-1, L*H]
    verifier    last layer at 1 .. T-1 (the drafter learns the target's distribution there)
    loss_mask   m1 .. m_{T-1}        position_ids   1 .. T-1

Batches pack whole samples into one row of at most `batch_tokens` tokens (documents are kept
apart by `document_ids`, so packing never lets one sample attend to another); `eagle train`
refuses a sample longer than the budget (check_lengths) rather than cut it. Which samples go into which batch is a pure function of
(lengths, budget, seed, epoch), so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import torch

from eagle.common import EagleError

VOCAB_FILE = "vocab.safetensors"


# ---------------------------------------------------------------- reading the data directory
def sample_table(data_dir: Path) -> tuple[list[int], list[int]]:
    """(row ids that have hidden states, their token counts), in row order."""
    from eagle.data import hidden_io

    rows = hidden_io.list_samples(data_dir)
    seq_len = hidden_io.open_prepared(data_dir)["seq_len"]
    return rows, [int(seq_len[r]) for r in rows]


def spans(ids: Iterable[int], most: int = 6) -> str:
    """Ascending ids as ranges: [0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (past `most` ranges: '..., and N more')."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:most]]
    return ", ".join(shown) + (f", and {len(runs) - most} more ranges" if len(runs) > most else "")


def check_complete(data_dir: Path, rows: list[int], partial: bool) -> None:
    """Refuse a data dir whose extraction did not finish (fewer hidden-state files than the extraction's
    samples in DATA/eagle_data.json: a killed `eagle extract`, deleted files), naming the missing rows;
    with `partial` (train --partial-data), say which samples the run trains on instead."""
    from eagle.common import note
    from eagle.data import hidden_io

    try:
        expected = hidden_io.read_data_meta(data_dir).num_samples
    except EagleError:
        return  # no usable eagle_data.json: the layer ids' read names it
    if len(rows) >= expected:
        return
    have = set(rows)
    missing = spans(i for i in range(expected) if i not in have)
    if partial:
        note(f"--partial-data: training on {len(rows)} of the {expected} samples of {data_dir}; rows without "
             f"hidden states: {missing}")
        return
    raise EagleError(f"{data_dir}: hidden states for {len(rows)} of its {expected} samples (rows {missing} have "
                     f"none): the extraction did not finish. Run `eagle extract --model TARGET --data {data_dir}` "
                     f"again (it resumes), or pass --partial-data to train on the {len(rows)} there are")


def load_raw(data_dir: Path, row: int) -> dict[str, torch.Tensor]:
    """hidden_states [T, L+1, H], input_ids [T], loss_mask [T] of dataset row `row`."""
    from eagle.data import hidden_io

    return hidden_io.load_sample(data_dir, row)


def read_layer_ids(data_dir: Path) -> list[int]:
    """The aux layer ids the hidden states were extracted at (DATA/eagle_data.json)."""
    from eagle.data import hidden_io

    return list(hidden_io.read_data_meta(data_dir).layer_ids)


def read_vocab(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t int64 [DV], t2d bool [V]) written by `eagle vocab`."""
    from eagle.common import check_file, load_safetensors

    file = data_dir / VOCAB_FILE
    fix = f"remove it and run `eagle vocab --data {data_dir} --draft-vocab N`"
    if not check_file(file, "vocabulary file", fix=fix):  # a FIFO hung safetensors' open, beyond any signal
        raise EagleError(f"{file}: missing; run `eagle vocab --data {data_dir} --draft-vocab N` first")
    blob = load_safetensors(file, what="vocabulary file")
    if "d2t" not in blob or "t2d" not in blob:
        raise EagleError(f"{file}: needs tensors d2t and t2d, has {sorted(blob)}")
    d2t, t2d = blob["d2t"].to(torch.long), blob["t2d"].to(torch.bool)
    if int(t2d.sum()) != d2t.shape[0]:
        raise EagleError(f"{file}: t2d marks {int(t2d.sum())} tokens but d2t has {d2t.shape[0]}")
    target_ids = d2t + torch.arange(d2t.shape[0])
    if not bool(t2d[target_ids].all()):
        raise EagleError(f"{file}: d2t and t2d disagree (d2t[i] + i must be a token t2d marks)")
    return d2t, t2d


# ---------------------------------------------------------------- pure planning
def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic (train, val) split of range(n); val gets >= 1 sample when asked and n >= 2."""
    if not 0 <= val_fraction < 1:
        raise EagleError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = 0 if val_fraction == 0 or n < 2 else max(1, round(n * val_fraction))
    return sorted(order[n_val:]), sorted(order[:n_val])


OPEN_BATCHES = 32  # pack_batches keeps this many batches open (first fit among them)


def pack_batches(indices: list[int], lengths: list[int], budget: int, seed: int | None,
                 epoch: int = 0) -> list[list[int]]:
    """Group `indices` into batches of at most `budget` (shifted) tokens; shuffled when `seed` is set.

    First fit over the (shuffled) order among the last OPEN_BATCHES batches: a sample goes into the
    first open batch it fits, a batch that overflows the window is closed. On 1024-2048-token samples
    and 8192-token batches that fills 95% of each batch where filling them in order fills 90%, which
    matters when every batch is padded to the budget (train's shape buckets). A sample longer than
    the budget is truncated here; `eagle train` refuses such data first (check_lengths)."""
    if budget < 2:
        raise EagleError(f"--batch-tokens must be >= 2, got {budget}")
    order = list(indices)
    if seed is not None:
        perm = torch.randperm(len(order), generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        order = [order[i] for i in perm.tolist()]
    done: list[list[int]] = []
    open_: list[tuple[list[int], int]] = []  # (samples, tokens used)
    for i in order:
        n = min(max(lengths[i] - 1, 0), budget)
        if n == 0:
            continue
        k = next((k for k, (_, used) in enumerate(open_) if used + n <= budget), None)
        if k is None:
            if len(open_) == OPEN_BATCHES:
                done.append(open_.pop(0)[0])
            open_.append(([], 0))
            k = len(open_) - 1
        batch, used = open_[k]
        batch.append(i)
        open_[k] = (batch, used + n)
    return done + [b for b, _ in open_]


def check_lengths(lengths: list[int], rows: list[int], budget: int, where: str) -> None:
    """Refuse data with a sample longer than the batch budget: packing would cut it, and the cut
    part (often a conversation's whole answer) would silently never be trained on."""
    long = [(n - 1, r) for r, n in zip(rows, lengths, strict=True) if n - 1 > budget]
    if long:
        worst, row = max(long)
        raise EagleError(f"{where}: {len(long)} of {len(lengths)} samples are longer than --batch-tokens {budget} "
                         f"(the longest, row {row} of the dataset, has {worst} tokens after the shift); training would cut "
                         f"them. Pass --batch-tokens {worst} or more (GPUs: 4096-16384), or drop the long rows "
                         "when preparing the data")


def grid_shape(batch: list[int], lengths: list[int], budget: int, multiple: int = 1) -> tuple[int, int]:
    """(documents, width) of a pack's per-document attention grid, the [B, Lmax] of
    eagle/doc_attention.layout, from the samples' lengths alone (no tensors): B is the pack's sample
    count, Lmax its longest shifted sample rounded up to `multiple`."""
    docs = [min(max(lengths[i] - 1, 0), budget) for i in batch]
    m = max(1, multiple)
    return len(docs), -(-max(docs) // m) * m


def first_of_each_shape(batches: Iterable[list[int]], lengths: list[int], budget: int,
                        multiple: int = 1) -> dict[tuple[int, int], list[int]]:
    """The first pack of each distinct grid shape among `batches`, in order of appearance: with every
    pack padded to `budget` (train's shape buckets) the grid shape is all that varies between steps,
    so these packs exercise every shape the run will compile."""
    first: dict[tuple[int, int], list[int]] = {}
    for batch in batches:
        first.setdefault(grid_shape(batch, lengths, budget, multiple), batch)
    return first


def shard(batches: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """This rank's batches; every rank gets the same count (the remainder is dropped) so DDP never hangs."""
    usable = len(batches) - len(batches) % world
    return batches[rank:usable:world]


# ---------------------------------------------------------------- tensors
def shift_sample(raw: dict[str, torch.Tensor], budget: int) -> dict[str, torch.Tensor]:
    hs = raw["hidden_states"]
    if hs.dim() != 3 or hs.shape[1] < 2:
        raise EagleError(f"hidden_states must be [T, L+1, H] with L >= 1, got {list(hs.shape)}")
    t, lp1, h = hs.shape
    n = min(t - 1, budget)
    return {
        "input_ids": raw["input_ids"][1 : n + 1].long(),
        "hidden_states": hs[:n, : lp1 - 1, :].reshape(n, (lp1 - 1) * h),
        "verifier_last_hidden_states": hs[1 : n + 1, lp1 - 1, :],
        "loss_mask": raw["loss_mask"][1 : n + 1].bool(),
        "position_ids": torch.arange(1, n + 1, dtype=torch.long),
    }


def collate(samples: list[dict[str, torch.Tensor]], dtype: torch.dtype = torch.float32,
            layout: bool = False, pin: bool = False, layout_multiple: int = 1,
            pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Pack shifted samples into one row: every tensor gets a leading batch dim of 1.

    layout=True adds eagle/train/doc_attention.py's layout (`doc_index`, `doc_pos`, `doc_mask`): where
    each document sits in the row, so attention can run per document instead of over the pack;
    its longest-document width is rounded up to `layout_multiple`.
    pad_to=N appends padding up to N tokens (its own document, loss_mask 0, zero hidden states):
    every pack then has the same length, so the compiled step sees one shape (see shape_buckets).
    pin=True gathers the hidden states straight into pinned host memory (one copy, and the copy to
    a GPU can then run asynchronously)."""
    real = sum(s["input_ids"].shape[0] for s in samples)
    pad = 0 if pad_to is None else pad_to - real
    if pad < 0:
        raise EagleError(f"a pack of {real} tokens does not fit pad_to={pad_to}")
    filler = {"input_ids": torch.zeros(pad, dtype=torch.long), "loss_mask": torch.zeros(pad, dtype=torch.bool),
              "position_ids": torch.arange(1, pad + 1, dtype=torch.long)}
    out = {k: torch.cat([s[k] for s in samples] + [filler[k]] * bool(pad), dim=0).unsqueeze(0)
           for k in ("input_ids", "loss_mask", "position_ids")}
    for k in ("hidden_states", "verifier_last_hidden_states"):
        parts = [s[k] for s in samples]
        shape = (real + pad, *parts[0].shape[1:])
        same = all(p.dtype == dtype for p in parts)
        on_cpu = parts[0].device.type == "cpu"  # --online's hidden states are already on the GPU
        buf = torch.empty(shape, dtype=dtype, device=parts[0].device, pin_memory=pin and same and on_cpu)
        if same:
            torch.cat(parts, dim=0, out=buf[:real])
        else:
            buf[:real].copy_(torch.cat(parts, dim=0))
        buf[real:].zero_()
        out[k] = buf.unsqueeze(0)
    lengths = [s["input_ids"].shape[0] for s in samples]
    out["document_ids"] = torch.cat(
        [torch.full((n,), d, dtype=torch.long) for d, n in enumerate(lengths + [pad] * bool(pad))]).unsqueeze(0)
    if layout:
        from eagle.train.doc_attention import layout as doc_layout

        out.update(doc_layout(lengths, layout_multiple, real + pad))
    return out


_copy_streams = threading.local()  # each batch-building thread's CUDA copy stream


def to_device(batch: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    """The batch's tensors on `device`.

    On CUDA the host-to-device copies run on a copy stream of the calling thread (from pinned
    memory: asynchronous) and the thread waits for them, so a batch built on a prefetch thread
    arrives whole, and its copy (128 MB for 8k tokens of a 1.1B target's states, 3-5 ms) overlaps
    the training step instead of queueing on the step's stream between two steps. Each tensor is
    then marked as used by the device's default stream, where the step runs (record_stream), so the
    caching allocator does not hand its memory to a later batch's copy before the step has read it."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return {k: v.to(dev) for k, v in batch.items()}
    streams = _copy_streams.__dict__.setdefault("by_device", {})
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    stream = streams.get(index)
    if stream is None:
        stream = streams[index] = torch.cuda.Stream(device=index)
    with torch.cuda.stream(stream):
        out = {k: v if v.is_cuda else (v if v.is_pinned() else v.pin_memory()).to(dev, non_blocking=True)
               for k, v in batch.items()}
    stream.synchronize()
    compute = torch.cuda.default_stream(index)
    for v in out.values():
        v.record_stream(compute)
    return out


def prefetched(make, items: list, workers: int = 1, op_threads: int | None = None):  # noqa: ANN001, ANN201
    """Yield make(item) for each item in order, building the next `workers` ones on side threads
    while the caller uses this one (reading, checking and collating batches overlaps the GPU's
    step; torch's copies release the GIL, so several workers use several cores).

    op_threads sets torch's intra-op threads on each side thread (the side thread's own setting:
    the caller's thread keeps its count); None leaves torch's default, which `eagle train` keeps:
    on the H200 one thread each made no difference once torch's pinned-memory cache was warm
    (graphed step fed by 4 threads: 28.9 ms, 28.5 ms with the default; bench/step_feed.py,
    docs/benchmarks.md session 10)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, workers)
    init = None if op_threads is None else (lambda: torch.set_num_threads(op_threads))
    with ThreadPoolExecutor(workers, initializer=init) as pool:
        ahead = deque(pool.submit(make, item) for item in items[:workers])
        for k in range(len(items)):
            cur = ahead.popleft().result()
            if k + workers < len(items):
                ahead.append(pool.submit(make, items[k + workers]))
            yield cur


def loader_workers(device: torch.device) -> int:
    """Batch-building threads for `eagle train`: on a GPU enough to keep up with the step (a
    1.1B-shape batch of 8k tokens is 128 MB to read, check and gather); one on a CPU, whose cores
    the training itself uses."""
    if torch.device(device).type != "cuda":
        return 1
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class DataSource(Protocol):
    """What the training loop (eagle/train/trainer.py) reads: the samples, their lengths, shapes and batches.

    Three sources declare it: `HiddenStates` below (the files of `eagle extract`),
    eagle/train/online.py's `OnlineStates` (the target run beside the drafter on each batch) and
    eagle/train/server_fed.py's `ServerStates` (fetched from a vLLM extraction server per batch)."""

    rows: list[int]  # dataset row of each sample (samples are numbered 0..len-1)
    lengths: list[int]  # tokens of each sample
    num_aux: int  # aux layers in the hidden states
    hidden_size: int
    prefetch: bool  # batches may be built ahead on worker threads
    runs_target: bool  # each batch runs the target: take_target_seconds reports its time

    def __len__(self) -> int: ...

    def batch(self, indices: list[int], device: torch.device, dtype: torch.dtype = torch.float32,
              layout: bool = False, layout_multiple: int = 1, pad_to: int | None = None) -> dict[str, torch.Tensor]:
        """The shifted, packed batch of these samples on `device` (see `collate`)."""
        ...

    def tokens(self, indices: list[int]) -> int:
        """Real tokens the batch of these samples trains on (padding not counted)."""
        ...

    def take_target_seconds(self) -> float:
        """Seconds the target's forwards took since the last call (0.0 when no target runs)."""
        ...

    def close(self) -> None: ...


class HiddenStates(DataSource):
    """The samples of one data directory, shifted and cached in memory while they fit."""

    prefetch = True  # reading files: several threads build batches ahead
    runs_target = False

    def __init__(self, data_dir: str | os.PathLike[str], budget: int, cache_bytes: int = 2 << 30,
                 partial: bool = False) -> None:
        self.data_dir = Path(data_dir)
        if not self.data_dir.is_dir():
            raise EagleError(f"--data {self.data_dir}: no such directory")
        if not (self.data_dir / "hidden_states").is_dir():
            raise EagleError(f"{self.data_dir}/hidden_states: missing; run `eagle extract --data {self.data_dir}` first")
        self.rows, self.lengths = sample_table(self.data_dir)
        if not self.rows:
            raise EagleError(f"{self.data_dir}: no hidden states; run `eagle extract --data {self.data_dir}`")
        check_complete(self.data_dir, self.rows, partial)
        self.budget = budget
        self.cache_bytes = cache_bytes
        self._cache: dict[int, dict[str, torch.Tensor]] = {}
        self._cached_bytes = 0
        self._lock = threading.Lock()  # batches are built on several threads
        first = load_raw(self.data_dir, self.rows[0])["hidden_states"]
        self.num_aux = first.shape[1] - 1
        self.hidden_size = first.shape[2]

    def __len__(self) -> int:
        """Samples are numbered 0..len-1 here (batches use these numbers, not dataset rows)."""
        return len(self.lengths)

    def sample(self, i: int) -> dict[str, torch.Tensor]:
        if i in self._cache:
            return self._cache[i]
        raw = load_raw(self.data_dir, self.rows[i])
        hs = raw["hidden_states"]
        if tuple(hs.shape[1:]) != (self.num_aux + 1, self.hidden_size):
            raise EagleError(f"{self.data_dir}: row {self.rows[i]} has hidden_states {list(hs.shape)}, "
                             f"expected [T, {self.num_aux + 1}, {self.hidden_size}] like sample 0")
        s = shift_sample(raw, self.budget)
        size = sum(v.numel() * v.element_size() for v in s.values())
        with self._lock:
            if i not in self._cache and self._cached_bytes + size <= self.cache_bytes:
                self._cache[i] = s
                self._cached_bytes += size
        return s

    def batch(self, indices: list[int], device: torch.device, dtype: torch.dtype = torch.float32,
              layout: bool = False, layout_multiple: int = 1, pad_to: int | None = None) -> dict[str, torch.Tensor]:
        pin = torch.device(device).type == "cuda"  # pinned: the copy runs async, the CPU prepares the next batch
        b = collate([self.sample(i) for i in indices], dtype=dtype, layout=layout, pin=pin,
                    layout_multiple=layout_multiple, pad_to=pad_to)
        return to_device(b, device)

    def tokens(self, indices: list[int]) -> int:
        return sum(min(max(self.lengths[i] - 1, 0), self.budget) for i in indices)

    def take_target_seconds(self) -> float:
        return 0.0

    def close(self) -> None:
        self._cache.clear()
