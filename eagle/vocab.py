"""`eagle vocab`: the draft vocabulary (d2t / t2d) from token frequencies over loss-masked tokens.

The drafter predicts over DV of the target's V tokens: the DV most frequent assistant tokens
(ties broken by the smaller id), sorted ascending. If fewer than DV tokens occur, the smallest
unused ids fill the rest (speculators' convention). Then

    d2t[i] = target_id(i) - i     int64 [DV]   (target id of draft index i is i + d2t[i])
    t2d[t] = t is in the draft vocab   bool [V]

written to DATA/vocab.safetensors (tensors d2t, t2d, counts [V] int64) and DATA/vocab.json. A
missing or wrong d2t collapses acceptance silently, so `check_maps` verifies the pair.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from eagle import hidden_io
from eagle.common import EagleError, fail, print_kv, quiet_hf
from eagle.metrics import write_metrics

VOCAB_FILE = "vocab.safetensors"
VOCAB_JSON = "vocab.json"


class VocabResult(BaseModel):
    draft_vocab: int
    vocab_size: int
    loss_tokens: int
    distinct_tokens: int
    coverage: float  # fraction of loss-masked tokens whose id is in the draft vocab
    path: str


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
        from transformers import AutoConfig

        if not Path(model).is_dir():
            raise EagleError(f"--model {model}: no such directory")
        cfg = AutoConfig.from_pretrained(str(model))
        return int(getattr(cfg, "text_config", cfg).vocab_size)
    try:
        return hidden_io.read_data_meta(data).vocab_size
    except EagleError:
        raise EagleError(f"cannot tell the target vocab size: {data} has no eagle_data.json "
                         "(run `eagle extract` first) and no --model was given") from None


def build_vocab(data: Path, draft_vocab: int, model: Path | None = None) -> VocabResult:
    """Count, choose, build and write DATA/vocab.safetensors + vocab.json."""
    from safetensors.torch import save_file

    data = Path(data)
    ds = hidden_io.open_prepared(data).with_format(None)
    vocab_size = _vocab_size(data, model)
    counts = count_tokens(zip(ds["input_ids"], ds["loss_mask"], strict=True), vocab_size)
    selected = choose_top(counts, draft_vocab)
    d2t, t2d = build_maps(selected, vocab_size)
    problems = check_maps(d2t, t2d)
    if problems:  # cannot happen for maps we built; guards future edits
        raise EagleError("; ".join(problems))
    total = int(counts.sum())
    covered = int(counts[t2d].sum())
    out = data / VOCAB_FILE
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    save_file({"d2t": d2t, "t2d": t2d, "counts": counts}, str(tmp),
              metadata={"draft_vocab": str(draft_vocab), "vocab_size": str(vocab_size)})
    os.replace(tmp, out)
    res = VocabResult(draft_vocab=draft_vocab, vocab_size=vocab_size, loss_tokens=total,
                      distinct_tokens=int((counts > 0).sum()), coverage=covered / total if total else 0.0,
                      path=str(out))
    (data / VOCAB_JSON).write_text(json.dumps(res.model_dump(), indent=1) + "\n")
    return res


def read_vocab(data: Path) -> tuple[Any, Any]:
    """(d2t, t2d) from DATA/vocab.safetensors, checked for consistency."""
    from safetensors.torch import load_file

    f = Path(data) / VOCAB_FILE
    if not f.is_file():
        raise EagleError(f"{f} not found: run `eagle vocab --data {data} --draft-vocab N`")
    t = load_file(str(f))
    problems = check_maps(t["d2t"], t["t2d"])
    if problems:
        raise EagleError(f"{f}: " + "; ".join(problems))
    return t["d2t"], t["t2d"]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data", type=click.Path(path_type=Path), required=True, help="Prepared (and extracted) data dir.")
@click.option("--draft-vocab", type=int, required=True, help="Draft vocabulary size DV (e.g. 256 for the toy, 32000 for real targets).")
@click.option("--model", type=click.Path(path_type=Path), default=None,
              help="Target dir, for its vocab size [default: from DATA/eagle_data.json].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(data: Path, draft_vocab: int, model: Path | None, as_json: bool) -> None:
    """Choose the draft vocabulary: the DV most frequent assistant tokens.

    \b
    eagle vocab --data work/data --draft-vocab 256

    Counts token ids where loss_mask is 1, takes the top DV (ties by id), sorts them and writes
    DATA/vocab.safetensors (d2t int64 [DV]: target_id - draft_id; t2d bool [V]; counts) where
    `eagle train` finds it. Metric: vocab_coverage (share of assistant tokens the draft vocab covers).
    """
    quiet_hf()
    try:
        res = build_vocab(data, draft_vocab, model)
    except EagleError as e:
        fail(str(e))
    write_metrics({"vocab_coverage": res.coverage})
    if as_json:
        click.echo(res.model_dump_json(indent=1))
        return
    print_kv({
        "written": res.path,
        "draft vocab / target vocab": f"{res.draft_vocab} / {res.vocab_size}",
        "assistant tokens counted": res.loss_tokens,
        "distinct assistant tokens": res.distinct_tokens,
        "coverage": f"{100 * res.coverage:.2f}%",
    })
