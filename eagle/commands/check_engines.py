"""`eagle check-engines`: transformers and vLLM on the same token ids (eagle/data/engine_check.py). The
verb's options, its refusals and its table.
"""

from __future__ import annotations

from pathlib import Path

import click

from eagle.commands._options import finish, json_option, refusals, vllm_options
from eagle.common import print_table, quiet_hf


@click.command("check-engines", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", type=click.Path(path_type=Path), required=True, help="Target model dir.")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), required=True,
              help="Prompts JSONL (the token ids `eagle evaluate` and `serve-bench` send).")
@click.option("--limit", type=click.IntRange(1), default=None, help="Use only the first N prompts.")
@click.option("--layer-ids", default=None, help="Aux layers, e.g. 2,4,5 [default: 2,N//2,N-3].")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16", show_default=True,
              help="The dtype of both engines (the yardstick is always transformers' float32 vs bfloat16).")
@click.option("--tolerance", type=click.FloatRange(min=0.0, min_open=True), default=2.0, show_default=True,
              help="A layer passes when the engines differ by at most this many times bf16 rounding.")
@click.option("--vllm-concurrency", default=8, show_default=True, type=click.IntRange(1),
              help="Requests in flight to vLLM.")
@json_option("Print the report as JSON.")
@vllm_options
def command(model: Path, prompts_file: Path, limit: int | None, layer_ids: str | None, dtype: str, tolerance: float,
            vllm_concurrency: int, as_json: bool, vllm_args: tuple[str, ...], trust_remote_code: bool,
            eager: bool | None) -> None:
    """Do transformers and vLLM compute the same hidden states on the same token ids?

    \b
    eagle check-engines --model work/target --prompts plans/data/prompts.jsonl --limit 8
    eagle check-engines --model /models/Kimi-K2.5 --prompts p.jsonl --trust-remote-code \\
        --vllm-arg tensor-parallel-size=8 --vllm-arg language-model-only

    The prompts' token ids go through vLLM (the extraction server of `eagle extract --backend vllm`,
    started and stopped here) and through transformers (the capture of `--backend hf`, on the CPU).
    Per aux layer and for the last layer (pre-norm): the mean relative difference, the mean cosine,
    and the verdict against bf16 rounding, measured as transformers' own float32-vs-bfloat16
    difference: `bf16-level` when the engines differ by at most --tolerance times that, else
    `differs` (exit 1). A drafter trained on one engine's states and served by the other loses
    acceptance when they differ.

    \b
    Metrics ($RUNBOOK_METRICS): engine_rel_diff_l{layer} / _last, engine_cos_sim_l{layer} / _last,
    engine_bf16_rel_diff_l{layer} / _last (the yardstick), engine_max_ratio (the largest
    rel_diff / yardstick), engine_max_rel_diff, engines_agree (1 or 0). E.g. `Pass: engines_agree == 1`.
    Exit codes: 0 bf16-level everywhere; 1 a layer differs (or the run failed: the message says); 2 a bad argument.
    """
    from eagle.data.engine_check import check_engines
    from eagle.serving.flags import vllm_flags
    from eagle.serving.serve_bench import load_prompts

    quiet_hf()
    with refusals(ValueError, FileNotFoundError):
        flags = vllm_flags(vllm_args, trust_remote_code, eager)
        from eagle.target import open_target

        open_target(model, trust_remote_code)
        rows = load_prompts(str(model), str(prompts_file), limit, trust_remote_code).token_ids
        report = check_engines(model, rows, layer_ids, dtype, tolerance, flags, trust_remote_code,
                               vllm_concurrency, echo=not as_json)

    def show() -> None:
        print_table([(f"l{s.layer}" if s.layer != "last" else "last", s.rel_diff, s.cos_sim, s.bf16_rel_diff,
                      s.ratio, s.verdict) for s in report.layers],
                    headers=["layer", "rel_diff", "cos_sim", "bf16 rounding", "ratio", "verdict"])
        click.echo(f"{report.samples} prompts, {report.tokens} tokens, {report.dtype}; vLLM flags: "
                   f"{' '.join(report.vllm_flags)}")
        click.echo("engines agree to bf16 rounding" if report.agree else
                   f"engines DIFFER beyond {report.tolerance:g} x bf16 rounding (docs/eagle.md: vLLM and "
                   "transformers on the same tokens)")

    finish(report, as_json, metrics=report.metrics(), show=show)
    if not report.agree:
        raise SystemExit(1)
