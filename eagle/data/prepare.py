"""`eagle prepare`: conversations -> token ids + assistant-only loss mask (speculators' format).

Input: JSONL, one conversation per line, either OpenAI style
    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}],
     "tools": [...]}                                   (tools optional, given to the chat template)
or ShareGPT style
    {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}
Output: a datasets.save_to_disk dir with columns input_ids, loss_mask, seq_len; plus prepared.json.

Samples are built in token space by eagle/data/turns.py: the chat template renders the other turns and
the glue, assistant turns go in as token ids. With --regenerate (eagle/data/regenerate.py, backends hf
and vllm) those ids are exactly what the target produced; without, they are the template's
rendering of the recorded answer. loss_mask is 1 on the assistant's tokens (each turn's own
end-of-turn token included, when it has one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from eagle.command import device_option, dtype_option, finish, json_option, refusals
from eagle.common import EagleError, fail, pick_device, pick_dtype, quiet_hf, warn
from eagle.data.hidden_io import PREPARE_FILE, PrepareInfo
from eagle.data.regenerate import RegenSettings, check_settings
from eagle.data.regenerate import regenerate as regenerate_samples
from eagle.data.turns import ReasoningTags, Sample, Template, TurnError, recorded_sample
from eagle.fsutil import atomic_dir, atomic_write_text
from eagle.serving.server import Sampling, VllmFlags, vllm_flags, vllm_options

ROLE_NAMES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bot": "assistant",
    "model": "assistant",
    "tool": "tool",
}
PASSED_THROUGH = ("tool_calls", "reasoning_content", "name", "tool_call_id")  # kept for the chat template
MAX_REPORTED = 20


class RecordError(ValueError):
    """One input record is unusable; the message says why."""


@dataclass
class Record:
    line: int
    fmt: str  # "messages" | "conversations"
    messages: list[dict[str, Any]]
    tools: list[Any] | None = None


# ---------------------------------------------------------------- parsing (pure)


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)
    raise RecordError(f"{where}: content must be a string (or a list of text parts), got {type(value).__name__}")


def parse_record(obj: Any) -> tuple[str, list[dict[str, Any]]]:
    """A decoded JSON record -> (format, [{'role', 'content'}]) with roles normalised.

    Raises RecordError for anything unusable: not an object, neither `messages` nor
    `conversations`, unknown role, non-text content, no user turn.
    """
    if not isinstance(obj, dict):
        raise RecordError(f"expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        fmt, turns, role_key, text_key = "messages", obj["messages"], "role", "content"
    elif "conversations" in obj:
        fmt, turns, role_key, text_key = "conversations", obj["conversations"], "from", "value"
    else:
        raise RecordError("no 'messages' (OpenAI) or 'conversations' (ShareGPT) field")
    if not isinstance(turns, list) or not turns:
        raise RecordError(f"'{fmt}' must be a non-empty list")
    out: list[dict[str, Any]] = []
    for k, turn in enumerate(turns):
        where = f"{fmt}[{k}]"
        if not isinstance(turn, dict):
            raise RecordError(f"{where}: expected an object, got {type(turn).__name__}")
        if role_key not in turn:
            raise RecordError(f"{where}: missing '{role_key}'")
        raw_role = str(turn[role_key]).lower()
        if raw_role not in ROLE_NAMES:
            raise RecordError(f"{where}: unknown role {turn[role_key]!r} (known: {', '.join(sorted(ROLE_NAMES))})")
        if text_key not in turn and not turn.get("tool_calls"):
            raise RecordError(f"{where}: missing '{text_key}'")
        value = turn.get(text_key)
        msg: dict[str, Any] = {"role": ROLE_NAMES[raw_role],
                               "content": "" if value is None and turn.get("tool_calls") else _content(value, where)}
        msg.update({k: turn[k] for k in PASSED_THROUGH if turn.get(k) is not None})
        out.append(msg)
    if not any(m["role"] == "user" for m in out):
        raise RecordError("no user turn")
    return fmt, out


def read_records(path: Path) -> tuple[list[Record], list[tuple[int, str]]]:
    """All records of a JSONL file: (good records, [(line, reason)] for bad ones). Blank lines are skipped."""
    good: list[Record] = []
    bad: list[tuple[int, str]] = []
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad.append((n, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"))
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                bad.append((n, f"invalid JSON ({e.msg} at column {e.colno})"))
                continue
            try:
                fmt, msgs = parse_record(obj)
            except RecordError as e:
                bad.append((n, str(e)))
                continue
            tools = obj.get("tools")
            if tools is not None and not isinstance(tools, list):
                bad.append((n, "'tools' must be a list of tool definitions"))
                continue
            good.append(Record(n, fmt, msgs, tools))
    return good, bad


def answer_points(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split a conversation into the turns that precede each answer --regenerate must give.

    Every assistant turn that follows a user turn becomes an answer point (its text is dropped),
    and so does the end of a conversation whose last turn is a user's. Returns the non-assistant
    turns before each point, in order; assistant turns with no user turn before them are dropped.
    """
    parts: list[list[dict[str, Any]]] = []
    cur: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant":
            if any(x["role"] == "user" for x in cur):
                parts.append(cur)
                cur = []
            continue
        cur.append(m)
    if any(x["role"] == "user" for x in cur):
        parts.append(cur)
    return parts


