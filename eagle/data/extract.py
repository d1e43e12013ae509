"""`eagle extract`: the target's hidden states for every prepared sample (speculators' offline format).

For each dataset row i, DATA/hidden_states/hs_{i}.safetensors gets hidden_states [T, L+1, H]
(bf16): the inputs of decoder layers `layer_ids` (= HF output_hidden_states[k]), then the last
layer's output BEFORE the final norm (captured with a forward pre-hook on the decoder's `norm`;
in transformers 5 output_hidden_states[N] is post-norm). See eagle/data/hidden_io.py for the format.

hf backend: samples sorted by length and batched by a token budget (right padding, so the few
pad tokens never change the real tokens' states), hooks instead of output_hidden_states (only the
L+1 wanted layers are kept), no lm_head. Before starting it checks free disk space against the
bytes it will write; it skips samples whose file is already there and valid (resume); it writes
each file atomically and validates it (shape, dtype, NaN/Inf, token ids).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from eagle import distributed
from eagle.common import EagleError, check_file, note, progress, warn
from eagle.data import hidden_io
from eagle.fsutil import remove_dead_temps
from eagle.target import open_target

HEADER_BYTES = 256  # safetensors header, per file (rough)


class ExtractResult(BaseModel):
    out: str
    layer_ids: list[int]
    samples: int
    extracted: int
    skipped: int
    tokens: int  # tokens with valid hidden states on disk after the run
    new_tokens: int
    seconds: float
    tok_s: float
    bytes_written: int
    total_bytes: int
    shard: str = "0/1"  # K/N: this process handled the samples with index % N == K ("all/N": merged)
    shard_tokens: list[int] = []  # merged results only: new tokens of each shard
    shard_tok_s: list[float] = []  # merged results only: tok/s of each shard
    # `seconds` (and tok_s) run from before the model load to the last file written; these split it.
    # Defaults keep results written before they existed valid (0.0 = not measured).
    capture_seconds: float = 0.0  # the capture loop alone: first batch launched to last file written
    load_seconds: float = 0.0  # the rest of `seconds`: model load, hooks, writer threads
    capture_tok_s: float = 0.0  # new_tokens / capture_seconds (merged: all shards' / the slowest one's)
    shard_capture_tok_s: list[float] = []  # merged results only: capture tok/s of each shard


# ---------------------------------------------------------------- pure helpers


def parse_shard(spec: str | None, env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(K, N) from --shard K/N, else torchrun's rank and world size (eagle/distributed.py; `env`
    instead of os.environ), else (0, 1)."""
    if spec:
        k, sep, n = spec.partition("/")
        try:
            kn = (int(k), int(n)) if sep else None
        except ValueError:
            kn = None
        if kn is None or not 0 <= kn[0] < kn[1]:
            raise EagleError(f"--shard {spec!r}: expected K/N with 0 <= K < N, e.g. 0/2 and 1/2 for two processes")
        return kn
    topo = distributed.topology(env)
    return topo.rank, topo.world


def _rate(tokens: int, seconds: float) -> float:
    return round(tokens / seconds, 1) if tokens and seconds > 0 else 0.0


def merge_results(results: Sequence[ExtractResult]) -> ExtractResult:
    """One summary of every shard's result: counts add up; seconds, capture_seconds and load_seconds
    are each the slowest shard's, and the rates are all shards' new tokens over those."""
    seconds = max(r.seconds for r in results)
    capture = max(r.capture_seconds for r in results)
    new_tokens = sum(r.new_tokens for r in results)
    return ExtractResult(
        out=results[0].out, layer_ids=results[0].layer_ids, samples=sum(r.samples for r in results),
        extracted=sum(r.extracted for r in results), skipped=sum(r.skipped for r in results),
        tokens=sum(r.tokens for r in results), new_tokens=new_tokens, seconds=seconds,
        tok_s=_rate(new_tokens, seconds),
        bytes_written=sum(r.bytes_written for r in results), total_bytes=sum(r.total_bytes for r in results),
        shard=f"all/{len(results)}", shard_tokens=[r.new_tokens for r in results],
        shard_tok_s=[r.tok_s for r in results], capture_seconds=capture,
        load_seconds=max(r.load_seconds for r in results), capture_tok_s=_rate(new_tokens, capture),
        shard_capture_tok_s=[r.capture_tok_s for r in results])


