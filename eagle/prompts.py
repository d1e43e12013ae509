"""Evaluation prompts: a prompt file or a standard prompt suite -> the exact token ids every eagle
decoder sends, with each prompt's category.

`eagle evaluate`, `eagle bench`, `eagle probe` and `eagle serve-bench` all call
`load_prompt_token_ids` / `load_prompt_suite`, so vLLM and our own decoder see the same ids: the
target's chat template applied to the prompt's messages with `add_generation_prompt=True`.

Files: JSON lines (`.jsonl`, also gzipped `.jsonl.gz` as HumanEval ships), a JSON array (`.json`),
or Parquet (`.parquet`, as SPEED-Bench is published; read with pyarrow). Blank lines are skipped; a
UTF-8 byte-order mark at the start is ignored. Formats (`--suite-format`, else told by the first
record's fields):
- chat: OpenAI `{"messages": [{"role": "user", "content": "..."}, ...]}`, ShareGPT
  `{"conversations": [{"from": "human", "value": "..."}, ...]}`, or `{"prompt": "..."}` (one user
  turn); an optional `category` string. `content` may be a list of text parts
  (`[{"type": "text", "text": "..."}]`). Trailing assistant turns are dropped: the model is asked
  to write the next assistant turn itself.
- mt-bench: FastChat's `question.jsonl` (`question_id`, `category`, `turns`: [str, ...]); Spec-Bench's
  question.jsonl is the same format.
- speed-bench: NVIDIA SPEED-Bench (`question_id`, `category`, `sub_category`, `turns`, `source`,
  `difficulty`, `multiturn`), as JSON lines or its Parquet files.
- gsm8k: OpenAI grade-school-math (`question`, `answer`); category `gsm8k`.
- humaneval: OpenAI HumanEval (`task_id`, `prompt`, `canonical_solution`, `test`, `entry_point`); the
  code prompt is the user turn; category `humaneval`.
Multi-turn suites (MT-Bench, SPEED-Bench) are prompted with their first turn: the second turn needs
the model's own first answer, which an acceptance measurement would have to generate first.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from eagle.fsutil import SpecialFileError, regular_file

SUITE_FORMATS = ("auto", "chat", "mt-bench", "speed-bench", "gsm8k", "humaneval")

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}


def content_text(value: object) -> str | None:
    """A message's `content` as text: a string, or a list of text parts as chat APIs export them
    (`[{"type": "text", "text": "..."}]`, joined); None for anything else (images, numbers)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)
    return None


class PromptFileError(ValueError):
    """A bad prompts file; the message carries `file:line: what is wrong and how to fix it`."""


def _messages(record: object, where: str) -> list[dict[str, str]]:
    if not isinstance(record, dict):
        raise PromptFileError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        turns = record["messages"]
        if not isinstance(turns, list) or not all(
                isinstance(t, dict) and isinstance(t.get("role"), str) and content_text(t.get("content")) is not None
                for t in turns):
            raise PromptFileError(f"{where}: 'messages' must be a list of {{\"role\": str, \"content\": str or "
                                  "[{\"type\": \"text\", \"text\": str}, ...]}")
        msgs = [{"role": t["role"], "content": str(content_text(t["content"]))} for t in turns]
    elif "conversations" in record:
        turns = record["conversations"]
        if not isinstance(turns, list) or not all(
                isinstance(t, dict) and t.get("from") in _SHAREGPT_ROLES and isinstance(t.get("value"), str)
                for t in turns):
            raise PromptFileError(f"{where}: 'conversations' must be a list of {{\"from\": human|gpt|system, "
                                  "\"value\": str}")
        msgs = [{"role": _SHAREGPT_ROLES[t["from"]], "content": t["value"]} for t in turns]
    elif isinstance(record.get("prompt"), str):
        msgs = [{"role": "user", "content": record["prompt"]}]
    else:
        raise PromptFileError(f"{where}: no 'messages', 'conversations' or 'prompt' field")
    while msgs and msgs[-1]["role"] == "assistant":
        msgs.pop()
    if not msgs:
        raise PromptFileError(f"{where}: no user turn left to prompt with")
    return msgs


class Prompt(BaseModel):
    """One prompt of a suite: the chat messages it is asked with, its category (None: none given)."""

    messages: list[dict[str, str]]
    category: str | None = None


class PromptSuite(BaseModel):
    """A prompt file read: its format (the suite's name: chat, mt-bench, ...) and its prompts."""

    path: str
    format: str
    prompts: list[Prompt]

    @property
    def categories(self) -> list[str | None]:
        return [p.category for p in self.prompts]


class TokenizedSuite(PromptSuite):
    """A suite with each prompt's token ids (`load_prompt_suite`)."""

    token_ids: list[list[int]]


