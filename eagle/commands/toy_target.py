"""`eagle toy-target`: a tiny trained target or its successor (eagle/toy.py builds it). The verb's options,
its refusals and its table.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from eagle import toy
from eagle.commands._options import finish, json_option, refusals
from eagle.common import fail, quiet_hf
from eagle.toy import ARCHS, ToyConfig


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", "out", type=click.Path(path_type=Path), required=True, help="Directory to write the target into (must be empty or absent).")
@click.option("--base", type=click.Path(path_type=Path), default=None, help="Make the successor of this toy target instead of a new one.")
@click.option("--arch", type=click.Choice(ARCHS), default="llama", show_default=True,
              help="The target's architecture: llama, qwen3 (q/k norms), deepseek_v3 (MoE + MLA, as DeepSeek-V3 "
                   "and Kimi-K2), kimi_k25 (the deepseek_v3 toy inside Kimi-K2.5's multimodal wrapper, its text "
                   "model under text_config).")
@click.option("--num-layers", default=8, show_default=True, help="Decoder layers (>= 8 so default layer ids are distinct).")
@click.option("--hidden", default=128, show_default=True)
@click.option("--intermediate", default=256, show_default=True)
@click.option("--heads", default=4, show_default=True)
@click.option("--kv-heads", default=2, show_default=True)
@click.option("--vocab", default=2048, show_default=True, help="Tokenizer and model vocabulary size.")
@click.option("--active", default=400, show_default=True, help="Words the Markov language uses.")
@click.option("--steps", type=int, default=None, help="Training steps [default: 300; successor: 2/3 of the base's].")
@click.option("--shift", type=float, default=None, help="Successor: fraction of words whose successors change [0.25].")
@click.option("--seed", type=int, default=None, help="Seed of the language and the training [0].")
@click.option("--force", is_flag=True, help="Overwrite a non-empty --out.")
@json_option("Print toy_meta.json instead of a table.")
def command(out: Path, base: Path | None, arch: str, num_layers: int, hidden: int, intermediate: int, heads: int,
            kv_heads: int, vocab: int, active: int, steps: int | None, shift: float | None,
            seed: int | None, force: bool, as_json: bool) -> None:
    """Make a tiny trained target (Llama, Qwen3, DeepSeek-V3 or Kimi-K2.5 layout) and tokenizer locally.

    \b
    New target:   eagle toy-target --out work/target [--arch qwen3|deepseek_v3|kimi_k25]
    Its successor: eagle toy-target --base work/target --out work/target-v2 --steps 200

    The target speaks a synthetic Markov language (peaked greedy outputs), has a chat template
    (<|user|> ... <|end|> <|assistant|> ...), and is deterministic for a seed. A successor keeps
    the architecture and tokenizer and is trained further on a shifted language; with --base the
    architecture options are taken from the base and ignored here.

    With $EAGLE_CACHE set, each toy is built once per machine under that directory and copied to
    --out (a successor, when --base is that cached toy and --steps/--shift/--seed are left out).
    """
    quiet_hf()
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file, not a directory; choose a directory for the target")
    if base is not None and not (base / "config.json").is_file():
        fail(f"--base {base}: not a toy target directory (no config.json)")
    if out.exists() and any(out.iterdir()) and not force:
        fail(f"{out} exists and is not empty; pass --force to overwrite or choose another --out")
    cached = bool(os.environ.get("EAGLE_CACHE"))
    with refusals():
        if base is not None:
            default = steps is None and shift is None and seed is None
            hit = toy.successor_from_cache(out, base) if cached and default else None
            cached = hit is not None
            meta = hit or toy.build_successor(base, out, steps=steps, shift=shift, seed=seed)
        else:
            cfg = ToyConfig(arch=arch, num_layers=num_layers, hidden=hidden, intermediate=intermediate, heads=heads,
                            kv_heads=kv_heads, vocab=vocab, active=active,
                            steps=steps if steps is not None else 300,
                            seed=seed if seed is not None else 0)
            if shift is not None:
                cfg.shift = shift
            meta = toy.from_cache(out, cfg) if cached else toy.build_toy_target(out, cfg)
    c = meta.config
    finish(meta, as_json, table={
        "out": str(out),
        "kind": "successor of " + str(base) if base else "new target",
        "arch": c.arch,
        "layers x hidden": f"{c.num_layers} x {c.hidden}",
        "vocab": c.vocab,
        "steps": c.steps,
        "final loss": round(meta.final_loss, 4),
        "shifted words": meta.shifted_words,
        "build seconds": meta.build_seconds,
        **({"from": f"$EAGLE_CACHE ({toy.cache_root()})"} if cached else {}),
    })
