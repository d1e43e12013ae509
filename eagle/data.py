"""`eagle prepare`: conversations -> token ids + assistant-only loss mask (speculators' format).

Input: JSONL, one conversation per line, either OpenAI style
    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
or ShareGPT style
    {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}
Output: a datasets.save_to_disk dir with columns input_ids, loss_mask (1 on assistant tokens,
including each assistant turn's end-of-turn token), seq_len; plus prepared.json.

The mask comes from the target's own chat template: for assistant turn j, the tokens between
render(messages[:j], add_generation_prompt=True) and render(messages[:j+1]) are the assistant's.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from eagle.common import EagleError, fail, pick_device, pick_dtype, print_kv, progress, quiet_hf, warn
from eagle.hidden_io import PREPARE_FILE, PrepareInfo

ROLE_NAMES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bot": "assistant",
    "model": "assistant",
}
MAX_REPORTED = 20


class RecordError(ValueError):
    """One input record is unusable; the message says why."""


@dataclass
class Record:
    line: int
    fmt: str  # "messages" | "conversations"
    messages: list[dict[str, str]]


# ---------------------------------------------------------------- parsing (pure)


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)
    raise RecordError(f"{where}: content must be a string (or a list of text parts), got {type(value).__name__}")


def parse_record(obj: Any) -> tuple[str, list[dict[str, str]]]:
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
    out: list[dict[str, str]] = []
    for k, turn in enumerate(turns):
        where = f"{fmt}[{k}]"
        if not isinstance(turn, dict):
            raise RecordError(f"{where}: expected an object, got {type(turn).__name__}")
        if role_key not in turn:
            raise RecordError(f"{where}: missing '{role_key}'")
        raw_role = str(turn[role_key]).lower()
        if raw_role not in ROLE_NAMES:
            raise RecordError(f"{where}: unknown role {turn[role_key]!r} (known: {', '.join(sorted(ROLE_NAMES))})")
        if text_key not in turn:
            raise RecordError(f"{where}: missing '{text_key}'")
        out.append({"role": ROLE_NAMES[raw_role], "content": _content(turn[text_key], where)})
    if not any(m["role"] == "user" for m in out):
        raise RecordError("no user turn")
    return fmt, out


def read_records(path: Path) -> tuple[list[Record], list[tuple[int, str]]]:
    """All records of a JSONL file: (good records, [(line, reason)] for bad ones). Blank lines are skipped."""
    good: list[Record] = []
    bad: list[tuple[int, str]] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
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
            good.append(Record(n, fmt, msgs))
    return good, bad


def answer_points(messages: list[dict[str, str]]) -> list[list[dict[str, str]]]:
    """Split a conversation into the turns that precede each answer --regenerate must give.

    Every assistant turn that follows a user turn becomes an answer point (its text is dropped),
    and so does the end of a conversation whose last turn is a user's. Returns the non-assistant
    turns before each point, in order; assistant turns with no user turn before them are dropped.
    """
    parts: list[list[dict[str, str]]] = []
    cur: list[dict[str, str]] = []
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


def render_ids(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask): mask is 1 exactly on the tokens each assistant turn adds."""
    if not any(m["role"] == "assistant" for m in messages):
        raise RecordError("no assistant turn (pass --regenerate to fill responses from the target)")
    ids = render_ids(tokenizer, messages)
    mask = [0] * len(ids)
    for j, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = render_ids(tokenizer, messages[:j], add_generation_prompt=True) if j else []
        upto = render_ids(tokenizer, messages[: j + 1])
        if ids[: len(upto)] != upto or upto[: len(head)] != head:
            raise RecordError(
                f"the chat template does not render assistant turn {j} as an extension of the turns before it; "
                "cannot derive an assistant-only loss mask"
            )
        for t in range(len(head), len(upto)):
            mask[t] = 1
    return ids, mask


# ---------------------------------------------------------------- regeneration


def load_model(model: Path, device_name: str = "auto", dtype_name: str = "auto") -> Any:
    """The causal LM at a local directory, on the chosen device/dtype, in eval mode."""
    from transformers import AutoModelForCausalLM

    device = pick_device(device_name)
    dtype = pick_dtype(dtype_name, device)
    try:
        m = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
    except (OSError, ValueError) as e:
        raise EagleError(f"cannot load the target model at {model}: {e}") from None
    return m.to(device).eval()


