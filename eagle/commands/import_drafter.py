"""`eagle import-drafter`: a drafter of any published layout, written in ours
(eagle/drafter/import_drafter.py). The verb's options, its refusals and its table.
"""

from __future__ import annotations

from pathlib import Path

import click

from eagle.commands._options import finish, json_option, layer_convention_option, refusals
from eagle.drafter.import_drafter import import_drafter


@click.command("import-drafter", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="New directory for the checkpoint.")
@click.option("--model", type=click.Path(path_type=Path), default=None,
              help="The target: fills in null layer ids (vLLM's default for it), checks the fit, and is "
                   "recorded as the verifier.")
@layer_convention_option("[default: as written; in a SpecForge / SGLang layout, ids that look like the output "
                         "convention (first id 1, SpecForge's default [1, N//2-1, N-4], a last id N-1) are refused "
                         "until this says which]. output: the ids are written plus one.")
@json_option()
def command(src: Path, out: Path, model: Path | None, convention: str | None, as_json: bool) -> None:
    """Write a drafter of any published EAGLE-3 layout in our (speculators / vLLM) format.

    \b
    Reads: speculators / vLLM checkpoints (also `speculators convert` output with null layer ids,
    and ones older than the layer-ids key); EAGLE / SpecForge / SGLang ones (top-level llama
    config, architectures ["LlamaForCausalLMEagle3"], eagle_config, weights under midlayer.*);
    any norm flags vLLM serves (norm_before_fc with input_norm, fc_norm, norm_output,
    norm_before_residual); a drafter layer config of any model_type (SpecForge's Kimi-K2 config
    says kimi_k2, DeepSeek-V3 ones deepseek_v3) written as the Llama layer it is. Writes
    OUT/config.json + OUT/model.safetensors, tensors as stored, layer ids in vLLM's convention,
    and OUT/eagle_source.json (the source's config and tensor names: `eagle export` gives the
    source back from it). Every other eagle command reads these layouts directly; importing gives
    one canonical copy that vLLM and speculators load.

    \b
    Example:
      eagle import-drafter /models/kimi-k2-eagle3 --out work/draft-v1 --model /models/kimi-k2

    Exit 0 written; 2 the source cannot be read, does not fit --model, or --out is not new
    (nothing is written).
    """
    with refusals():
        res = import_drafter(src, out, model, convention)

    def notes() -> None:
        for note in res.notes:
            click.echo(f"note: {note}")

    finish(res, as_json, show=notes, table={
        "written": res.out,
        "source layout": {"eagle": "EAGLE / SpecForge (midlayer.*)", "speculators": "speculators (eagle3)",
                          "mla": "MLA (written in vLLM's Eagle3DeepseekV2ForCausalLM layout)"}[res.layout],
        "layer ids": f"{res.layer_ids} (read in the {res.layer_convention} convention)",
        "draft vocab / target vocab": f"{res.draft_vocab_size} / {res.vocab_size}",
        "norm flags": ", ".join(k for k, v in res.norm_flags.items() if v) or "none",
        "weights": ", ".join(res.dtypes),
        "verifier": res.verifier,
    })
