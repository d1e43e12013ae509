"""One hidden-state file, and the data directory that holds them (speculators' offline format).

    DATA/                      a datasets.save_to_disk dir: input_ids, loss_mask, seq_len (torch format)
    DATA/prepared.json         what `eagle prepare` made it from (PrepareInfo)
    DATA/eagle_data.json       what `eagle extract` wrote (DataMeta): target, layer ids, sizes
    DATA/hidden_states/hs_{i}.safetensors
        hidden_states [T, L+1, H] bfloat16: the L aux layers (ascending ids; id k = the input of
                      decoder layer k = HF output_hidden_states[k]), then the last layer BEFORE the
                      final norm
        token_ids     [T] int64, equal to row i's input_ids

Shared by `eagle extract` (writes), `eagle vocab` and the training dataset (read).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from eagle.common import EagleError, check_file
from eagle.fsutil import JsonFileError, atomic_path, atomic_write_text, read_json_file

if TYPE_CHECKING:
    import torch

HS_DIR = "hidden_states"
META_FILE = "eagle_data.json"
PREPARE_FILE = "prepared.json"
FORMAT_VERSION = 1


class DataMeta(BaseModel):
    """DATA/eagle_data.json: how the hidden states in DATA were made."""

    format_version: int = FORMAT_VERSION
    target: str  # the target model directory (as given to extract)
    layer_ids: list[int]  # aux layers, ascending
    hidden_size: int
    vocab_size: int
    num_layers: int  # the target's decoder layers
    num_samples: int
    dtype: str = "bfloat16"
    backend: str = "hf"
    target_fingerprint: str | None = None  # model_fingerprint(target): a changed target makes the files stale


def model_fingerprint(model_dir: str | os.PathLike[str]) -> str:
    """A cheap identity of a model directory: config.json and the size, head and tail of each weight file
    (each a regular file: check_file refuses a FIFO, whose open would block, naming it)."""
    import hashlib

    h = hashlib.sha256()
    d = Path(model_dir)
    cfg = d / "config.json"
    h.update(cfg.read_bytes() if check_file(cfg, "JSON file") else b"")
    for f in sorted(d.glob("*.safetensors")) + sorted(d.glob("*.bin")):
        if not check_file(f, "weights file"):
            continue  # a dangling link: the model's load names it
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 16))
            fh.seek(max(0, size - (1 << 16)))
            h.update(fh.read(1 << 16))
    return h.hexdigest()[:16]


class PrepareInfo(BaseModel):
    """DATA/prepared.json: how `eagle prepare` made the dataset."""

    model: str
    source: str
    fmt_counts: dict[str, int] = {}
    records: int
    skipped: int
    samples: int
    tokens: int
    loss_tokens: int
    regenerated: bool
    max_new_tokens: int | None = None
    backend: str | None = None  # who answered with --regenerate: hf or vllm
    sampling: dict[str, Any] | None = None  # temperature, top_p, top_k, seed (--regenerate)
    n: int = 1  # samples per conversation
    truncated: int = 0  # conversations holding an answer cut at max_new_tokens (kept without an end-of-turn token)
    cut_at_max_len: int = 0  # samples cut at --max-len (or whose later turns found no room)
    history_reasoning: str = "keep"  # how earlier answers appear in later contexts: template, keep, drop, empty
    template_kwargs: dict[str, Any] = {}
    # what prepare skipped, changed and cut, by reason (records; nothing is lost silently)
    skipped_reasons: dict[str, int] = {}  # reason -> records skipped
    changed: int = 0  # records kept but changed (split into several samples, a field accepted as lost, ...)
    changed_reasons: dict[str, int] = {}  # reason -> records
    accepted_lost_fields: list[str] = []  # --accept-lost-field
    max_len: int | None = None
    cut_share: float = 0.0  # cut_at_max_len / samples built
    max_len_keep_99: int | None = None  # the --max-len that keeps 99% of samples whole; None: unknown, above max_len
    answers: int = 0  # regenerated answers
    answers_cut: int = 0  # of them cut at --max-new-tokens
    answers_cut_share: float = 0.0
    max_new_tokens_keep_99: int | None = None  # the --max-new-tokens that keeps 99% whole; None: unknown (or not regenerated)


# ---------------------------------------------------------------- paths and metadata


def hs_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / HS_DIR


def hs_path(data_dir: str | os.PathLike[str], i: int) -> Path:
    return hs_dir(data_dir) / f"hs_{i}.safetensors"


def write_data_meta(data_dir: str | os.PathLike[str], meta: DataMeta) -> None:
    atomic_write_text(Path(data_dir) / META_FILE, meta.model_dump_json(indent=1) + "\n")


def read_data_meta(data_dir: str | os.PathLike[str]) -> DataMeta:
    f = Path(data_dir) / META_FILE
    if not check_file(f, "JSON file", fix=f"remove it and run `eagle extract --model TARGET --data {data_dir}`"):
        raise EagleError(f"{f} not found: run `eagle extract --model TARGET --data {data_dir}` first")
    try:
        return DataMeta.model_validate(read_json_file(f))
    except JsonFileError as e:
        raise EagleError(str(e)) from None
    except ValueError as e:  # invalid JSON, or fields that are not eagle's
        raise EagleError(f"{f} is not a valid eagle data description: {e}") from None


# ---------------------------------------------------------------- the prepared dataset


def check_dataset_files(d: Path) -> None:
    """The files `datasets.load_from_disk` opens in `d` (state.json, dataset_info.json, the arrow files), each
    a regular file where there is one (check_file: exit 2 naming the first that is a FIFO, a device or a
    directory; a FIFO arrow file blocked load_from_disk in pyarrow's open, beyond any signal)."""
    fix = f"make the dataset again with `eagle prepare ... --out {d}`"
    for name in ("state.json", "dataset_info.json", *sorted(p.name for p in d.glob("*.arrow"))):
        check_file(d / name, "dataset file", fix=fix)


def open_prepared(data_dir: str | os.PathLike[str]) -> Any:
    """The datasets.Dataset saved by `eagle prepare` (torch format), with clear errors."""
    from datasets import load_from_disk

    d = Path(data_dir)
    if not d.is_dir():
        raise EagleError(f"data directory {d} does not exist; make it with `eagle prepare ... --out {d}`")
    check_dataset_files(d)  # a FIFO arrow file blocked load_from_disk for ever
    if not (d / "dataset_info.json").is_file() and not (d / "state.json").is_file():
        raise EagleError(f"{d} is not a prepared dataset (no state.json); make it with `eagle prepare ... --out {d}`")
    try:
        ds = load_from_disk(str(d))
    except Exception as e:  # datasets raises several types for a broken dir
        raise EagleError(f"cannot load the prepared dataset at {d}: {e}") from None
    missing = {"input_ids", "loss_mask", "seq_len"} - set(ds.column_names)
    if missing:
        raise EagleError(f"{d} lacks columns {sorted(missing)}; re-run `eagle prepare`")
    ds.set_format("torch")
    return ds


def prepared_rows(data_dir: str | os.PathLike[str]) -> tuple[list[list[int]], list[list[int]]]:
    """(input_ids, loss_mask) of every row `eagle prepare` saved: what a data source that computes the
    hidden states itself (the target beside the drafter, a vLLM server) reads; refuses an empty set."""
    ds = open_prepared(data_dir).with_format(None)
    input_ids: list[list[int]] = list(ds["input_ids"])
    loss_mask: list[list[int]] = list(ds["loss_mask"])
    if not input_ids:
        raise EagleError(f"{Path(data_dir)}: the prepared dataset has no rows")
    return input_ids, loss_mask


@functools.lru_cache(maxsize=8)
def _cached_prepared(data_dir: str, mtime: float) -> Any:
    return open_prepared(data_dir)


def _prepared(data_dir: str | os.PathLike[str]) -> Any:
    state = Path(data_dir) / "state.json"
    return _cached_prepared(str(Path(data_dir).resolve()), state.stat().st_mtime if state.exists() else 0.0)


# ---------------------------------------------------------------- one file


def all_finite(t: torch.Tensor) -> bool:
    """No NaN/Inf in a non-empty float tensor. One min/max pass (NaN propagates into both, an Inf
    becomes one of them): ~40x faster on CPU than isfinite(t).all() on bf16, which costs most of the
    time of reading a training sample otherwise."""
    import math

    import torch

    lo, hi = torch.aminmax(t)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def check_sample(tensors: dict[str, torch.Tensor], input_ids: torch.Tensor | list[int] | None = None,
                 num_layers: int | None = None, hidden_size: int | None = None) -> list[str]:
    """Problems with one sample's tensors ([] when valid). Pure: no I/O."""
    import torch

    problems: list[str] = []
    missing = {"hidden_states", "token_ids"} - set(tensors)
    if missing:
        return [f"missing tensors {sorted(missing)}"]
    hs, tid = tensors["hidden_states"], tensors["token_ids"]
    if hs.dim() != 3:
        return [f"hidden_states has shape {list(hs.shape)}, expected [T, L+1, H]"]
    if hs.dtype != torch.bfloat16:
        problems.append(f"hidden_states dtype {hs.dtype}, expected torch.bfloat16")
    if tid.dim() != 1 or tid.dtype not in (torch.int64, torch.int32):
        problems.append(f"token_ids has shape {list(tid.shape)} dtype {tid.dtype}, expected [T] int64")
    elif tid.shape[0] != hs.shape[0]:
        problems.append(f"hidden_states has {hs.shape[0]} positions but token_ids has {tid.shape[0]}")
    if num_layers is not None and hs.shape[1] != num_layers:
        problems.append(f"hidden_states has {hs.shape[1]} layers, expected {num_layers} (aux + last)")
    if hidden_size is not None and hs.shape[2] != hidden_size:
        problems.append(f"hidden size {hs.shape[2]}, expected {hidden_size}")
    if hs.numel() and not all_finite(hs):
        bad = int((~torch.isfinite(hs)).sum())
        problems.append(f"hidden_states has {bad} NaN/Inf values")
    if input_ids is not None and not problems:
        ids = torch.as_tensor(input_ids).to(torch.int64)
        if ids.shape != tid.shape or not torch.equal(ids, tid.to(torch.int64)):
            problems.append("token_ids differ from the dataset row's input_ids")
    return problems


def write_sample(data_dir: str | os.PathLike[str], i: int, hidden_states: torch.Tensor,
                 token_ids: torch.Tensor) -> Path:
    """Write hs_{i}.safetensors atomically (temp file in the same dir, fsync, rename)."""
    import torch
    from safetensors.torch import save_file

    out = hs_path(data_dir, i)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        save_file({
            "hidden_states": hidden_states.detach().to("cpu", torch.bfloat16).contiguous(),
            "token_ids": token_ids.detach().to("cpu", torch.int64).contiguous(),
        }, str(tmp))
    return out


HS_FIX = "remove it and run `eagle extract` again (it resumes)"


def read_sample_file(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The tensors of one hs file; a truncated or foreign file raises EagleError."""
    from eagle.common import load_safetensors

    return load_safetensors(path, what="hidden-state file")


def validate_file(path: str | os.PathLike[str], input_ids: torch.Tensor | list[int] | None = None,
                  num_layers: int | None = None, hidden_size: int | None = None) -> list[str]:
    """Problems with the file at `path` ([] when valid)."""
    p = Path(path)
    if not check_file(p, "hidden-state file", fix=HS_FIX):
        return [f"{p} is missing"]
    try:
        tensors = read_sample_file(p)
    except EagleError as e:
        return [str(e)]
    return check_sample(tensors, input_ids, num_layers, hidden_size)


# ---------------------------------------------------------------- the training side


def list_samples(data_dir: str | os.PathLike[str]) -> list[int]:
    """Indices i of dataset rows that have a hidden-state file, ascending."""
    n = len(_prepared(data_dir))
    d = hs_dir(data_dir)
    if not d.is_dir():
        return []
    out = []
    for f in d.iterdir():
        name = f.name
        if name.startswith("hs_") and name.endswith(".safetensors"):
            try:
                i = int(name[3:-len(".safetensors")])
            except ValueError:
                continue
            if 0 <= i < n:
                out.append(i)
    return sorted(out)


def load_sample(data_dir: str | os.PathLike[str], i: int) -> dict[str, torch.Tensor]:
    """Row i with its hidden states.

    Returns hidden_states [T, L+1, H] (bf16 as stored), token_ids [T] int64, input_ids [T] int64,
    loss_mask [T] int64 (1 on assistant tokens). Raises EagleError when the file is missing,
    broken, or its token ids do not match the row.
    """
    import torch

    ds = _prepared(data_dir)
    if not 0 <= i < len(ds):
        raise EagleError(f"sample {i} out of range: {data_dir} has {len(ds)} rows")
    row = ds[i]
    path = hs_path(data_dir, i)
    if not check_file(path, "hidden-state file", fix=HS_FIX):
        raise EagleError(f"{path} is missing: run `eagle extract` on {data_dir}")
    t = read_sample_file(path)
    problems = check_sample(t, row["input_ids"])
    if problems:
        raise EagleError(f"{path}: " + "; ".join(problems))
    return {
        "hidden_states": t["hidden_states"],
        "token_ids": t["token_ids"].to(torch.int64),
        "input_ids": row["input_ids"].to(torch.int64),
        "loss_mask": row["loss_mask"].to(torch.int64),
    }