# ---------------------------------------------------------------- tokenising with the template


def render_ids(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, Any]],
                          template_kwargs: dict[str, Any] | None = None) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of a recorded conversation: mask 1 exactly on the assistant turns' tokens."""
    try:
        sample = recorded_sample(Template(tokenizer, template_kwargs), messages)
    except TurnError as e:
        raise RecordError(str(e)) from None
    return sample.ids, sample.mask


def load_model(model: Path, device_name: str = "auto", dtype_name: str = "auto",
               trust_remote_code: bool = False) -> Any:
    """The target model at a local directory, on the chosen device/dtype, in eval mode (eagle/target.py:
    causal LMs and multimodal wrappers, custom code only with trust_remote_code, big ones spread over GPUs)."""
    from eagle.target import open_target

    device = pick_device(device_name)
    return open_target(model, trust_remote_code).load_model(device, pick_dtype(dtype_name, device))


def load_tokenizer(model: Path, trust_remote_code: bool = False) -> Any:
    """The target's tokenizer; it must have a chat template (prepare builds loss masks with it)."""
    from eagle import target

    return target.load_tokenizer(model, trust_remote_code, need_chat_template=True)


def reasoning_tags(tokenizer: Any, tags: str) -> ReasoningTags:
    """`--reasoning-tags OPEN,CLOSE` -> their token ids (each must be one token of the vocabulary)."""
    parts = [t.strip() for t in tags.split(",")]
    if len(parts) != 2 or not all(parts):
        raise EagleError(f"--reasoning-tags {tags!r}: expected OPEN,CLOSE like '<think>,</think>'")
    ids = []
    for tag in parts:
        enc = tokenizer(tag, add_special_tokens=False)["input_ids"]
        if len(enc) != 1:
            raise EagleError(f"--history-reasoning drop: {tag!r} is not a single token of this tokenizer "
                             f"({len(enc)} tokens); give the model's own tags with --reasoning-tags")
        ids.append(int(enc[0]))
    blank = frozenset(i for t, i in tokenizer.get_vocab().items() if tokenizer.convert_tokens_to_string([t]).strip() == ""
                      and i not in tokenizer.all_special_ids)
    return ReasoningTags(open_id=ids[0], close_id=ids[1], blank_ids=blank)


# ---------------------------------------------------------------- writing the dataset


def _same_dataset(out: Path, rows: dict[str, list[Any]]) -> bool:
    try:
        from datasets import load_from_disk

        old = load_from_disk(str(out)).with_format(None)
        return old["input_ids"] == rows["input_ids"] and old["loss_mask"] == rows["loss_mask"]
    except Exception:  # anything unreadable is simply "not the same"
        return False


