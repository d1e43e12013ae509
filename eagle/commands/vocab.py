"""`eagle vocab`: the draft vocabulary (eagle/data/vocab.py). The verb's options, its refusals and its
table.
"""

from __future__ import annotations

from pathlib import Path

import click

from eagle.commands._options import finish, json_option, refusals
from eagle.common import quiet_hf
from eagle.data.vocab import build_vocab


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data", type=click.Path(path_type=Path), required=True, help="Prepared (and extracted) data dir.")
@click.option("--draft-vocab", type=int, default=None,
              help="Choose a new draft vocabulary of this size DV (e.g. 256 for the toy, 32000 for real targets).")
@click.option("--from-draft", type=click.Path(path_type=Path), default=None,
              help="Keep this drafter checkpoint's vocabulary (its d2t/t2d), to fine-tune it on DATA.")
@click.option("--model", type=click.Path(path_type=Path), default=None,
              help="Target dir, for its vocab size [default: from DATA/eagle_data.json].")
@json_option()
def command(data: Path, draft_vocab: int | None, from_draft: Path | None, model: Path | None, as_json: bool) -> None:
    """Choose the draft vocabulary: the DV most frequent assistant tokens, or an existing drafter's.

    \b
    eagle vocab --data work/data --draft-vocab 256                 # new drafter
    eagle vocab --data work/data-v2 --from-draft work/draft-v1     # fine-tune work/draft-v1

    With --draft-vocab: counts token ids where loss_mask is 1, takes the top DV (ties by id), sorts
    them. With --from-draft: takes the drafter's d2t/t2d unchanged (any published layout) and
    checks them against the target's vocab. Either way writes DATA/vocab.safetensors (d2t int64
    [DV]: target_id - draft_id; t2d bool [V]; counts of this data) where `eagle train` finds it;
    `eagle train --init-from` fine-tunes a drafter with either (a new vocabulary re-takes the
    lm_head rows from the target). Metric: vocab_coverage (share of this data's assistant tokens
    the draft vocab covers: with --from-draft, how well the old vocabulary fits the new data).
    Exit 2 when the drafter cannot be read or was built for another vocabulary.
    """
    quiet_hf()
    with refusals():
        res = build_vocab(data, draft_vocab, model, from_draft)
    finish(res, as_json, metrics={"vocab_coverage": res.coverage}, table={
        "written": res.path,
        "vocabulary": f"kept from {res.from_draft}" if res.from_draft else "top tokens of this data",
        "draft vocab / target vocab": f"{res.draft_vocab} / {res.vocab_size}",
        "assistant tokens counted": res.loss_tokens,
        "distinct assistant tokens": res.distinct_tokens,
        "coverage": f"{100 * res.coverage:.2f}%",
    })
