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
end-of-turn token included, when it has one). Earlier answers appear in later contexts as
--history-reasoning says (turns.py; default: as the target's template renders them).

Nothing is lost silently: every record skipped, changed (split into several samples, a field the
template does not render accepted) or cut (at --max-len, answers at --max-new-tokens) is counted by
reason in PrepareInfo (prepared.json, --json, metrics) and the command's output; a cut is reported
as a share with the limit that would keep 99% whole. Recorded answers whose reasoning_content or
tool_calls the template would drop are refused unless --accept-lost-field names the field.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle.common import EagleError, warn
from eagle.data.hidden_io import PREPARE_FILE, PrepareInfo
from eagle.data.regenerate import RegenSettings, check_settings
from eagle.data.regenerate import regenerate as regenerate_samples
from eagle.data.turns import (
    CHECKED_FIELDS,
    HISTORY_MODES,
    ReasoningTags,
    Sample,
    Template,
    TurnError,
    recorded_sample,
)
from eagle.fsutil import StreamError, atomic_dir, atomic_write_text, open_stream
from eagle.prompts import content_text
from eagle.serving.client import Sampling
from eagle.serving.flags import VllmFlags

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
    """One input record is unusable; the message says why, `reason` the short name it is counted by."""

    def __init__(self, message: str, reason: str = "malformed record") -> None:
        super().__init__(message)
        self.reason = reason


Bad = tuple[int, str, str]  # (line, reason, what exactly is wrong)


@dataclass
class Record:
    line: int
    fmt: str  # "messages" | "conversations"
    messages: list[dict[str, Any]]
    tools: list[Any] | None = None


# ---------------------------------------------------------------- parsing (pure)


def _content(value: Any, where: str) -> str:
    text = content_text(value)
    if text is not None:
        return text
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
            raise RecordError(f"{where}: unknown role {turn[role_key]!r} (known: {', '.join(sorted(ROLE_NAMES))})",
                              reason="unknown role")
        if text_key not in turn and not turn.get("tool_calls"):
            raise RecordError(f"{where}: missing '{text_key}'")
        value = turn.get(text_key)
        msg: dict[str, Any] = {"role": ROLE_NAMES[raw_role],
                               "content": "" if value is None and turn.get("tool_calls") else _content(value, where)}
        msg.update({k: turn[k] for k in PASSED_THROUGH if turn.get(k) is not None})
        out.append(msg)
    if not any(m["role"] == "user" for m in out):
        raise RecordError("no user turn", reason="no user turn")
    return fmt, out


def read_records(path: Path) -> tuple[list[Record], list[Bad]]:
    """All records of a JSONL file: (good records, [(line, reason, why)] for bad ones). Blank lines are skipped."""
    good: list[Record] = []
    bad: list[Bad] = []
    with open_stream(path) as fh:  # a regular file or a pipe with a writer (StreamError otherwise)
        for n, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")  # a byte-order mark starts no record
            except UnicodeDecodeError as e:
                bad.append((n, "not UTF-8", f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"))
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                bad.append((n, "invalid JSON", f"invalid JSON ({e.msg} at column {e.colno})"))
                continue
            try:
                fmt, msgs = parse_record(obj)
            except RecordError as e:
                bad.append((n, e.reason, str(e)))
                continue
            tools = obj.get("tools")
            if tools is not None and not isinstance(tools, list):
                bad.append((n, "malformed record", "'tools' must be a list of tool definitions"))
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
        raise RecordError(str(e), e.reason) from None
    return sample.ids, sample.mask


def load_tokenizer(model: Path, trust_remote_code: bool = False) -> Any:
    """The target's tokenizer; it must have a chat template (prepare builds loss masks with it)."""
    from eagle import target

    return target.load_tokenizer(model, trust_remote_code, need_chat_template=True)


def reasoning_tags(tokenizer: Any, tags: str, mode: str = "drop", required: bool = True) -> ReasoningTags | None:
    """`--reasoning-tags OPEN,CLOSE` -> their token ids (each must be one token of the vocabulary, itself:
    not the unknown token). Not `required`: None when they are not (the target does not reason)."""
    parts = [t.strip() for t in tags.split(",")]
    if len(parts) != 2 or not all(parts):
        raise EagleError(f"--reasoning-tags {tags!r}: expected OPEN,CLOSE like '<think>,</think>'")
    ids = []
    for tag in parts:
        enc = tokenizer(tag, add_special_tokens=False)["input_ids"]
        if len(enc) != 1 or tokenizer.convert_ids_to_tokens(int(enc[0])) != tag:
            if not required:
                return None
            raise EagleError(f"--history-reasoning {mode}: {tag!r} is not a single token of this tokenizer "
                             f"({len(enc)} token(s): {tokenizer.convert_ids_to_tokens(list(enc))}); give the model's "
                             "own tags with --reasoning-tags")
        ids.append(int(enc[0]))
    blank = frozenset(i for t, i in tokenizer.get_vocab().items() if tokenizer.convert_tokens_to_string([t]).strip() == ""
                      and i not in tokenizer.all_special_ids)
    return ReasoningTags(open_id=ids[0], close_id=ids[1], blank_ids=blank)


# ---------------------------------------------------------------- writing the dataset


def _same_dataset(out: Path, rows: dict[str, list[Any]]) -> bool:
    try:
        from datasets import load_from_disk

        from eagle.data.hidden_io import check_dataset_files

        check_dataset_files(out)  # a FIFO there would block load_from_disk: "not the same", replaced whole
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
                  echo: bool, history: str = "keep") -> tuple[list[tuple[Record, Sample]], list[Bad]]:
    """One Sample per record (n per record with --regenerate --n), answered; and the records that failed."""
    base = Template(tok, template_kwargs)
    built: list[tuple[Record, Sample]] = []
    bad: list[Bad] = []
    for rec in records:
        tpl = base.with_tools(rec.tools)
        try:
            if regenerate:
                points = answer_points(rec.messages)
                built += [(rec, Sample(tpl, points, reasoning, history)) for _ in range(settings.n)]
            else:
                built.append((rec, recorded_sample(tpl, rec.messages, reasoning, history)))
        except TurnError as e:
            bad.append((rec.line, e.reason, str(e)))
        except Exception as e:  # noqa: BLE001 - the template itself raised (e.g. raise_exception on a role)
            bad.append((rec.line, "chat template failed", f"chat template failed: {e}"))
    if regenerate:
        failed = regenerate_samples(model, tok, [s for _, s in built], settings, flags, echo)
        bad += [(built[i][0].line, *why) for i, why in failed.items()]
        built = [b for i, b in enumerate(built) if i not in failed]
    return built, bad


def keep_99(lengths: list[int], censored: list[bool]) -> int | None:
    """The smallest limit that keeps 99% of the items whole (their 99th percentile length); None when
    that lies among `censored` items, cut at the limit, whose full length is unknown."""
    known = sorted(n for n, c in zip(lengths, censored, strict=True) if not c)
    need = math.ceil(0.99 * len(lengths))
    return known[need - 1] if 0 < need <= len(known) else None


def _pct(share: float) -> str:
    return f"{100 * share:.3g}%"


def cut_message(what: str, flag: str, limit: int, cut: int, share: float, keep: int | None) -> str:
    """'12% of samples (3) cut at --max-len 2048; --max-len 5120 keeps 99% whole'."""
    head = f"{_pct(share)} of {what} ({cut}) cut at {flag} {limit}"
    if keep is not None:
        return f"{head}; {flag} {keep} keeps 99% whole"
    return f"{head}; their full lengths are unknown (generation stopped there): {flag} above {limit} is needed to keep 99% whole"


@dataclass
class _Tally:
    """The rows prepare writes and what it changed and cut on the way (see PrepareInfo)."""

    max_len: int
    rows: dict[str, list[Any]] = field(default_factory=lambda: {"input_ids": [], "loss_mask": [], "seq_len": []})
    lengths: list[tuple[int, bool]] = field(default_factory=list)  # (full length, cut before it ended) per sample
    answers: list[tuple[int, bool]] = field(default_factory=list)  # (length, cut at --max-new-tokens) per answer
    changed: dict[str, set[int]] = field(default_factory=dict)  # reason -> lines
    kept_lines: set[int] = field(default_factory=set)
    truncated: int = 0
    cut: int = 0

    def change(self, why: str, line: int) -> None:
        self.changed.setdefault(why, set()).add(line)

    def add(self, line: int, sample: Sample) -> None:
        parts = sample.samples()
        if len(parts) > 1:
            why = "earlier answers' reasoning is not in later contexts" if sample.split_reasoning else \
                "the template renders earlier answers otherwise in later contexts"
            self.change(f"split: {why}", line)
        for k, (full_ids, full_mask) in enumerate(parts):
            stopped_early = k == len(parts) - 1 and sample.cut  # generation stopped at the length limit
            self.lengths.append((len(full_ids), stopped_early))
            self.cut += len(full_ids) > self.max_len or stopped_early
            ids, mask = full_ids[:self.max_len], full_mask[:self.max_len]
            if not any(mask):
                self.change("a split sample without assistant tokens within --max-len dropped", line)
                continue
            self.kept_lines.add(line)
            self.rows["input_ids"].append(ids)
            self.rows["loss_mask"].append(mask)
            self.rows["seq_len"].append(len(ids))
        self.answers += sample.answers
        self.truncated += sample.truncated


def _lost_refusal(data: Path, lost: list[tuple[int, int, str]]) -> EagleError:
    fields = sorted({f for _, _, f in lost})
    lines = [f"{data}:{line}: messages[{i}] carries {f}, but the chat template renders that assistant turn the same "
             "without it" for line, i, f in lost[:MAX_REPORTED]]
    if len(lost) > MAX_REPORTED:
        lines.append(f"... and {len(lost) - MAX_REPORTED} more")
    records = len({line for line, _, _ in lost})
    accept = " ".join(f"--accept-lost-field {f}" for f in fields)
    return EagleError("\n".join(lines) + f"\n{records} record(s) carry {' and '.join(fields)} that the target's chat "
                      "template drops from the answer trained on (a Kimi-K2.5-style template renders its last turn "
                      "<think></think>answer); nothing written. Use a template that renders it "
                      "(--chat-template-kwargs, where the template has a switch such as preserve_thinking), answer "
                      f"with the target itself (--regenerate), or train without it: {accept}")


def _slug(reason: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", reason.lower()).strip("_")


def prepare(model: Path, data: Path, out: Path, limit: int | None = None, regenerate: bool = False,
            max_new_tokens: int = 256, on_bad_record: str = "skip", max_len: int = 2048,
            batch_size: int = 16, device: str = "auto", dtype: str = "auto", echo: bool = True, *,
            backend: str = "hf", sampling: Sampling | None = None, n: int = 1, concurrency: int = 64,
            vllm_flags: VllmFlags | None = None, template_kwargs: dict[str, Any] | None = None,
            history_reasoning: str = "template", reasoning_tags_spec: str = "<think>,</think>",
            accept_lost_fields: tuple[str, ...] = (), startup_timeout: float = 600.0,
            vllm_url: str | None = None) -> PrepareInfo:
    """The work of `eagle prepare` (importable); raises EagleError on bad input."""
    if not os.path.exists(data):
        raise EagleError(f"--data {data}: no such file")
    if not Path(model).is_dir():
        raise EagleError(f"--model {model}: no such directory")
    if history_reasoning not in HISTORY_MODES:
        raise EagleError(f"--history-reasoning {history_reasoning!r}: use one of {', '.join(HISTORY_MODES)}")
    unknown = sorted(set(accept_lost_fields) - set(CHECKED_FIELDS))
    if unknown:
        raise EagleError(f"--accept-lost-field {unknown[0]!r}: use one of {', '.join(CHECKED_FIELDS)}")
    settings = RegenSettings(backend=backend, max_new_tokens=max_new_tokens, sampling=sampling or Sampling(), n=n,
                             max_len=max_len, batch_size=batch_size, concurrency=concurrency, device=device,
                             dtype=dtype, startup_timeout=startup_timeout, vllm_url=vllm_url)
    if regenerate:
        check_settings(settings)
    try:
        good, bad = read_records(Path(data))
    except StreamError as exc:
        raise EagleError(f"--data {data}: {exc}") from None
    if bad and on_bad_record == "fail":
        raise EagleError(_bad_report(data, bad) + f"\n{len(bad)} bad record(s); nothing written (--on-bad-record fail)")
    if limit is not None:
        good = good[:limit]
    trust = vllm_flags.trusts_remote_code if vllm_flags else False
    tok = load_tokenizer(model, trust_remote_code=trust)
    needs_tags = history_reasoning in ("drop", "empty")
    reasoning = reasoning_tags(tok, reasoning_tags_spec, history_reasoning, required=needs_tags) \
        if needs_tags or history_reasoning == "template" else None
    built, late_bad = build_samples(model, tok, good, regenerate, template_kwargs or {}, reasoning, settings,
                                    vllm_flags, echo, history_reasoning)
    lost = [(rec.line, i, f) for rec, sample in built for i, f in sample.lost]
    refused = [x for x in lost if x[2] not in accept_lost_fields]
    if refused:
        raise _lost_refusal(data, refused)
    tally = _Tally(max_len)
    for line, _, f in lost:
        tally.change(f"{f} not rendered by the chat template (accepted)", line)
    for rec, sample in built:
        tally.add(rec.line, sample)
    done = {b[0] for b in late_bad}
    late_bad += [(line, "no assistant tokens within --max-len",
                  f"no assistant tokens within the first {max_len} tokens (--max-len)")
                 for line in sorted({rec.line for rec, _ in built} - tally.kept_lines - done)]
    changed = {why: lines - {b[0] for b in late_bad} for why, lines in tally.changed.items()}
    changed = {why: lines for why, lines in changed.items() if lines}
    rows = tally.rows
    all_bad = sorted(set(bad + late_bad))
    if late_bad and on_bad_record == "fail":
        raise EagleError(_bad_report(data, sorted(late_bad)) + f"\n{len(late_bad)} bad record(s); nothing written")
    if all_bad and echo:
        warn(_bad_report(data, all_bad) + f"\nskipped {len(all_bad)} bad record(s)")
    if not rows["input_ids"]:
        reasons = f":\n{_bad_report(data, all_bad)}" if all_bad else ""
        raise EagleError(f"no usable records in {data}; nothing written{reasons}")
    fmt_counts: dict[str, int] = {}
    for r in good:
        fmt_counts[r.fmt] = fmt_counts.get(r.fmt, 0) + 1
    skipped_reasons: dict[str, set[int]] = {}
    for line, reason, _ in all_bad:
        skipped_reasons.setdefault(reason, set()).add(line)
    answers_cut = sum(c for _, c in tally.answers) if regenerate else 0
    answers = len(tally.answers) if regenerate else 0
    info = PrepareInfo(
        model=str(model), source=str(data), fmt_counts=fmt_counts, records=len(good) + len(bad),
        skipped=len({line for line, _, _ in all_bad}), samples=len(rows["input_ids"]), tokens=sum(rows["seq_len"]),
        loss_tokens=sum(sum(m) for m in rows["loss_mask"]), regenerated=regenerate,
        max_new_tokens=max_new_tokens if regenerate else None,
        backend=backend if regenerate else None, sampling=settings.sampling.model_dump() if regenerate else None,
        n=n if regenerate else 1, truncated=tally.truncated, cut_at_max_len=tally.cut,
        history_reasoning=history_reasoning,
        template_kwargs=template_kwargs or {},
        skipped_reasons={k: len(v) for k, v in sorted(skipped_reasons.items())},
        changed=len(set().union(*changed.values())) if changed else 0,
        changed_reasons={k: len(v) for k, v in sorted(changed.items())},
        accepted_lost_fields=sorted(set(accept_lost_fields)), max_len=max_len,
        cut_share=tally.cut / max(1, len(tally.lengths)),
        max_len_keep_99=keep_99([length for length, _ in tally.lengths], [c for _, c in tally.lengths]),
        answers=answers, answers_cut=answers_cut, answers_cut_share=answers_cut / max(1, answers),
        max_new_tokens_keep_99=keep_99([length for length, _ in tally.answers], [c for _, c in tally.answers])
        if answers else None,
    )
    status = write_dataset(Path(out), rows, info)
    if echo and status == "replaced":
        warn(f"replaced the existing prepared data at {out} (its hidden states and vocab were removed: re-run extract)")
    if echo:
        for text in report_lines(info):
            warn(text)
    return info


def report_lines(info: PrepareInfo) -> list[str]:
    """What prepare changed and cut, one line each (the warnings it prints)."""
    out = [f"{n} record(s) changed: {why}" for why, n in info.changed_reasons.items()]
    if info.cut_at_max_len:
        out.append(cut_message("samples", "--max-len", info.max_len or 0, info.cut_at_max_len,
                               info.cut_share, info.max_len_keep_99))
    if info.answers_cut:
        out.append(cut_message("regenerated answers", "--max-new-tokens", info.max_new_tokens or 0, info.answers_cut,
                               info.answers_cut_share, info.max_new_tokens_keep_99)
                   + " (cut answers are kept as generated, without an end-of-turn token)")
    return out


def prepare_metrics(info: PrepareInfo) -> dict[str, float]:
    """The metrics `eagle prepare` writes to $RUNBOOK_METRICS."""
    m: dict[str, float] = {"prepare_records": info.records, "prepare_samples": info.samples,
                           "prepare_tokens": info.tokens, "prepare_loss_tokens": info.loss_tokens,
                           "prepare_skipped": info.skipped, "prepare_changed": info.changed,
                           "prepare_cut_at_max_len": info.cut_at_max_len, "prepare_cut_share": info.cut_share}
    m.update({f"prepare_skipped_{_slug(k)}": v for k, v in info.skipped_reasons.items()})
    m.update({f"prepare_changed_{_slug(k)}": v for k, v in info.changed_reasons.items()})
    if info.max_len_keep_99 is not None:
        m["prepare_max_len_keep_99"] = info.max_len_keep_99
    if info.regenerated:
        m.update({"prepare_answers": info.answers, "prepare_answers_cut": info.answers_cut,
                  "prepare_answers_cut_share": info.answers_cut_share})
        if info.max_new_tokens_keep_99 is not None:
            m["prepare_max_new_tokens_keep_99"] = info.max_new_tokens_keep_99
    return m


def _bad_report(path: Path, bad: list[Bad]) -> str:
    lines = [f"{path}:{n}: {why}" for n, _, why in bad[:MAX_REPORTED]]
    if len(bad) > MAX_REPORTED:
        lines.append(f"... and {len(bad) - MAX_REPORTED} more")
    return "\n".join(lines)
