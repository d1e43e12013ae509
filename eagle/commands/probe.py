"""`eagle probe`: how alike two targets are (eagle/decode/probe.py). The verb's options, its refusals and
its table.
"""

from __future__ import annotations

from pathlib import Path

import click

from eagle.commands._options import (
    decoder_option,
    device_option,
    dtype_option,
    finish,
    json_option,
    refusals,
    vllm_options,
)
from eagle.common import EagleError, print_table, quiet_hf
from eagle.decode.evaluate import load_inputs
from eagle.decode.probe import ProbeReport, parse_layer_ids, run_probe
from eagle.decode.probe_vllm import VllmProbeReport, run_probe_vllm


@click.command("probe")
@click.option("--model", "model", type=click.Path(path_type=Path), required=True,
              help="The target the drafter was trained for.")
@click.option("--other", "other", type=click.Path(path_type=Path), required=True,
              help="The target to compare with (e.g. its successor).")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), required=True, help="Prompts JSONL.")
@click.option("--draft", "draft", type=click.Path(path_type=Path), default=None,
              help="Drafter trained for --model: also measure its accept_len on --other.")
@click.option("--layer-ids", default=None, help="Aux layers to compare, e.g. 2,4,5 (default: the drafter's, "
              "else [2, N//2, N-3]).")
@click.option("-k", "k", type=click.IntRange(1, 16), default=3, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(1), default=32, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=None, help="Use only the first N prompts.")
@click.option("--backend", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True,
              help="hf: both targets in transformers on one device, at once; vllm: each target alone in vLLM, in "
                   "turn (states to files, compared offline), the drafter's acceptance counted by vLLM.")
@click.option("--keep-states", type=click.Path(path_type=Path), default=None,
              help="With --backend vllm: keep the captured states here (DIR/model, DIR/other) [default: removed].")
@click.option("--vllm-concurrency", default=8, show_default=True, type=click.IntRange(1),
              help="With --backend vllm: requests in flight.")
