"""`eagle serve-config`: the vLLM and SGLang lines that serve the drafter (eagle/serving/serve_config.py).
The verb's options, its refusals and its table.
"""

from __future__ import annotations

from pathlib import Path

import click

from eagle.commands._options import finish, json_option, refusals, vllm_options
from eagle.common import fail
from eagle.serving.flags import server_spec, vllm_flags
from eagle.serving.serve_config import deploy_commands, from_bench, render


@click.command("serve-config")
@click.option("--model", type=click.Path(), help="Target model directory or hub id.")
@click.option("--draft", type=click.Path(), help="EAGLE-3 drafter directory (speculators format).")
@click.option("-k", "k", default=3, show_default=True, type=click.IntRange(1, 16), help="Draft tokens per step.")
@vllm_options
@click.option("--dtype", default=None, help="vLLM --dtype [default: the model's, as a GPU server would use].")
@click.option("--from-bench", "bench_json", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A `eagle serve-bench --json` report: print the lines it measured.")
@json_option("Print {vllm, sglang, sglang_unmapped, notes} as JSON.")
def command(model: str | None, draft: str | None, k: int, vllm_args: tuple[str, ...], trust_remote_code: bool,
            eager: bool | None, dtype: str | None, bench_json: Path | None, as_json: bool) -> None:
    """Print the vLLM and SGLang command lines that serve the drafter as it was benchmarked.

    From flags (the same --vllm-arg / --trust-remote-code / --enforce-eager as serve-bench, for a
    CUDA server: CUDA graphs unless --enforce-eager), or from a serve-bench JSON report
    (--from-bench), which records the lines of the configuration it measured.

    \b
    eagle serve-config --model /models/big --draft /ckpt/draft -k 3 --trust-remote-code --vllm-arg tensor-parallel-size=8
    eagle serve-bench ... --json > bench.json && eagle serve-config --from-bench bench.json
    """
    if bench_json is None and (not model or not draft):
        fail("give --model and --draft, or --from-bench REPORT.json", code=2)
    with refusals():
        if bench_json is not None:
            dc = from_bench(bench_json)
        else:
            assert model is not None and draft is not None  # checked above
            flags = vllm_flags(vllm_args, trust_remote_code, eager)
            dc = deploy_commands(server_spec(model, flags, cuda=True, dtype=dtype, draft=draft, k=k))
    finish(dc, as_json, show=lambda: click.echo(render(dc)))