def write_dataset(out: Path, rows: dict[str, list[Any]], info: PrepareInfo) -> str:
    """Write atomically; returns 'written', 'replaced' or 'unchanged'.

    An existing prepared dir with identical rows is kept (with its hidden states and vocab); a
    different one is replaced as a whole (its hidden states would no longer match).
    """
    from datasets import Dataset

    if out.exists() and any(out.iterdir()):
        if not (out / PREPARE_FILE).is_file():
            raise EagleError(f"{out} exists, is not empty and was not made by `eagle prepare`; choose another --out")
        if _same_dataset(out, rows):
            atomic_write_text(out / PREPARE_FILE, info.model_dump_json(indent=1) + "\n")
            return "unchanged"
    status = "replaced" if out.exists() else "written"
    with atomic_dir(out) as tmp:
        ds = Dataset.from_dict(rows)
        ds.set_format("torch")
        ds.save_to_disk(str(tmp))
        (tmp / PREPARE_FILE).write_text(info.model_dump_json(indent=1) + "\n")
    return status


def build_samples(model: Path, tok: Any, records: list[Record], regenerate: bool, template_kwargs: dict[str, Any],
                  reasoning: ReasoningTags | None, settings: RegenSettings, flags: VllmFlags | None,
                  echo: bool) -> tuple[list[tuple[Record, Sample]], list[tuple[int, str]]]:
    """One Sample per record (n per record with --regenerate --n), answered; and the records that failed."""
    base = Template(tok, template_kwargs)
    built: list[tuple[Record, Sample]] = []
    bad: list[tuple[int, str]] = []
    for rec in records:
        tpl = base.with_tools(rec.tools)
        try:
            if regenerate:
                points = answer_points(rec.messages)
                built += [(rec, Sample(tpl, points, reasoning)) for _ in range(settings.n)]
            else:
                built.append((rec, recorded_sample(tpl, rec.messages, reasoning)))
        except TurnError as e:
            bad.append((rec.line, str(e)))
        except Exception as e:  # noqa: BLE001 - the template itself raised (e.g. raise_exception on a role)
            bad.append((rec.line, f"chat template failed: {e}"))
    if regenerate:
        failed = regenerate_samples(model, tok, [s for _, s in built], settings, flags, echo)
        bad += [(built[i][0].line, why) for i, why in failed.items()]
        built = [b for i, b in enumerate(built) if i not in failed]
    return built, bad