def metric_key(name: str) -> str:
    """A suite or category name as a metric-name part: lower case, runs of other characters as `_`."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "none"


def _records(path: Path, limit: int | None) -> list[tuple[str, Any]]:
    """(where, record) of the first `limit` records of the file (all with None), in order: JSON lines
    (gzipped too; the lines past the limit are not parsed), a JSON array, Parquet."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq  # type: ignore[import-untyped]  # (no stubs)

            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # a damaged or foreign file: pyarrow's own errors
            raise PromptFileError(f"{path}: not a readable Parquet file ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else 'damaged'})") from None
        return [(f"{path}: row {i}", row) for i, row in enumerate(rows[:limit])]
    try:
        if name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8-sig") as fh:
                text = fh.read()
        else:
            text = path.read_text(encoding="utf-8-sig")
    except (OSError, EOFError) as exc:  # a damaged gzip stream
        raise PromptFileError(f"{path}: cannot read it ({exc})") from None
    except UnicodeDecodeError as exc:
        raise PromptFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); give a JSONL, "
                              "JSONL.gz, JSON or Parquet file") from None
    if name.endswith(".json") and text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        return [(f"{path}: item {i}", item) for i, item in enumerate(items[:limit])]
    out: list[tuple[str, Any]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            out.append((where, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    return out


def detect_format(record: object, where: str) -> str:
    """The suite format a record's fields say (SUITE_FORMATS), or a PromptFileError naming the fix."""
    if isinstance(record, dict):
        if "turns" in record:
            return "speed-bench" if {"sub_category", "multiturn"} & set(record) else "mt-bench"
        if "task_id" in record and "prompt" in record:
            return "humaneval"
        if "question" in record and "answer" in record:
            return "gsm8k"
        if {"messages", "conversations", "prompt"} & set(record):
            return "chat"
        keys = ", ".join(sorted(map(str, record))[:8])
    else:
        keys = type(record).__name__
    raise PromptFileError(f"{where}: cannot tell the prompt format from this record ({keys}); expected chat "
                          "(messages / conversations / prompt), MT-Bench or SPEED-Bench (turns), GSM8K "
                          "(question, answer) or HumanEval (task_id, prompt): pass --suite-format")


def _text(record: dict[str, Any], key: str, where: str, fmt: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise PromptFileError(f"{where}: a {fmt} record needs '{key}' as a non-empty string")
    return value


def _suite_prompt(record: object, fmt: str, where: str) -> Prompt:
    if fmt == "chat":
        category = record.get("category") if isinstance(record, dict) else None
        return Prompt(messages=_messages(record, where), category=category if isinstance(category, str) else None)
    if not isinstance(record, dict):
        raise PromptFileError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if fmt in ("mt-bench", "speed-bench"):
        turns = record.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise PromptFileError(f"{where}: a {fmt} record needs 'turns' as a list of strings (the first one "
                                  "is the prompt)")
        category = record.get("category")
        return Prompt(messages=[{"role": "user", "content": turns[0]}],
                      category=str(category) if category not in (None, "") else None)
    if fmt == "gsm8k":
        return Prompt(messages=[{"role": "user", "content": _text(record, "question", where, fmt)}], category="gsm8k")
    if fmt == "humaneval":
        return Prompt(messages=[{"role": "user", "content": _text(record, "prompt", where, fmt)}],
                      category="humaneval")
    raise PromptFileError(f"--suite-format {fmt!r}: use one of {', '.join(SUITE_FORMATS)}")


def read_prompt_suite(prompts_file: str | Path, limit: int | None = None, suite_format: str = "auto") -> PromptSuite:
    """Read a prompt file of any format in the module docstring (pure apart from reading the file)."""
    path = Path(prompts_file)
    if suite_format not in SUITE_FORMATS:
        raise PromptFileError(f"--suite-format {suite_format!r}: use one of {', '.join(SUITE_FORMATS)}")
    try:
        there = regular_file(path, "prompts file", "give the path of a JSONL, JSONL.gz, JSON or Parquet file")
    except SpecialFileError as exc:  # a FIFO, /dev/zero (read for ever) or a directory
        raise PromptFileError(str(exc)) from None
    if not there:
        raise PromptFileError(f"{path}: prompts file not found")
    records = _records(path, limit)
    if not records:
        raise PromptFileError(f"{path}: no prompts in the file")
    fmt = detect_format(records[0][1], records[0][0]) if suite_format == "auto" else suite_format
    return PromptSuite(path=str(path), format=fmt, prompts=[_suite_prompt(r, fmt, where) for where, r in records])


def read_prompt_messages(prompts_file: str | Path, limit: int | None = None) -> list[list[dict[str, str]]]:
    """The chat messages of each prompt of the file (read_prompt_suite, its format told by its fields)."""
    return [p.messages for p in read_prompt_suite(prompts_file, limit).prompts]


def load_prompt_suite(model_dir: str | Path, prompts_file: str | Path, limit: int | None = None,
                      trust_remote_code: bool = False, suite_format: str = "auto") -> TokenizedSuite:
    """The suite with each prompt's token ids: the target tokenizer's chat template,
    add_generation_prompt=True."""
    from eagle.target import load_tokenizer

    suite = read_prompt_suite(prompts_file, limit, suite_format)
    tokenizer = load_tokenizer(model_dir, trust_remote_code, need_chat_template=False)
    if not getattr(tokenizer, "chat_template", None):
        raise PromptFileError(f"{model_dir}: the tokenizer has no chat template; prompts cannot be formatted")
    result = []
    for prompt in suite.prompts:
        ids = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        result.append([int(i) for i in ids])
    return TokenizedSuite(**suite.model_dump(), token_ids=result)


def load_prompt_token_ids(model_dir: str | Path, prompts_file: str | Path, limit: int | None = None,
                          trust_remote_code: bool = False, suite_format: str = "auto") -> list[list[int]]:
    """Token ids of each prompt (load_prompt_suite's, without the categories)."""
    return load_prompt_suite(model_dir, prompts_file, limit, trust_remote_code, suite_format).token_ids
