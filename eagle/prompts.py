"""Evaluation prompts: a JSONL file -> the exact token ids every eagle decoder sends.

`eagle evaluate`, `eagle bench`, `eagle probe` and `eagle serve-bench` all call
`load_prompt_token_ids`, so vLLM and our own decoder see the same ids: the target's chat template
applied to the prompt's messages with `add_generation_prompt=True`.

Records (one JSON object a line; blank lines are skipped):
- OpenAI: `{"messages": [{"role": "user", "content": "..."}, ...]}`
- ShareGPT: `{"conversations": [{"from": "human", "value": "..."}, ...]}`
- plain: `{"prompt": "..."}` (one user turn)
`content` may be a list of text parts (`[{"type": "text", "text": "..."}]`); a UTF-8 byte-order mark
at the start of the file is ignored.
Trailing assistant turns are dropped: the model is asked to write the next assistant turn itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle.fsutil import SpecialFileError, regular_file

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


def read_prompt_messages(prompts_file: str | Path, limit: int | None = None) -> list[list[dict[str, str]]]:
    """Parse the JSONL file into chat messages (pure apart from reading the file)."""
    path = Path(prompts_file)
    try:
        there = regular_file(path, "prompts file", "give the path of a JSONL file")
    except SpecialFileError as exc:  # a FIFO, /dev/zero (read for ever) or a directory
        raise PromptFileError(str(exc)) from None
    if not there:
        raise PromptFileError(f"{path}: prompts file not found")
    out: list[list[dict[str, str]]] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
        out.append(_messages(record, where))
    if not out:
        raise PromptFileError(f"{path}: no prompts in the file")
    return out


def load_prompt_token_ids(model_dir: str | Path, prompts_file: str | Path,
                          limit: int | None = None, trust_remote_code: bool = False) -> list[list[int]]:
    """Token ids of each prompt: the target tokenizer's chat template, add_generation_prompt=True."""
    from eagle.target import load_tokenizer

    conversations = read_prompt_messages(prompts_file, limit)
    tokenizer = load_tokenizer(model_dir, trust_remote_code, need_chat_template=False)
    if not getattr(tokenizer, "chat_template", None):
        raise PromptFileError(f"{model_dir}: the tokenizer has no chat template; prompts cannot be formatted")
    result = []
    for msgs in conversations:
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        result.append([int(i) for i in ids])
    return result
