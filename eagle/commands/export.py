"""`eagle export`: a drafter written in a published layout (eagle/drafter/export.py). The verb's options,
its refusals and its table.
"""

from __future__ import annotations

from pathlib import Path

import click

from eagle.commands._options import finish, json_option, layer_convention_option, refusals
from eagle.drafter.export import TARGETS, export_drafter


@click.command("export", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("draft", type=click.Path(path_type=Path))
@click.option("--to", "to", required=True, type=click.Choice(list(TARGETS)),
              help="The layout: speculators (ours, what vLLM serves) or sglang / specforge (one layout: "
                   "LlamaForCausalLMEagle3, eagle_config, midlayer.*); mla, the one layout of an MLA drafter "
                   "(vLLM's Eagle3DeepseekV2ForCausalLM: DeepSeek-V3 config, eagle_config, midlayer.*).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="New directory for the drafter.")
@layer_convention_option("[default: the layout's: input for speculators, output for sglang / specforge; an "
                         "imported drafter going back to its source's layout: the convention it was imported in]")
@json_option()
def command(draft: Path, to: str, out: Path, convention: str | None, as_json: bool) -> None:
    """Write a drafter (any layout eagle reads) in a published EAGLE-3 layout.

    \b
    An imported drafter (it has eagle_source.json) exported to its source's layout, unchanged in
    meaning, is the source again: config.json equal to the source's as JSON (model_type, extra
    keys and key order included), every tensor under its stored name with the same dtype, shape
    and bytes, the source's safetensors metadata (model.safetensors byte-identical to a source
    safetensors wrote as one file). So is an MLA drafter exported --to mla in the convention it was
    read in (its own config.json, names and metadata). Otherwise the config is written from the
    drafter's own.

    \b
    Example:
      eagle export work/draft-v2 --to specforge --out work/draft-v2-sglang

    Exit 0 written; 2 the drafter cannot be read or has unusable weights, or --out is not new
    (nothing is written).
    """
    with refusals():
        res = export_drafter(draft, to, out, convention)

    def notes() -> None:
        for note in res.notes:
            click.echo(f"note: {note}")

    finish(res, as_json, show=notes, table={
        "written": res.out,
        "layout": {"eagle": "SGLang / SpecForge (midlayer.*)", "speculators": "speculators (eagle3)",
                   "mla": "MLA (Eagle3DeepseekV2ForCausalLM)"}[res.layout],
        "layer ids": f"{res.layer_ids} ({res.layer_convention} convention)",
        "the source's bytes": "yes" if res.from_source else "no (written from the drafter's config)",
    })