def load_tokenizer(model: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model))
    except (OSError, ValueError) as e:
        raise EagleError(f"cannot load a tokenizer from {model}: {e}") from None
    if not getattr(tok, "chat_template", None):
        raise EagleError(f"the tokenizer at {model} has no chat template; prepare needs one to build loss masks")
    return tok


def greedy_responses(model: Any, tokenizer: Any, prompts: list[list[dict[str, str]]], max_new_tokens: int,
                     batch_size: int, desc: str = "generate") -> list[str]:
    """The target's greedy answer to each conversation prefix (batched, left-padded, sorted by length)."""
    import torch

    enc = [render_ids(tokenizer, p, add_generation_prompt=True) for p in prompts]
    order = sorted(range(len(enc)), key=lambda i: len(enc[i]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    out: list[str] = [""] * len(enc)
    dev = next(model.parameters()).device
    bar = progress(total=len(enc), desc=desc, unit="prompt")
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        width = max(len(enc[i]) for i in idx)
        x = torch.full((len(idx), width), pad, dtype=torch.long)
        att = torch.zeros_like(x)
        for r, i in enumerate(idx):
            x[r, width - len(enc[i]):] = torch.tensor(enc[i])
            att[r, width - len(enc[i]):] = 1
        gen = model.generate(input_ids=x.to(dev), attention_mask=att.to(dev), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=pad, eos_token_id=eos)
        for r, i in enumerate(idx):
            new = gen[r, width:].tolist()
            if eos in new:
                new = new[: new.index(eos)]
            out[i] = tokenizer.decode(new, skip_special_tokens=True).strip()
        bar.update(len(idx))
    bar.close()
    return out


def regenerate_turns(model: Any, tokenizer: Any, convs: list[list[dict[str, str]]], max_new_tokens: int,
                     batch_size: int) -> list[list[dict[str, str]]]:
    """Replace every assistant turn with the target's greedy answer, turn by turn (batched per round).

    Round r answers the r-th answer point of every conversation that has one, with the answers of
    the earlier rounds in its context.
    """
    parts = [answer_points(c) for c in convs]
    done: list[list[dict[str, str]]] = [[] for _ in convs]
    for rnd in range(max((len(p) for p in parts), default=0)):
        pending = [i for i, p in enumerate(parts) if len(p) > rnd]
        for i in pending:
            done[i].extend(parts[i][rnd])
        answers = greedy_responses(model, tokenizer, [done[i] for i in pending], max_new_tokens, batch_size,
                                   desc=f"generate (turn {rnd + 1})")
        for i, a in zip(pending, answers, strict=True):
            done[i].append({"role": "assistant", "content": a})
    return done


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
            (out / PREPARE_FILE).write_text(info.model_dump_json(indent=1) + "\n")
            return "unchanged"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    ds = Dataset.from_dict(rows)
    ds.set_format("torch")
    ds.save_to_disk(str(tmp))
    (tmp / PREPARE_FILE).write_text(info.model_dump_json(indent=1) + "\n")
    status = "written"
    if out.exists():
        old = out.with_name(f".old-{out.name}-{os.getpid()}")
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
        status = "replaced"
    else:
        os.rename(tmp, out)
    return status


def prepare(model: Path, data: Path, out: Path, limit: int | None = None, regenerate: bool = False,
            max_new_tokens: int = 256, on_bad_record: str = "skip", max_len: int = 2048,
            batch_size: int = 16, device: str = "auto", dtype: str = "auto", echo: bool = True) -> PrepareInfo:
    """The work of `eagle prepare` (importable); raises EagleError on bad input."""
    if not Path(data).is_file():
        raise EagleError(f"--data {data}: no such file")
    if not Path(model).is_dir():
        raise EagleError(f"--model {model}: no such directory")
    good, bad = read_records(Path(data))
    if bad and on_bad_record == "fail":
        raise EagleError(_bad_report(data, bad) + f"\n{len(bad)} bad record(s); nothing written (--on-bad-record fail)")
    if limit is not None:
        good = good[:limit]
    if regenerate:
        target, tok = load_model(model, device, dtype), load_tokenizer(model)
        convs = regenerate_turns(target, tok, [r.messages for r in good], max_new_tokens, batch_size)
    else:
        tok = load_tokenizer(model)
        convs = [r.messages for r in good]
    rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    late_bad: list[tuple[int, str]] = []
    for rec, conv in zip(good, convs, strict=True):
        try:
            ids, mask = tokenize_conversation(tok, conv)
        except RecordError as e:
            late_bad.append((rec.line, str(e)))
            continue
        except Exception as e:  # the template itself raised (e.g. raise_exception on a role)
            late_bad.append((rec.line, f"chat template failed: {e}"))
            continue
        ids, mask = ids[:max_len], mask[:max_len]
        if not any(mask):
            late_bad.append((rec.line, f"no assistant tokens within the first {max_len} tokens (--max-len)"))
            continue
        rows["input_ids"].append(ids)
        rows["loss_mask"].append(mask)
        rows["seq_len"].append(len(ids))
    all_bad = sorted(bad + late_bad)
    if late_bad and on_bad_record == "fail":
        raise EagleError(_bad_report(data, late_bad) + f"\n{len(late_bad)} bad record(s); nothing written")
    if all_bad and echo:
        warn(_bad_report(data, all_bad) + f"\nskipped {len(all_bad)} bad record(s)")
    if not rows["input_ids"]:
        raise EagleError(f"no usable records in {data}; nothing written")
    fmt_counts: dict[str, int] = {}
    for r in good:
        fmt_counts[r.fmt] = fmt_counts.get(r.fmt, 0) + 1
    info = PrepareInfo(
        model=str(model), source=str(data), fmt_counts=fmt_counts, records=len(good) + len(bad),
        skipped=len(all_bad), samples=len(rows["input_ids"]), tokens=sum(rows["seq_len"]),
        loss_tokens=sum(sum(m) for m in rows["loss_mask"]), regenerated=regenerate,
        max_new_tokens=max_new_tokens if regenerate else None,
    )
    status = write_dataset(Path(out), rows, info)
    if echo and status == "replaced":
        warn(f"replaced the existing prepared data at {out} (its hidden states and vocab were removed: re-run extract)")
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
@click.option("--regenerate", is_flag=True, help="Answer every user turn with the target's own greedy response (on-policy data).")
@click.option("--max-new-tokens", default=256, show_default=True, help="With --regenerate: longest response.")
@click.option("--batch-size", default=16, show_default=True, help="With --regenerate: prompts per generate call.")
@click.option("--on-bad-record", type=click.Choice(["skip", "fail"]), default="skip", show_default=True,
              help="Bad records are always reported by line number; skip them or fail the run.")
@click.option("--max-len", default=2048, show_default=True, help="Truncate samples to this many tokens.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda (for --regenerate).")
@click.option("--dtype", default="auto", show_default=True, help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16.")
@click.option("--json", "as_json", is_flag=True, help="Print prepared.json instead of a table.")
def command(model: Path, data: Path, out: Path, limit: int | None, regenerate: bool, max_new_tokens: int,
            batch_size: int, on_bad_record: str, max_len: int, device: str, dtype: str, as_json: bool) -> None:
    """Turn conversations into token ids and an assistant-only loss mask.

    \b
    eagle prepare --model work/target --data plans/data/prompts.jsonl --out work/data --regenerate
    eagle prepare --model work/target --data chats.jsonl --out work/data --on-bad-record fail

    Records are OpenAI {"messages": [{"role", "content"}]} or ShareGPT {"conversations":
    [{"from", "value"}]}. Without --regenerate every record needs an assistant turn; with it,
    prompt-only records are fine and existing assistant turns are replaced by the target's
    greedy answers. The output is speculators' offline format (input_ids, loss_mask, seq_len);
    `eagle extract` adds the hidden states to it.
    """
    quiet_hf()
    if limit is not None and limit < 1:
        fail("--limit must be at least 1")
    try:
        info = prepare(model, data, out, limit=limit, regenerate=regenerate, max_new_tokens=max_new_tokens,
                       on_bad_record=on_bad_record, max_len=max_len, batch_size=batch_size, device=device,
                       dtype=dtype)
    except EagleError as e:
        fail(str(e))
    if as_json:
        click.echo(info.model_dump_json(indent=1))
        return
    print_kv({
        "out": str(out),
        "records read": info.records,
        "skipped (bad)": info.skipped,
        "samples": info.samples,
        "tokens": info.tokens,
        "loss tokens": info.loss_tokens,
        "mean length": round(info.tokens / max(1, info.samples), 1),
        "regenerated": "yes" if info.regenerated else "no",
    })
