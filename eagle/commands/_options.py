"""The edges every `eagle` command shares: the options several of them take, the way their errors
end, and the way they end. Only eagle/commands/ imports this module.

A command's body is

    with refusals():                      # an EagleError -> `error: ...` on stderr, its exit code
        result = do_the_work(...)
    finish(result, as_json, metrics=result.metrics(), table={...})

`finish` merges the summary metrics into $RUNBOOK_METRICS (that is how `runbook next` judges a
phase), then prints the result as JSON (`--json`: a pydantic model or a dict, indented) or the
human view: a two-column table, or what `show()` prints.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click
from pydantic import BaseModel

from eagle.common import ATTENTION_CHOICES, DTYPES, EagleError, fail, print_kv
from eagle.metrics import write_metrics
from eagle.serving.client import Sampling

F = TypeVar("F", bound=Callable[..., Any])


# ---------------------------------------------------------------- options


def json_option(help: str = "Print the result as JSON.") -> Callable[[F], F]:
    """`--json` (parameter `as_json`)."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def trust_remote_code_option(fn: F) -> F:
    """`--trust-remote-code`: every command that loads the target, through transformers or vLLM."""
    return click.option("--trust-remote-code", is_flag=True,
                        help="Allow a target whose config/model/tokenizer is custom code (auto_map) to run its "
                             "Python files (transformers' and vLLM's trust_remote_code). Only for code you "
                             "trust.")(fn)


def device_option(help: str = "auto, cpu or cuda[:N].") -> Callable[[F], F]:
    """`--device` (default auto: cuda when there is one, else cpu; common.pick_device)."""
    return click.option("--device", default="auto", show_default=True, help=help)


def dtype_option(help: str = "auto (bf16 on GPU, fp32 on CPU), " + ", ".join(DTYPES[1:]) + ".") -> Callable[[F], F]:
    """`--dtype` (default auto; common.pick_dtype)."""
    return click.option("--dtype", default="auto", show_default=True, help=help)


def attention_option(fn: F) -> F:
    """`--attention auto|sdpa|triton`: the fast decoder's kernels (decode.factory.load_decoder)."""
    return click.option("--attention", type=click.Choice(list(ATTENTION_CHOICES)), default="auto",
                        show_default=True,
                        help="The fast decoder's kernels: triton (split-KV attention reading only the slots written "
                             "so far, rope + cache write, RMSNorm, SwiGLU and the accept step fused; CUDA with "
                             "triton installed; 8B decode step 4.23 ms vs 5.48 ms on an H200, docs/benchmarks.md), "
                             "sdpa (torch's SDPA over the whole static cache, torch's ops), or auto: triton where "
                             "it runs, else sdpa. The report says which ran.")(fn)


def decoder_option(fn: F) -> F:
    """`--decoder auto|fast|generic` of evaluate, probe and bench (decode.factory.load_decoder's `path`)."""
    return click.option("--decoder", type=click.Choice(["auto", "fast", "generic"]), default="auto",
                        show_default=True,
                        help="fast: eagle/decode/fast.py (static cache, CUDA graphs; Llama and Qwen3 targets); generic: "
                             "the target's own transformers forward with a KV cache (any architecture); auto: "
                             "fast where it implements the target.")(fn)


def layer_convention_option(default_help: str) -> Callable[[F], F]:
    """`--layer-convention input|output` (parameter `convention`; None: what the layout implies)."""
    return click.option("--layer-convention", "convention", type=click.Choice(["input", "output"]), default=None,
                        help="How the drafter's aux layer ids count: input (id i = the input of target layer i = "
                             "HF hidden_states[i]: speculators, vLLM, eagle) or output (id i = the output of layer "
                             "i = HF hidden_states[i+1]: SGLang, SpecForge). " + default_help)