def prepare(model: Path, data: Path, out: Path, limit: int | None = None, regenerate: bool = False,
            max_new_tokens: int = 256, on_bad_record: str = "skip", max_len: int = 2048,
            batch_size: int = 16, device: str = "auto", dtype: str = "auto", echo: bool = True, *,
            backend: str = "hf", sampling: Sampling | None = None, n: int = 1, concurrency: int = 64,
            vllm_flags: VllmFlags | None = None, template_kwargs: dict[str, Any] | None = None,
            history_reasoning: str = "keep", reasoning_tags_spec: str = "<think>,</think>",
            startup_timeout: float = 600.0, vllm_url: str | None = None) -> PrepareInfo:
    """The work of `eagle prepare` (importable); raises EagleError on bad input."""
    if not Path(data).is_file():
        raise EagleError(f"--data {data}: no such file")
    if not Path(model).is_dir():
        raise EagleError(f"--model {model}: no such directory")
    if history_reasoning not in ("keep", "drop"):
        raise EagleError(f"--history-reasoning {history_reasoning!r}: use keep or drop")
    settings = RegenSettings(backend=backend, max_new_tokens=max_new_tokens, sampling=sampling or Sampling(), n=n,
                             max_len=max_len, batch_size=batch_size, concurrency=concurrency, device=device,
                             dtype=dtype, startup_timeout=startup_timeout, vllm_url=vllm_url)
    if regenerate:
        check_settings(settings)
    good, bad = read_records(Path(data))
    if bad and on_bad_record == "fail":
        raise EagleError(_bad_report(data, bad) + f"\n{len(bad)} bad record(s); nothing written (--on-bad-record fail)")
    if limit is not None:
        good = good[:limit]
    trust = vllm_flags.trusts_remote_code if vllm_flags else False
    tok = load_tokenizer(model, trust_remote_code=trust)
    reasoning = reasoning_tags(tok, reasoning_tags_spec) if history_reasoning == "drop" else None
    built, late_bad = build_samples(model, tok, good, regenerate, template_kwargs or {}, reasoning, settings,
                                    vllm_flags, echo)
    rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    truncated = cut = 0
    for rec, sample in built:
        ids, mask = sample.ids[:max_len], sample.mask[:max_len]
        if not any(mask):
            late_bad.append((rec.line, f"no assistant tokens within the first {max_len} tokens (--max-len)"))
            continue
        rows["input_ids"].append(ids)
        rows["loss_mask"].append(mask)
        rows["seq_len"].append(len(ids))
        truncated += sample.truncated
        cut += sample.cut or len(sample.ids) > max_len
    all_bad = sorted(bad + late_bad)
    if late_bad and on_bad_record == "fail":
        raise EagleError(_bad_report(data, sorted(late_bad)) + f"\n{len(late_bad)} bad record(s); nothing written")
    if all_bad and echo:
        warn(_bad_report(data, all_bad) + f"\nskipped {len(all_bad)} bad record(s)")
    if not rows["input_ids"]:
        raise EagleError(f"no usable records in {data}; nothing written")
    fmt_counts: dict[str, int] = {}
    for r in good:
        fmt_counts[r.fmt] = fmt_counts.get(r.fmt, 0) + 1
    info = PrepareInfo(
        model=str(model), source=str(data), fmt_counts=fmt_counts, records=len(good) + len(bad),
        skipped=len({line for line, _ in all_bad}), samples=len(rows["input_ids"]), tokens=sum(rows["seq_len"]),
        loss_tokens=sum(sum(m) for m in rows["loss_mask"]), regenerated=regenerate,
        max_new_tokens=max_new_tokens if regenerate else None,
        backend=backend if regenerate else None, sampling=settings.sampling.model_dump() if regenerate else None,
        n=n if regenerate else 1, truncated=truncated, cut_at_max_len=cut, history_reasoning=history_reasoning,
        template_kwargs=template_kwargs or {},
    )
    status = write_dataset(Path(out), rows, info)
    if echo and status == "replaced":
        warn(f"replaced the existing prepared data at {out} (its hidden states and vocab were removed: re-run extract)")
    if echo and truncated:
        warn(f"{truncated} sample(s) hold an answer cut at --max-new-tokens {max_new_tokens} (kept as generated, "
             "without an end-of-turn token; raise --max-new-tokens to get whole answers)")
    return info


def _bad_report(path: Path, bad: list[tuple[int, str]]) -> str:
    lines = [f"{path}:{n}: {why}" for n, why in bad[:MAX_REPORTED]]
    if len(bad) > MAX_REPORTED:
        lines.append(f"... and {len(bad) - MAX_REPORTED} more")
    return "\n".join(lines)


# ---------------------------------------------------------------- CLI


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", type=click.Path(path_type=Path), required=True, help="Target model dir (its tokenizer and chat template).")
@click.option("--data", type=click.Path(path_type=Path), required=True, help="JSONL of conversations (OpenAI messages or ShareGPT conversations).")
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
@click.option("--history-reasoning", type=click.Choice(["keep", "drop"]), default="keep", show_default=True,
              help="An earlier answer's reasoning block in later contexts: kept as produced, or dropped as "
                   "Qwen3-style servers do (that answer then gets loss mask 0).")
@click.option("--reasoning-tags", default="<think>,</think>", show_default=True,
              help="OPEN,CLOSE tokens of a reasoning block (for --history-reasoning drop).")
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
            reasoning_tags: str, vllm_args: tuple[str, ...], trust_remote_code: bool, eager: bool | None,
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
    multi-turn conversation is one sample, and an answer cut at --max-new-tokens is kept as cut
    (no end-of-turn token it never produced; counted in prepared.json's `truncated`).
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
                       startup_timeout=startup_timeout, vllm_url=vllm_url)
    finish(info, as_json, table={
        "out": str(out),
        "records read": info.records,
        "skipped (bad)": info.skipped,
        "samples": info.samples,
        "tokens": info.tokens,
        "loss tokens": info.loss_tokens,
        "mean length": round(info.tokens / max(1, info.samples), 1),
        "regenerated": f"yes ({info.backend})" if info.regenerated else "no",
        **({"truncated answers": info.truncated} if info.regenerated else {}),
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