def bytes_per_sample(seq_len: int, num_aux: int, hidden: int) -> int:
    return seq_len * (num_aux + 1) * hidden * 2 + seq_len * 8 + HEADER_BYTES


def check_disk(path: Path, needed: int, keep_free: int) -> None:
    """Raise EagleError when `needed` bytes plus `keep_free` do not fit at `path`."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed + keep_free > free:
        raise EagleError(
            f"extraction needs {needed / 1e9:.2f} GB (plus {keep_free / 1e9:.2f} GB kept free, --keep-free), "
            f"{free / 1e9:.2f} GB free at {probe}; free space, point --out elsewhere, or lower --keep-free"
        )


# ---------------------------------------------------------------- capturing hidden states


def vllm_samples(model: Path, rows: list[list[int]], todo: list[int], layer_ids: Sequence[int],
                 flags: Any, concurrency: int, dtype: str, echo: bool) -> Any:
    """(row index, hidden_states) from vLLM, as its requests finish (`concurrency` in flight)."""
    from eagle.serving.extraction import extract_vllm

    for pos, hs in extract_vllm(str(model), [rows[i] for i in todo], list(layer_ids), flags, concurrency=concurrency,
                                dtype=None if dtype == "auto" else dtype, echo=echo):
        yield todo[pos], hs


# ---------------------------------------------------------------- the command's work


def _extract_hf(model: Path, device: str, dtype: str, rows: list[list[int]], todo: list[int], ids: list[int],
                out: Path, hidden: int, batch_tokens: int, echo: bool,
                trust_remote_code: bool = False) -> tuple[int, int, float]:
    """(bytes written, tokens, capture seconds) of the hf backend: capture + file writes overlapped
    (eagle/data/capture.py); each file is written atomically, then read back and validated, on the
    engine's writer threads. Capture seconds: CaptureStats.seconds, the loop from the first batch
    launched to the last file written (model load and setup excluded; a lazy torch.compile included)."""
    import threading

    from eagle.data import capture as hidden_capture
    from eagle.target import load_model

    target = load_model(model, device, dtype, trust_remote_code=trust_remote_code)
    lock = threading.Lock()
    bar = progress(total=sum(len(rows[i]) for i in todo), desc="extract", unit="tok", disable=None if echo else True)
    write = hidden_capture.sample_writer(out, rows)

    def sink(i: int, hs: Any) -> int:
        n = write(i, hs)
        path = hidden_io.hs_path(out, i)
        problems = hidden_io.validate_file(path, rows[i], len(ids) + 1, hidden)
        if problems:
            path.unlink(missing_ok=True)
            raise EagleError(f"{path} failed validation after writing: " + "; ".join(problems))
        with lock:
            bar.update(len(rows[i]))
        return n

    stats = hidden_capture.extract_rows(target, rows, todo, ids, None, batch_tokens=batch_tokens, sink=sink)
    bar.close()
    if stats.bad_rows:
        raise EagleError(f"sample {min(stats.bad_rows)}: hidden_states has NaN/Inf values (nothing written for it; "
                         "a target in float16 may overflow: try --dtype bfloat16)")
    return stats.bytes_written, stats.tokens, stats.seconds


def _copy_dataset(src: Path, dst: Path) -> None:
    """Make `dst` a complete data dir: the dataset files of `src` next to the hidden states."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and (f.suffix in (".arrow", ".json")) and f.name != hidden_io.META_FILE:
            if not (dst / f.name).exists() or (dst / f.name).read_bytes() != f.read_bytes():
                shutil.copy2(f, dst / f.name)