def vllm_options(f: F) -> F:
    """The engine options every vLLM-backed command shares (`vllm_args`, `trust_remote_code`, `eager`;
    serving.flags.vllm_flags turns them into VllmFlags)."""
    f = click.option("--enforce-eager/--compile", "eager", default=None,
                     help="vLLM without / with torch.compile and CUDA graphs [default: CUDA graphs on a CUDA "
                          "host, eager on a CPU host].")(f)
    f = trust_remote_code_option(f)
    f = click.option("--vllm-arg", "vllm_args", multiple=True, metavar="KEY[=VALUE]",
                     help="Any vLLM engine flag, repeatable: tensor-parallel-size=8, gpu-memory-utilization=0.9, "
                          "quantization=fp8, enable-expert-parallel, max-model-len=8192 ...")(f)
    return f


def sampling_options(f: F) -> F:
    """`--temperature`, `--top-p`, `--seed` of evaluate and serve-bench: acceptance at the production
    sampler, beside the greedy figures (parameters `temperature`, `top_p`, `seed`; `sampling_of`)."""
    f = click.option("--seed", default=0, show_default=True, type=int,
                     help="Base seed of the sampled run: each prompt gets its own seed from it "
                          "(serving.client.request_seed), so two runs with one seed are equal.")(f)
    f = click.option("--top-p", "top_p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True),
                     help="Nucleus sampling of the sampled run (Kimi-K2.5 is served at 0.95).")(f)
    f = click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0),
                     help="> 0: also decode each prompt sampled at this temperature and report its acceptance "
                          "beside the greedy one (Kimi-K2.5 is served at 1.0); 0: greedy only.")(f)
    return f


def suite_format_option(fn: F) -> F:
    """`--suite-format` of the commands that read `--prompts` as a prompt suite (eagle/prompts.py)."""
    from eagle.prompts import SUITE_FORMATS

    return click.option("--suite-format", type=click.Choice(list(SUITE_FORMATS)), default="auto", show_default=True,
                        help="The --prompts file's format: chat (messages / conversations / prompt), mt-bench "
                             "(FastChat question.jsonl), speed-bench (NVIDIA SPEED-Bench, JSONL or Parquet), gsm8k, "
                             "humaneval (JSONL or .jsonl.gz); auto tells it from the first record. Acceptance is "
                             "reported per suite and per category.")(fn)


def sampling_of(temperature: float, top_p: float, seed: int) -> Sampling | None:
    """The sampler the flags ask for; None at temperature 0 (greedy only, as without the flags)."""
    return Sampling(temperature=temperature, top_p=top_p, seed=seed) if temperature > 0 else None


# ---------------------------------------------------------------- errors and the ending


@contextlib.contextmanager
def refusals(*also: type[BaseException], interrupted: str | None = None) -> Iterator[None]:
    """Turn an EagleError (and the exception types in `also`) raised in the block into
    `error: message` on stderr and the error's exit code: no traceback reaches the user.
    With `interrupted`, Ctrl-C ends as `error: <interrupted>` and exit 130 (say what was left)."""
    caught: tuple[type[BaseException], ...] = (EagleError, *also)
    try:
        yield
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        fail(interrupted, code=130)
    except caught as exc:
        fail(exc)


def to_json(result: BaseModel | dict[str, Any]) -> str:
    """A result as the JSON `--json` prints: a model's fields in order, a dict's keys sorted."""
    if isinstance(result, BaseModel):
        return result.model_dump_json(indent=1)
    return json.dumps(result, indent=1, sort_keys=True)


def finish(result: BaseModel | dict[str, Any], as_json: bool, *, metrics: dict[str, float] | None = None,
           table: dict[str, Any] | None = None, show: Callable[[], None] | None = None) -> None:
    """The ending every eagle command shares: `metrics` merged into $RUNBOOK_METRICS (when given),
    then `result` as JSON (`as_json`), else the human view: `table` as name/value rows and/or `show()`."""
    if metrics is not None:
        write_metrics(metrics)
    if as_json:
        click.echo(to_json(result))
        return
    if table is not None:
        print_kv(table)
    if show is not None:
        show()
