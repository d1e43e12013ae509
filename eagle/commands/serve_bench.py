"""`eagle serve-bench`: the target alone and with the drafter in vLLM (eagle/serving/serve_bench.py). The
verb's options, its refusals and its table.
"""

from __future__ import annotations

import click

from eagle.commands._options import (
    finish,
    json_option,
    refusals,
    sampling_of,
    sampling_options,
    suite_format_option,
    vllm_options,
)
from eagle.common import fail, print_table, warn
from eagle.serving.flags import vllm_flags
from eagle.serving.serve_bench import BenchReport, load_prompts, serve_bench


@click.command("serve-bench")
@click.option("--model", "model", required=True, type=click.Path(exists=True, file_okay=False),
              help="Target model directory (what vLLM serves).")
@click.option("--draft", type=click.Path(exists=True, file_okay=False),
              help="EAGLE-3 drafter checkpoint directory (speculators format).")
@click.option("--prompts", "prompts_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Prompt file, read exactly as `eagle evaluate --prompts` reads it.")
@click.option("-k", "k", default=3, show_default=True, type=click.IntRange(1, 16),
              help="Draft tokens per step (num_speculative_tokens).")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1),
              help="Tokens to generate per prompt (same meaning as in `eagle evaluate`).")
@click.option("--limit", type=click.IntRange(1), help="Use only the first N prompts.")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(1),
              help="Requests in flight at once (1 = batch-1 latency, comparable with `eagle evaluate`).")
@click.option("--no-draft", is_flag=True, help="Only the plain run (the target alone): the baseline.")
@click.option("--no-baseline", is_flag=True, help="Only the speculative run (one server start instead of two).")
@click.option("--startup-timeout", default=300.0, show_default=True, type=float,
              help="Seconds to wait for /health before giving up (the log tail is shown).")
@vllm_options
@click.option("--dtype", default=None, help="vLLM --dtype (default: float32 on CPU to match `eagle evaluate`, else auto).")
@click.option("--ignore-eos", is_flag=True,
              help="Generate exactly --max-new-tokens even past EOS (default: stop at EOS, as evaluate does).")
@sampling_options
@suite_format_option
@json_option("Print the whole report (both runs, outputs, deploy lines) as JSON.")
def command(model: str, draft: str | None, prompts_file: str, k: int, max_new_tokens: int, limit: int | None,
            port: int, concurrency: int, no_draft: bool, no_baseline: bool, startup_timeout: float,
            vllm_args: tuple[str, ...], trust_remote_code: bool, eager: bool | None, dtype: str | None,
            ignore_eos: bool, temperature: float, top_p: float, seed: int, suite_format: str,
            as_json: bool) -> None:
    """Serve the target alone and with the drafter in vLLM; tok/s, latency, speedup and acceptance.

    Two runs on the same prompt token ids `eagle evaluate` uses (greedy, the same
    --max-new-tokens, stopping at EOS like evaluate, --concurrency in flight): `plain`, the target
    alone, then `spec`, the target with the drafter as --speculative-config (method eagle3). vLLM's
    spec-decode counters are read from /metrics around the spec run. Each server is always stopped,
    also on Ctrl-C. CUDA graphs are on by default on a CUDA host (eager only with --enforce-eager);
    a CPU host runs eager unless --compile. When the speculative run is slower, a warning names the
    causes it can see (eager mode, draft length, low acceptance, batch size, CPU host).

    \b
    Metrics ($RUNBOOK_METRICS): vllm_accept_len (= 1 + accepted/drafts), vllm_accept_rate_0..k-1,
    vllm_speedup, vllm_plain_tok_s, vllm_spec_tok_s, vllm_{plain,spec}_latency_p50_s/_p90_s/_p99_s,
    vllm_{plain,spec}_ttft_s, vllm_tok_s / vllm_ttft_s (the spec run's, else the plain run's),
    vllm_cuda_graphs (1 or 0), vllm_eager, vllm_outputs_equal, vllm_startup_s.

    \b
    At the production sampler: --temperature T > 0 (with --top-p, --seed) adds a sampled pass on
    the last server after its greedy one (vLLM's per-request seed from --seed: the same seed gives
    the same outputs and counts): vllm_sampled_accept_len, vllm_sampled_accept_rate_0..k-1,
    vllm_sampled_draft_accept_rate, vllm_sampled_tok_s, vllm_sample_temperature, vllm_sample_top_p,
    beside the greedy vllm_accept_len.

    \b
    Standard suites (MT-Bench, SPEED-Bench, GSM8K, HumanEval in their published formats): each
    category's prompts go as one group, the counters read around it: vllm_accept_len_cat_<category>
    and vllm_accept_len_suite_<suite> (vllm_sampled_... too).

    \b
    Examples:
      eagle serve-bench --model work/target --draft work/draft --prompts plans/data/prompts.jsonl -k 3 --limit 4
      eagle serve-bench --model /models/big --draft /ckpt/draft --prompts chats.jsonl --concurrency 8 \\
          --trust-remote-code --vllm-arg tensor-parallel-size=8 --vllm-arg enable-expert-parallel \\
          --temperature 1.0 --top-p 0.95 --seed 0
    """
    if not no_draft and not draft:
        fail("give --draft DIR (the drafter to serve), or --no-draft for the baseline", code=2)
    if no_draft and no_baseline:
        fail("--no-draft and --no-baseline together leave nothing to run", code=2)
    with refusals(interrupted="interrupted; the vLLM server was stopped"):
        flags = vllm_flags(vllm_args, trust_remote_code, eager)
        prompts = load_prompts(model, prompts_file, limit, flags.trusts_remote_code, suite_format)
        report = serve_bench(model, prompts, draft=None if no_draft else draft, k=k, max_new_tokens=max_new_tokens,
                             flags=flags, concurrency=concurrency, port=port, startup_timeout=startup_timeout,
                             dtype=dtype, ignore_eos=ignore_eos, baseline=not no_baseline, echo=not as_json,
                             sampling=sampling_of(temperature, top_p, seed))
    for w in report.warnings:
        warn(w)
    finish(report, as_json, metrics=report.metrics, show=lambda: print_report(report))