def extract(model: Path, data: Path, out: Path | None = None, layer_ids: str | Sequence[int] | None = None,
            batch_tokens: int = 8192, backend: str = "hf", device: str = "auto", dtype: str = "auto",
            keep_free_gb: float = 1.0, echo: bool = True, shard: tuple[int, int] = (0, 1),
            vllm_flags: Any = None, vllm_concurrency: int = 8) -> ExtractResult:
    """The work of `eagle extract` (importable); raises EagleError on bad input.

    shard=(K, N): handle only the samples with index % N == K (counts in the result are this shard's).
    vllm_flags (eagle.serving.flags.VllmFlags) and vllm_concurrency (requests in flight): --backend vllm only.
    """
    import torch

    data, out = Path(data), Path(out) if out is not None else Path(data)
    trust = bool(vllm_flags and vllm_flags.trusts_remote_code)
    target = open_target(model, trust)
    ds = hidden_io.open_prepared(data)
    num_layers, hidden, vocab = target.num_layers, target.hidden_size, target.vocab_size
    ids = target.layer_ids(layer_ids)
    if batch_tokens < 1:
        raise EagleError("--batch-tokens must be positive")
    plain = ds.with_format(None)
    rows: list[list[int]] = list(plain["input_ids"])
    lengths = [len(r) for r in rows]
    too_big = [i for i, r in enumerate(rows) if r and max(r) >= vocab]
    if too_big:
        raise EagleError(f"row {too_big[0]} of {data} has token ids >= the target's vocab size {vocab}: "
                         "was it prepared with another model?")

    # resume: keep valid files made with the same target layout
    fingerprint = hidden_io.model_fingerprint(model)
    stale = False
    check_file(out / hidden_io.META_FILE, "JSON file")  # what is there is read below: a FIFO is refused, not skipped
    try:
        old = hidden_io.read_data_meta(out)
        if (old.layer_ids, old.hidden_size, old.num_layers) != (ids, hidden, num_layers):
            stale = True
            warn(f"{out} holds hidden states for layers {old.layer_ids} of a {old.num_layers}-layer target; "
                 f"re-extracting all samples for layers {ids}")
        elif old.target_fingerprint != fingerprint:
            stale = True
            warn(f"{out} holds hidden states of another target ({old.target}); re-extracting all samples for {model}")
    except EagleError:
        pass
    k_shard, n_shard = shard
    mine = [i for i in range(len(rows)) if i % n_shard == k_shard]
    if stale and n_shard > 1:  # another shard may already have rewritten the meta: no safe way to wipe
        raise EagleError(f"{out} holds hidden states of another target or layout; --shard cannot replace them "
                         f"safely: delete {hidden_io.hs_dir(out)} and {out / hidden_io.META_FILE}, or run once unsharded")
    done: list[int] = []
    if not stale:
        for i in mine:
            p = hidden_io.hs_path(out, i)
            there = check_file(p, "hidden-state file", fix=hidden_io.HS_FIX)  # a FIFO or a directory: refused
            if there and not hidden_io.validate_file(p, rows[i], len(ids) + 1, hidden):
                done.append(i)
    done_set = set(done)
    todo = [i for i in mine if i not in done_set]
    per = [bytes_per_sample(n, len(ids), hidden) for n in lengths]
    needed = sum(per[i] for i in todo)
    check_disk(out, needed, int(keep_free_gb * 1e9))
    left = remove_dead_temps(hidden_io.hs_dir(out))
    if left and echo:
        note(f"removed {left} temporary file(s) an earlier extract left in {hidden_io.hs_dir(out)} when it was killed")
    if out.resolve() != data.resolve():
        out.mkdir(parents=True, exist_ok=True)
        if k_shard == 0:  # one copier: shards run at once and the copy is not atomic
            _copy_dataset(data, out)
    if stale:  # never leave files of the old layout that a resumed run could take as valid
        for f in hidden_io.hs_dir(out).glob("hs_*.safetensors"):
            f.unlink()
    hidden_io.write_data_meta(out, hidden_io.DataMeta(
        target=str(model), layer_ids=ids, hidden_size=hidden, vocab_size=vocab, num_layers=num_layers,
        num_samples=len(rows), backend=backend, target_fingerprint=fingerprint))

    written = 0
    new_tokens = 0
    capture = 0.0
    t0 = time.time()
    if todo and backend == "hf":  # the fast engine: eagle/data/capture.py (writes on its own threads)
        written, new_tokens, capture = _extract_hf(model, device, dtype, rows, todo, ids, out, hidden,
                                                   batch_tokens, echo, trust)
    elif todo:
        if backend == "vllm":
            stream = vllm_samples(model, rows, todo, ids, vllm_flags, vllm_concurrency, dtype, echo)
        else:
            raise EagleError(f"unknown --backend {backend!r}; use hf or vllm")
        bar = progress(total=sum(lengths[i] for i in todo), desc="extract", unit="tok",
                       disable=None if echo else True)
        c0 = time.perf_counter()  # vLLM's server starts lazily inside the stream: its start counts here
        for i, hs in stream:
            tid = torch.tensor(rows[i], dtype=torch.int64)
            problems = hidden_io.check_sample({"hidden_states": hs.to(torch.bfloat16), "token_ids": tid},
                                              rows[i], len(ids) + 1, hidden)
            if problems:
                raise EagleError(f"sample {i}: " + "; ".join(problems) +
                                 " (nothing written for it; a target in float16 may overflow: try --dtype bfloat16)")
            path = hidden_io.write_sample(out, i, hs, tid)
            problems = hidden_io.validate_file(path, rows[i], len(ids) + 1, hidden)
            if problems:
                path.unlink(missing_ok=True)
                raise EagleError(f"{path} failed validation after writing: " + "; ".join(problems))
            written += path.stat().st_size
            new_tokens += lengths[i]
            bar.update(lengths[i])
            bar.set_postfix_str(f"{new_tokens / max(1e-9, time.time() - t0):,.0f} tok/s")
        capture = time.perf_counter() - c0
        bar.close()
    seconds = time.time() - t0
    capture = min(capture, seconds)  # two clocks: never report more capture than the whole
    total_bytes = sum(hidden_io.hs_path(out, i).stat().st_size for i in mine
                      if hidden_io.hs_path(out, i).is_file())
    return ExtractResult(
        out=str(out), layer_ids=ids, samples=len(mine), extracted=len(todo), skipped=len(done),
        # seconds to the microsecond: a merge recomputes the rates from them, and a capture of a few
        # ms rounded to the ms overstated the merged rate by up to 4% (above the ranks' sum)
        tokens=sum(lengths[i] for i in mine), new_tokens=new_tokens, seconds=round(seconds, 6),
        tok_s=_rate(new_tokens, seconds),
        bytes_written=written, total_bytes=total_bytes, shard=f"{k_shard}/{n_shard}",
        capture_seconds=round(capture, 6), load_seconds=round(seconds - capture, 6),
        capture_tok_s=_rate(new_tokens, capture),
    )


