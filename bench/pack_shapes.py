"""The attention-grid shapes `eagle train`'s packing produces, epoch by epoch (CPU, no model).

    python -m bench.pack_shapes                          # the GPU benches' data: 192 rows of 1024-2048
    python -m bench.pack_shapes --rows 2000 --epochs 20 --min-len 200 --max-len 4096 --batch-tokens 16384

With shape buckets (the CUDA default) every pack is padded to --batch-tokens and each document's row
of the per-document attention grid [B, Lmax] is rounded up to 256 columns: the compiled step sees
one shape per (B, Lmax), B the pack's document count. A pair first seen after epoch 1 is compiled
then, in the middle of training (issue 17: an 8-epoch run on the H200 lost 21 s in epoch 4), unless
`eagle train --warm-shapes` (the default with buckets) runs every pair once before step 1. This
replays the trainer's own split and packing (eagle.train.dataset.split_indices, pack_batches, shard, the
same seeds) and prints, per epoch, the pairs seen for the first time, for the current grid and for
B rounded up to a multiple of --b-multiple (a candidate: fewer shapes, more padded grid cells), with
the grid's fill (real tokens / cells) each costs, and the packs' fill (real tokens / packs x
--batch-tokens: the share of each padded step that trains, the real loop's ceiling against the
step). Nothing here needs a GPU: it decides which shape rule the next GPU call should measure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass

from bench.shapes import variable_lengths
from eagle.train import dataset
from eagle.train.config import BUCKET_MULTIPLE


def grid(batch: list[int], lengths: list[int], batch_tokens: int, b_multiple: int) -> tuple[int, int]:
    """(B, Lmax) of a pack: the trainer's own grid shape with shape buckets' width rounding
    (eagle.train.dataset.grid_shape), then B rounded up to `b_multiple`."""
    b, lmax = dataset.grid_shape(batch, lengths, batch_tokens, BUCKET_MULTIPLE)
    return -(-b // b_multiple) * b_multiple, lmax


@dataclass
class Replay:
    b_multiple: int
    shapes: int
    new_by_epoch: list[list[tuple[int, int]]]
    grid_fill: list[float]
    pack_fill: list[float]  # real tokens / (packs x batch tokens): what padding every pack to the budget keeps

    @property
    def new_after_epoch1(self) -> int:
        return sum(len(n) for n in self.new_by_epoch[1:])


def replay(lengths: list[int], epochs: int, batch_tokens: int, val_fraction: float, seed: int, world: int,
           rank: int, b_multiple: int) -> Replay:
    """Per epoch: the pairs first seen then, the grid fill over the epoch (real tokens / B x Lmax)
    and the pack fill (real tokens / packs x batch_tokens: the share of a padded step that trains)."""
    train_idx, _ = dataset.split_indices(len(lengths), val_fraction, seed)
    seen: set[tuple[int, int]] = set()
    new_by_epoch, fill_by_epoch, pack_fill = [], [], []
    for epoch in range(1, epochs + 1):
        batches = dataset.shard(dataset.pack_batches(train_idx, lengths, batch_tokens, seed, epoch), rank, world)
        real = cells = 0
        new: list[tuple[int, int]] = []
        for b in batches:
            shape = grid(b, lengths, batch_tokens, b_multiple)
            real += sum(min(lengths[i] - 1, batch_tokens) for i in b)  # shifted, as pack_batches counts them
            cells += shape[0] * shape[1]
            if shape not in seen:
                seen.add(shape)
                new.append(shape)
        new_by_epoch.append(sorted(new))
        fill_by_epoch.append(real / cells if cells else float("nan"))
        pack_fill.append(real / (len(batches) * batch_tokens) if batches else float("nan"))
    return Replay(b_multiple, len(seen), new_by_epoch, fill_by_epoch, pack_fill)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=192)
    p.add_argument("--min-len", type=int, default=1024, help="shortest row, tokens")
    p.add_argument("--max-len", type=int, default=2048, help="longest row, tokens")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-tokens", type=int, default=8192)
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0, help="eagle train's --seed")
    p.add_argument("--world", type=int, default=1, help="processes (rank 0's batches are replayed)")
    p.add_argument("--b-multiples", default="1,2,4", help="document-count roundings to compare (1: today's)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    lengths = variable_lengths(a.rows, a.min_len, a.max_len)
    rows = [replay(lengths, a.epochs, a.batch_tokens, a.val_fraction, a.seed, a.world, 0, int(m))
            for m in a.b_multiples.split(",")]
    if a.json:
        print(json.dumps({"args": vars(a), "rules": [dataclasses.asdict(r) | {"new_after_epoch1": r.new_after_epoch1}
                                                     for r in rows]}, indent=1))
        return 0
    print(f"{a.rows} rows of {a.min_len}-{a.max_len} tokens, packs of {a.batch_tokens}, widths x{BUCKET_MULTIPLE}, "
          f"{a.world} process(es), seed {a.seed}")
    print(f"{'B rounded to':>12}  {'shapes':>6}  {'new after epoch 1':>17}  {'grid fill':>9}  {'pack fill':>9}  "
          "new shapes per epoch")
    for r in rows:
        fill = sum(r.grid_fill) / len(r.grid_fill)
        packed = sum(r.pack_fill) / len(r.pack_fill)
        per = " ".join(str(len(n)) for n in r.new_by_epoch)
        print(f"{r.b_multiple:>12}  {r.shapes:>6}  {r.new_after_epoch1:>17}  {fill:>9.1%}  {packed:>9.1%}  {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