@device_option("auto, cpu or cuda[:N] (hf backend).")
@dtype_option()
@decoder_option
@vllm_options
@json_option("Print the report as JSON.")
def command(model: Path, other: Path, prompts_file: Path, draft: Path | None, layer_ids: str | None, k: int,
            max_new_tokens: int, limit: int | None, backend: str, keep_states: Path | None, vllm_concurrency: int,
            device: str, dtype: str, decoder: str, vllm_args: tuple[str, ...], trust_remote_code: bool,
            eager: bool | None, as_json: bool) -> None:
    """How alike two targets are; does a drafter carry over?

    \b
    Metrics ($RUNBOOK_METRICS): cos_sim_l{layer}, rel_norm_diff_l{layer} per aux layer; with
    --draft, accept_len (the drafter against --other) and base_accept_len (against --model), and
    vocab_coverage: the share of --other's own greedy tokens on these prompts that lie in the
    drafter's draft vocabulary, i.e. that it could ever propose (vocab_coverage_distinct: over
    distinct tokens; base_vocab_coverage: the same for --model's tokens). Cosine near 1 and a small
    norm difference at the drafter's layers suggest the drafter's layers carry over; a low
    vocab_coverage says to fine-tune them with a new draft vocabulary (eagle vocab --draft-vocab N).
    The drafter may be of any published EAGLE-3 layout.

    \b
    --backend vllm (the way for targets that only fit a serving engine, e.g. Kimi-K2.5 on 8 GPUs): each
    target runs ALONE in vLLM's extraction server, in turn: --model's greedy continuations and its
    states, server stopped; --other's states on the same ids, server stopped; with --draft, --other
    served with the drafter, and accept_len is vLLM's own count (spec-decode counters, as serve-bench
    reads them) and vocab_coverage is over --other's outputs there; base_accept_len is not measured.
    The states go to files and are compared offline. Also max_resident (the most targets alive at
    once, from the servers' start/stop records: 1) and vllm_drafts. --device and --decoder are hf's.

    \b
    Example:
      eagle probe --model work/target --other work/target-v2 --prompts plans/data/prompts.jsonl \\
          --draft work/draft
      eagle probe --backend vllm --model /models/Kimi-K2 --other /models/Kimi-K2.5 --prompts p.jsonl \\
          --draft /models/kimi-k2-eagle3 --trust-remote-code --vllm-arg tensor-parallel-size=8
    """
    from eagle.target import open_target

    quiet_hf()
    report: ProbeReport
    with refusals(ValueError, FileNotFoundError):
        open_target(other, trust_remote_code, what="--other")
        if backend == "vllm":
            report = _probe_vllm(model, other, prompts_file, draft, layer_ids, k, max_new_tokens, limit, keep_states,
                                 vllm_concurrency, device, dtype, decoder, vllm_args, trust_remote_code, eager,
                                 as_json)
        else:
            if vllm_args or eager is not None or vllm_concurrency != 8 or keep_states is not None:
                raise EagleError("--vllm-arg, --vllm-concurrency, --keep-states, --enforce-eager and --compile "
                                 "apply to --backend vllm only", code=2)
            prompts, dev, dt = load_inputs(model, prompts_file, limit, draft, trust_remote_code, device, dtype)
            report = run_probe(model, other, prompts, parse_layer_ids(layer_ids), draft, k, max_new_tokens, dev,
                               dt, decoder, trust_remote_code)

    def show() -> None:
        print_table([(f"l{s.layer}", s.cos_sim, s.rel_norm_diff) for s in report.layers],
                    headers=["layer", "cos_sim", "rel_norm_diff"])
        click.echo(f"decoder: {report.decoder}")
        if isinstance(report, VllmProbeReport):
            click.echo(f"vLLM servers, one at a time (max resident {report.max_resident}): "
                       + ", ".join(f"{s.role} {s.stopped - s.started:.0f}s" for s in report.servers))
        if isinstance(report, VllmProbeReport) and report.accept_len is not None:
            click.echo(f"accept_len on --other, counted by vLLM: {report.accept_len:.3f} ({report.vllm_drafts} drafts)")
        elif report.accept_len is not None:
            click.echo(f"accept_len on --other: {report.accept_len:.3f}   on --model: {report.base_accept_len:.3f}")
        if report.accept_len is not None:
            click.echo(f"draft vocabulary covers {report.vocab_coverage:.1%} of --other's greedy tokens "
                       f"({report.vocab_coverage_distinct:.1%} of the distinct ones), "
                       f"{report.base_vocab_coverage:.1%} of --model's")

    finish(report, as_json, metrics=report.metrics(), show=show)


def _probe_vllm(model: Path, other: Path, prompts_file: Path, draft: Path | None, layer_ids: str | None, k: int,
                max_new_tokens: int, limit: int | None, keep_states: Path | None, concurrency: int, device: str,
                dtype: str, decoder: str, vllm_args: tuple[str, ...], trust_remote_code: bool, eager: bool | None,
                as_json: bool) -> VllmProbeReport:
    from eagle.serving.flags import vllm_flags
    from eagle.serving.serve_bench import load_prompts

    if device != "auto" or decoder != "auto":
        raise EagleError("--device and --decoder apply to --backend hf only (vLLM places the target itself; "
                         "pass --vllm-arg tensor-parallel-size=N)", code=2)
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise EagleError(f"--dtype {dtype}: with --backend vllm use auto, float32, bfloat16 or float16", code=2)
    if draft is not None and not (draft / "config.json").is_file():
        raise EagleError(f"{draft}: not a drafter checkpoint (no config.json); pass `eagle train --out` DIR")
    flags = vllm_flags(vllm_args, trust_remote_code, eager)
    prompts = load_prompts(str(model), str(prompts_file), limit, trust_remote_code).token_ids
    return run_probe_vllm(model, other, prompts, parse_layer_ids(layer_ids), draft, k, max_new_tokens,
                          None if dtype == "auto" else dtype, flags, concurrency, keep_states, echo=not as_json)
