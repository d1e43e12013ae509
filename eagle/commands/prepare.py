"""`eagle prepare`: conversations -> token ids + loss mask (eagle/data/prepare.py does the work). The
verb's options, its refusals and its table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from eagle.commands._options import device_option, dtype_option, finish, json_option, refusals, vllm_options
from eagle.common import EagleError, fail, quiet_hf
from eagle.data.prepare import cut_message, prepare, prepare_metrics
from eagle.data.turns import CHECKED_FIELDS, HISTORY_MODES
from eagle.serving.client import Sampling
from eagle.serving.flags import vllm_flags


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", type=click.Path(path_type=Path), required=True, help="Target model dir (its tokenizer and chat template).")
@click.option("--data", type=click.Path(path_type=Path), required=True, help="JSONL of conversations (OpenAI messages or ShareGPT conversations): a file, or a pipe with a writer (`--data <(zcat d.jsonl.gz)`).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output dir (datasets.save_to_disk).")
@click.option("--limit", type=int, default=None, help="Use only the first N good records.")
@click.option("--regenerate", is_flag=True, help="Answer every user turn with the target itself (on-policy data).")
@click.option("--backend", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True,
              help="With --regenerate: transformers generate (small targets) or vLLM's server (production).")
@click.option("--max-new-tokens", default=256, show_default=True, help="With --regenerate: longest answer.")
@click.option("--temperature", default=0.0, show_default=True, type=float, help="With --regenerate: 0 is greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=float, help="With --regenerate: nucleus sampling.")
@click.option("--top-k", default=-1, show_default=True, type=int, help="With --regenerate: -1 is off.")
@click.option("--n", "n", default=1, show_default=True, type=click.IntRange(1),
              help="With --regenerate: samples per conversation (needs --temperature > 0).")
@click.option("--seed", default=0, show_default=True, type=int, help="With --regenerate: base sampling seed.")
@click.option("--batch-size", default=16, show_default=True, help="--backend hf: prompts per generate call.")
@click.option("--vllm-concurrency", default=64, show_default=True, type=click.IntRange(1),
              help="--backend vllm: requests in flight (vLLM batches them).")
@click.option("--enable-thinking/--disable-thinking", "enable_thinking", default=None,
              help="Chat template variable enable_thinking (Qwen3-style templates) [default: the template's].")
@click.option("--chat-template-kwargs", default=None, metavar="JSON",
              help="Other chat template variables as a JSON object, e.g. '{\"reasoning_effort\": \"high\"}'.")
@click.option("--history-reasoning", type=click.Choice(list(HISTORY_MODES)), default="template", show_default=True,
              help="Earlier answers in later contexts: template = as the target's chat template renders them (what "
                   "a server with it sends: Qwen3-style drops their thinking, Kimi-K2.5-style renders "
                   "<think></think>answer); keep = as produced; drop = reasoning block removed; empty = "
                   "<think></think>answer. Where a later context rewrites an earlier answer, the conversation is "
                   "split: each answer is trained in the context it was written in.")
@click.option("--reasoning-tags", default="<think>,</think>", show_default=True,
              help="OPEN,CLOSE tokens of a reasoning block (--history-reasoning drop and empty; template uses them "
                   "to move regenerated reasoning into reasoning_content).")
@click.option("--accept-lost-field", "accept_lost_fields", multiple=True, type=click.Choice(list(CHECKED_FIELDS)),
              help="Prepare recorded answers whose FIELD the chat template does not render (it renders the turn the "
                   "same without it) instead of refusing; such records are counted as changed. Repeatable.")
@vllm_options
@click.option("--on-bad-record", type=click.Choice(["skip", "fail"]), default="skip", show_default=True,
              help="Bad records are always reported by line number; skip them or fail the run.")
@click.option("--max-len", default=2048, show_default=True, help="Truncate samples to this many tokens.")
@device_option("--backend hf: auto, cpu or cuda.")
@dtype_option()
@click.option("--startup-timeout", default=600.0, show_default=True, help="--backend vllm: seconds to wait for the server.")
@click.option("--vllm-url", default=None, metavar="URL",
              help="--backend vllm: a vLLM server already serving this target (e.g. http://host:8000) instead of "
                   "starting one; its own engine flags apply.")
@json_option("Print prepared.json instead of a table.")
def command(model: Path, data: Path, out: Path, limit: int | None, regenerate: bool, backend: str, max_new_tokens: int,
            temperature: float, top_p: float, top_k: int, n: int, seed: int, batch_size: int, vllm_concurrency: int,
            enable_thinking: bool | None, chat_template_kwargs: str | None, history_reasoning: str,
            reasoning_tags: str, accept_lost_fields: tuple[str, ...], vllm_args: tuple[str, ...], trust_remote_code: bool, eager: bool | None,
            on_bad_record: str, max_len: int, device: str, dtype: str, startup_timeout: float, vllm_url: str | None,
            as_json: bool) -> None:
    """Turn conversations into token ids and an assistant-only loss mask.

    \b
    eagle prepare --model work/target --data plans/data/prompts.jsonl --out work/data --regenerate
    eagle prepare --model /models/big --data chats.jsonl --out data --regenerate --backend vllm \\
        --trust-remote-code --vllm-arg tensor-parallel-size=8 --temperature 0.7 --n 2 --max-new-tokens 4096
    eagle prepare --model work/target --data chats.jsonl --out work/data --on-bad-record fail

    Records are OpenAI {"messages": [{"role", "content"}], "tools": [...]} or ShareGPT
    {"conversations": [{"from", "value"}]}. Without --regenerate every record needs an assistant
    turn; with it, prompt-only records are fine and every user turn is answered by the target.
    Samples are built in token space: the target's answers are kept as the exact token ids it
    produced (reasoning blocks, tool calls and special tokens included, no decode / re-encode), a
    multi-turn conversation is one sample (split where a later context rewrites an earlier
    answer, --history-reasoning), and an answer cut at --max-new-tokens is kept as cut (no
    end-of-turn token it never produced). Every record skipped, changed or cut is counted by
    reason in the table, --json (prepared.json) and metrics; cuts as a share, with the limit
    that keeps 99% whole. Recorded answers whose reasoning_content or tool_calls the chat template
    does not render are refused unless --accept-lost-field names the field.
    The output is speculators' offline format (input_ids, loss_mask, seq_len); `eagle extract`
    adds the hidden states to it.
    """
    quiet_hf()
    if limit is not None and limit < 1:
        fail("--limit must be at least 1")
    with refusals(interrupted="interrupted; nothing written"):
        kwargs = _template_kwargs(chat_template_kwargs, enable_thinking)
        flags = vllm_flags(vllm_args, trust_remote_code, eager)
        if (backend != "vllm" or not regenerate) and (vllm_args or eager is not None):
            raise EagleError("--vllm-arg, --enforce-eager and --compile apply to --regenerate --backend vllm only")
        info = prepare(model, data, out, limit=limit, regenerate=regenerate, max_new_tokens=max_new_tokens,
                       on_bad_record=on_bad_record, max_len=max_len, batch_size=batch_size, device=device,
                       dtype=dtype, backend=backend, n=n, concurrency=vllm_concurrency, vllm_flags=flags,
                       sampling=Sampling(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed),
                       template_kwargs=kwargs, history_reasoning=history_reasoning, reasoning_tags_spec=reasoning_tags,
                       accept_lost_fields=accept_lost_fields, startup_timeout=startup_timeout, vllm_url=vllm_url)
    finish(info, as_json, metrics=prepare_metrics(info), table={
        "out": str(out),
        "records read": info.records,
        "skipped (bad)": info.skipped,
        **{f"  skipped: {why}": n for why, n in info.skipped_reasons.items()},
        "changed": info.changed,
        **{f"  changed: {why}": n for why, n in info.changed_reasons.items()},
        "samples": info.samples,
        "tokens": info.tokens,
        "loss tokens": info.loss_tokens,
        "mean length": round(info.tokens / max(1, info.samples), 1),
        "history reasoning": info.history_reasoning,
        "cut at --max-len": cut_message("samples", "--max-len", max_len, info.cut_at_max_len, info.cut_share,
                                        info.max_len_keep_99) if info.cut_at_max_len else 0,
        "regenerated": f"yes ({info.backend})" if info.regenerated else "no",
        **({"answers cut at --max-new-tokens": cut_message(
            "answers", "--max-new-tokens", max_new_tokens, info.answers_cut, info.answers_cut_share,
            info.max_new_tokens_keep_99) if info.answers_cut else 0} if info.regenerated else {}),
    })


def _template_kwargs(spec: str | None, enable_thinking: bool | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if spec:
        try:
            kwargs = json.loads(spec)
        except json.JSONDecodeError as e:
            raise EagleError(f"--chat-template-kwargs is not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(kwargs, dict):
            raise EagleError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    return kwargs