def print_report(report: BenchReport) -> None:
    runs = [r for r in (report.plain, report.spec) if r is not None]
    rows = [("tok/s", *[r.tok_s for r in runs]),
            ("latency p50 / p90 / p99 (s)", *[f"{r.latency_s.p50:.3f} / {r.latency_s.p90:.3f} / {r.latency_s.p99:.3f}"
                                              for r in runs]),
            ("ttft p50 / p90 (s)", *[f"{r.ttft_s.p50:.3f} / {r.ttft_s.p90:.3f}" for r in runs]),
            ("output tokens", *[r.output_tokens for r in runs]),
            ("server start (s)", *[r.startup_s for r in runs])]
    if report.spec is not None and report.spec.accept_len is not None:
        rows.append(("accept_len", *(["-"] if report.plain else []), report.spec.accept_len))
        rows.append(("accept rate per position", *(["-"] if report.plain else []),
                     " / ".join(f"{a:.3f}" for a in report.spec.accept_rates)))
    print_table(rows, headers=["", *[r.name for r in runs]])
    if report.sampled is not None and report.sampling is not None:
        s = report.sampled
        rows = [("temperature / top-p / seed", f"{report.sampling.temperature} / {report.sampling.top_p} / "
                 f"{report.sampling.seed}"), ("tok/s", s.tok_s)]
        if s.accept_len is not None:
            rows += [("accept_len", s.accept_len), ("accept rate per position",
                                                    " / ".join(f"{a:.3f}" for a in s.accept_rates))]
        click.echo("\nsampled pass (same server, same prompts):")
        print_table(rows)
    greedy = report.spec.category_accept_len if report.spec is not None else {}
    if greedy:
        sampled = report.sampled.category_accept_len if report.sampled is not None else {}
        click.echo(f"\naccept_len per category ({report.suite}):")
        print_table([(name, value, sampled.get(name, "-")) for name, value in greedy.items()],
                    headers=["category", "greedy", "sampled"])
    tail = {"host / mode": f"{report.host} / {report.mode}", "k": report.k, "concurrency": report.concurrency}
    if report.speedup is not None:
        tail["speedup (spec / plain tok/s)"] = f"{report.speedup:.3f}x"
        tail["spec output == plain output"] = f"{report.outputs_equal}/{report.prompts}"
    print_table(list(tail.items()))
    if report.deploy:
        click.echo("\nserve it the way it was benchmarked (eagle serve-config prints more):")
        click.echo("  " + " ".join(_quote(a) for a in report.deploy.vllm))


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
