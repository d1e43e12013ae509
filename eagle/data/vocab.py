"""`eagle vocab`: the draft vocabulary (d2t / t2d) from token frequencies over loss-masked tokens.

The drafter predicts over DV of the target's V tokens: the DV most frequent assistant tokens
(ties broken by the smaller id), sorted ascending. If fewer than DV tokens occur, the smallest
unused ids fill the rest (speculators' convention). Then

    d2t[i] = target_id(i) - i     int64 [DV]   (target id of draft index i is i + d2t[i])
    t2d[t] = t is in the draft vocab   bool [V]

written to DATA/vocab.safetensors (tensors d2t, t2d, counts [V] int64) and DATA/vocab.json. A
missing or wrong d2t collapses acceptance silently, so `check_maps` verifies the pair.

`--from-draft DRAFT` instead takes d2t / t2d from an existing drafter checkpoint of any published
layout (to fine-tune it with its own vocabulary) and counts this data's tokens only for `counts` and
the coverage: the share of this data's assistant tokens the old vocabulary covers, which says
whether to keep it or choose a new one (`eagle train --init-from` accepts either).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from eagle.common import EagleError, check_file, load_safetensors
from eagle.data import hidden_io
from eagle.fsutil import atomic_path, atomic_write_json

VOCAB_FILE = "vocab.safetensors"
VOCAB_JSON = "vocab.json"


class VocabResult(BaseModel):
    draft_vocab: int
    vocab_size: int
    loss_tokens: int
    distinct_tokens: int
    coverage: float  # fraction of loss-masked tokens whose id is in the draft vocab
    path: str
    from_draft: str | None = None  # the drafter checkpoint whose d2t/t2d were kept (--from-draft)


# ---------------------------------------------------------------- pure functions


def count_tokens(rows: Iterable[tuple[Any, Any]], vocab_size: int) -> Any:
    """counts [V] int64 of token ids where the loss mask is set; rows are (input_ids, loss_mask)."""
    import torch

    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for ids, mask in rows:
        ids = torch.as_tensor(ids, dtype=torch.int64)
        mask = torch.as_tensor(mask).to(torch.bool)
        if ids.shape != mask.shape:
            raise EagleError(f"input_ids has {ids.shape[0]} tokens but loss_mask has {mask.shape[0]}")
        kept = ids[mask]
        if kept.numel() and (int(kept.max()) >= vocab_size or int(kept.min()) < 0):
            raise EagleError(f"token id {int(kept.max())} is outside the target vocabulary of {vocab_size}")
        counts += torch.bincount(kept, minlength=vocab_size)
    return counts


def choose_top(counts: Any, n: int) -> list[int]:
    """The n most frequent ids (ties by smaller id), padded with the smallest unused ids, ascending."""
    vocab_size = int(counts.shape[0])
    if not 0 < n <= vocab_size:
        raise EagleError(f"--draft-vocab {n} must be between 1 and the target vocab size {vocab_size}")
    c = counts.tolist()
    seen = [t for t in range(vocab_size) if c[t] > 0]
    seen.sort(key=lambda t: (-c[t], t))
    chosen = seen[:n]
    if len(chosen) < n:
        have = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in have][: n - len(chosen)]
    return sorted(chosen)


def build_maps(selected: list[int], vocab_size: int) -> tuple[Any, Any]:
    """(d2t int64 [DV], t2d bool [V]) for ascending, distinct target ids `selected`."""
    import torch

    sel = torch.tensor(selected, dtype=torch.int64)
    if sel.numel() == 0 or bool((sel[1:] <= sel[:-1]).any()):
        raise EagleError("the selected draft tokens must be distinct and ascending")
    d2t = sel - torch.arange(sel.numel(), dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[sel] = True
    return d2t, t2d


def check_maps(d2t: Any, t2d: Any) -> list[str]:
    """Problems with a (d2t, t2d) pair ([] when consistent)."""
    import torch

    problems = []
    if d2t.dtype != torch.int64 or d2t.dim() != 1:
        problems.append(f"d2t must be int64 [DV], is {d2t.dtype} {list(d2t.shape)}")
    if t2d.dtype != torch.bool or t2d.dim() != 1:
        problems.append(f"t2d must be bool [V], is {t2d.dtype} {list(t2d.shape)}")
    if problems:
        return problems
    target = d2t + torch.arange(d2t.shape[0])
    if bool((target[1:] <= target[:-1]).any()):
        problems.append("d2t does not map to strictly ascending target ids")
    if int(target.min()) < 0 or int(target.max()) >= t2d.shape[0]:
        problems.append("d2t maps outside the target vocabulary")
    elif int(t2d.sum()) != d2t.shape[0] or not bool(t2d[target].all()):
        problems.append("t2d does not mark exactly the tokens d2t maps to")
    return problems


# ---------------------------------------------------------------- the command's work


def _vocab_size(data: Path, model: Path | None) -> int:
    if model is not None:
        from eagle.target import open_target

        return open_target(model).vocab_size
    check_file(data / hidden_io.META_FILE, "JSON file")  # a FIFO there is named as such, not as "no eagle_data.json"
    try:
        return hidden_io.read_data_meta(data).vocab_size
    except EagleError:
        raise EagleError(f"cannot tell the target vocab size: {data} has no eagle_data.json "
                         "(run `eagle extract` first) and no --model was given") from None


def draft_maps(draft: Path, vocab_size: int) -> tuple[Any, Any]:
    """(d2t, t2d) of the drafter checkpoint in `draft` (any layout eagle/drafter/checkpoint.py reads),
    checked against the target's vocab size. Reads only those two tensors (the weights may be
    gigabytes); CheckpointError (exit 2) naming the file and the fix."""
    import torch

    from eagle.drafter import checkpoint

    ck = checkpoint.read_drafter(draft, validate=False)  # a missing d2t gets its own message below
    file = ck.weights_file
    if ck.cfg.vocab_size != vocab_size:
        raise checkpoint.CheckpointError(
            f"{ck.source / checkpoint.CONFIG_FILE}: the drafter's target vocabulary has {ck.cfg.vocab_size} tokens, "
            f"this data's target has {vocab_size} (another tokenizer); choose a new vocabulary with "
            "`eagle vocab --draft-vocab N` instead")
    if "d2t" not in ck.shapes:
        if ck.cfg.draft_vocab_size == vocab_size:  # the whole vocabulary is the draft vocabulary
            return torch.zeros(vocab_size, dtype=torch.int64), torch.ones(vocab_size, dtype=torch.bool)
        raise checkpoint.CheckpointError(
            f"{file}: has no d2t tensor (the draft-to-target vocabulary map), so its draft vocabulary is unknown; "
            "add d2t to the checkpoint, or choose a new vocabulary with `eagle vocab --draft-vocab N`")
    problems = checkpoint.shape_problems(ck.cfg, ck.shapes)
    if problems:
        raise checkpoint.CheckpointError(f"{file}: does not match its config.json: " + "; ".join(problems))
    maps = ck.tensors(["d2t", "t2d"])
    d2t, t2d = maps["d2t"], maps.get("t2d")
    if d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise checkpoint.CheckpointError(f"{file}: d2t is {d2t.dtype}, expected an integer tensor")
    d2t = d2t.to(torch.int64)
    if t2d is None:  # optional in the format: rebuild it from d2t over the config's target vocab
        target_ids = d2t + torch.arange(d2t.shape[0])
        if int(target_ids.min()) < 0 or int(target_ids.max()) >= ck.cfg.vocab_size:
            raise checkpoint.CheckpointError(f"{file}: d2t maps outside the target vocabulary of {ck.cfg.vocab_size}")
        t2d = torch.zeros(ck.cfg.vocab_size, dtype=torch.bool)
        t2d[target_ids] = True
    problems = check_maps(d2t, t2d.to(torch.bool))
    if problems:
        raise checkpoint.CheckpointError(f"{file}: inconsistent d2t/t2d: " + "; ".join(problems))
    return d2t, t2d.to(torch.bool)


def build_vocab(data: Path, draft_vocab: int | None = None, model: Path | None = None,
                from_draft: Path | None = None) -> VocabResult:
    """Count, choose (or take the drafter's), build and write DATA/vocab.safetensors + vocab.json."""
    from safetensors.torch import save_file

    if (draft_vocab is None) == (from_draft is None):
        raise EagleError("give exactly one of --draft-vocab N (choose a new vocabulary from this data) and "
                         "--from-draft DRAFT (keep an existing drafter's vocabulary, to fine-tune it)")
    data = Path(data)
    ds = hidden_io.open_prepared(data).with_format(None)
    vocab_size = _vocab_size(data, model)
    if from_draft is not None:
        d2t, t2d = draft_maps(from_draft, vocab_size)
    counts = count_tokens(zip(ds["input_ids"], ds["loss_mask"], strict=True), vocab_size)
    if draft_vocab is not None:  # (then from_draft is None)
        d2t, t2d = build_maps(choose_top(counts, draft_vocab), vocab_size)
    problems = check_maps(d2t, t2d)
    if problems:  # cannot happen for maps we built or checked; guards future edits
        raise EagleError("; ".join(problems))
    draft_vocab = int(d2t.shape[0])
    total = int(counts.sum())
    covered = int(counts[t2d].sum())
    out = data / VOCAB_FILE
    meta = {"draft_vocab": str(draft_vocab), "vocab_size": str(vocab_size)}
    if from_draft is not None:
        meta["from_draft"] = str(from_draft)
    with atomic_path(out) as tmp:
        save_file({"d2t": d2t, "t2d": t2d, "counts": counts}, str(tmp), metadata=meta)
    res = VocabResult(draft_vocab=draft_vocab, vocab_size=vocab_size, loss_tokens=total,
                      distinct_tokens=int((counts > 0).sum()), coverage=covered / total if total else 0.0,
                      path=str(out), from_draft=None if from_draft is None else str(from_draft))
    atomic_write_json(data / VOCAB_JSON, res.model_dump())
    return res


def read_vocab(data: Path) -> tuple[Any, Any]:
    """(d2t, t2d) from DATA/vocab.safetensors, checked for consistency."""
    f = Path(data) / VOCAB_FILE
    if not check_file(f, "vocabulary file", fix=f"remove it and run `eagle vocab --data {data} --draft-vocab N`"):
        raise EagleError(f"{f} not found: run `eagle vocab --data {data} --draft-vocab N`")
    t = load_safetensors(f, what="vocabulary file")
    problems = check_maps(t["d2t"], t["t2d"])
    if problems:
        raise EagleError(f"{f}: " + "; ".join(problems))
    return t["d2t"], t["t2d"]