def gather_results(res: ExtractResult) -> list[ExtractResult] | None:
    """Under torchrun: every rank's result, in rank order (eagle/distributed.py `gather_objects`, after
    all extraction is done). None when not under torchrun or the group cannot form."""
    got = distributed.gather_objects(res.model_dump())
    return None if got is None else [ExtractResult.model_validate(g) for g in got]


def summary_metrics(res: ExtractResult, ranks: Sequence[ExtractResult] | None) -> dict[str, float]:
    """Unsharded: extract_tokens/_bytes/_tok_s/_capture_tok_s. Merged over ranks: the same for the whole
    run plus extract_rank{K}_tokens/_tok_s/_capture_tok_s. A lone --shard K/N:
    extract_shard{K}_tokens/_bytes/_tok_s/_capture_tok_s. The rates only when something was extracted."""
    if res.shard != "0/1" and ranks is None:
        k = res.shard.split("/")[0]
        named: dict[str, float] = {f"extract_shard{k}_tokens": res.tokens, f"extract_shard{k}_bytes": res.total_bytes}
        if res.new_tokens:
            named[f"extract_shard{k}_tok_s"] = res.tok_s
            named[f"extract_shard{k}_capture_tok_s"] = res.capture_tok_s
        return named
    metrics: dict[str, float] = {"extract_tokens": res.tokens, "extract_bytes": res.total_bytes}
    if res.new_tokens:
        metrics["extract_tok_s"] = res.tok_s
        metrics["extract_capture_tok_s"] = res.capture_tok_s
    for rank, r in enumerate(ranks or []):
        metrics[f"extract_rank{rank}_tokens"] = r.new_tokens
        metrics[f"extract_rank{rank}_tok_s"] = r.tok_s
        metrics[f"extract_rank{rank}_capture_tok_s"] = r.capture_tok_s
    return metrics
