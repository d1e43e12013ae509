"""Conversations as token ids, built turn by turn in token space (the heart of `eagle prepare`).

A sample is a token sequence the target really reads and writes. The chat template renders the
turns that are not the assistant's and the glue between turns; each assistant turn goes in as
token ids: the target's own output with --regenerate (never decoded and re-encoded, so reasoning
blocks, tool calls and special tokens survive exactly), the template's rendering of the recorded
answer without. The next turn's context is the sample so far, so a multi-turn conversation is one
sample, whole, even under a template that rewrites earlier turns (Qwen3 drops the reasoning of
turns before the last user message).

Loss mask: 1 on the assistant's tokens (with --regenerate: the tokens the target produced given
exactly the tokens before them), its closing token included when it produced one; 0 on everything
the template added (the rest of the turn's closing glue, the next turns, generation prompts).

Truncated answers (max tokens reached) are not closed with an end-of-turn token they never had:
the last one ends the sample; an earlier one is closed by the template's glue with mask 0 so that
the conversation can go on, and the sample is marked truncated.

How earlier answers appear in later contexts (`history`, `--history-reasoning`):
- "template" (the default): exactly as the target's chat template renders the conversation so far,
  earlier answers as messages (recorded ones as recorded, regenerated ones decoded, their reasoning
  moved to `reasoning_content` at the reasoning tags): the context a server with this template
  gives the model. Qwen3-style templates drop earlier answers' thinking; Kimi-K2.5-style ones
  render them `<think></think>answer`.
- "keep": every answer as produced, the template's glue between turns.
- "drop": an earlier answer's reasoning block (through the closing tag and the blank tokens after
  it) removed, as a Qwen3-style server serves it.
- "empty": an earlier answer's reasoning emptied (`<think></think>answer`), as a Kimi-K2.5 server
  serves it.
When a later context does not extend the sample so far (an earlier answer is rendered otherwise
than it was produced), the sample so far is finished as a sample of its own and the conversation
goes on in a new sample that starts with that context (mask 0 on it): every answer is trained
once, in exactly the context it was written in, and every later turn in exactly the context the
server gives it (`Sample.parts`, counted as split records).

A recorded answer whose `reasoning_content` or `tool_calls` the template does not render as the
latest turn (it renders the same without the field) is listed in `Sample.lost`: prepare refuses
such data unless told to accept the loss.

How the glue is found (`Template.glue`): render the history with a sentinel as the assistant's
content, without and with the following turns + generation prompt; the text after the sentinel
is the closing glue (without) and closing glue + next turns (with).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

HISTORY_MODES = ("template", "keep", "drop", "empty")
CHECKED_FIELDS = ("reasoning_content", "tool_calls")  # an answer's own output a template may fail to render
SENTINEL = "EAGLEANSWERSENTINEL"  # plain letters: survives strip/trim/split filters of templates
PLACEHOLDER = "EAGLEEARLIERANSWER"  # an earlier assistant turn's content when only the glue matters


class TurnError(ValueError):
    """The chat template cannot be split into turns this way; the message says what was found, `reason`
    the short name prepare counts skipped records by."""

    def __init__(self, message: str, reason: str = "chat template cannot be split into turns") -> None:
        super().__init__(message)
        self.reason = reason


class Answer(BaseModel):
    """An assistant turn as token ids; `stopped`: it ended with a stop token of its own; `room_cut`:
    it ended at the room left under the length limit (--max-len), not at --max-new-tokens."""

    token_ids: list[int]
    stopped: bool = True
    room_cut: bool = False


def _after(text: str, marker: str, what: str) -> str:
    at = text.rfind(marker)
    if at < 0:
        raise TurnError(f"the chat template altered the assistant's content while rendering {what}; "
                        "cannot find where the answer ends")
    return text[at + len(marker):]


class Template:
    """A tokenizer's chat template with fixed options (template kwargs such as enable_thinking, tools)."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None,
                 tools: list[Any] | None = None):
        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})
        self.tools = tools

    def with_tools(self, tools: list[Any] | None) -> Template:
        return self if tools == self.tools else Template(self.tokenizer, self.kwargs, tools)

    def text(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        extra = {"tools": self.tools} if self.tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  **extra, **self.kwargs)

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def head(self, turns: list[dict[str, Any]]) -> list[int]:
        """The first turns and the generation prompt."""
        return self.ids(self.text(turns, add_generation_prompt=True))

    def glue(self, history: list[dict[str, Any]], following: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
        """(close, next): the template's tokens that end an assistant turn after `history`, and the
        tokens of the `following` turns plus the next generation prompt."""
        turn = {"role": "assistant", "content": SENTINEL}
        close = _after(self.text(history + [turn], add_generation_prompt=False), SENTINEL, "a closing assistant turn")
        after = _after(self.text(history + [turn] + following, add_generation_prompt=True), SENTINEL,
                       "an assistant turn followed by more turns")
        if not after.startswith(close):
            raise TurnError("the chat template ends an assistant turn differently when more turns follow "
                            f"({close!r} vs {after[:len(close) + 20]!r}); cannot join the turns in token space")
        return self.ids(close), self.ids(after[len(close):])

    def recorded_answer(self, history: list[dict[str, Any]], message: dict[str, Any]) -> list[int]:
        """A recorded assistant turn as the template renders it as the latest turn, through the first
        token of its closing glue (the end-of-turn token the model would emit)."""
        head = self.text(history, add_generation_prompt=True)
        full = self.text(history + [message], add_generation_prompt=False)
        if not full.startswith(head):
            raise TurnError("the chat template does not render the assistant turn as an extension of the "
                            "generation prompt before it; cannot derive an assistant-only loss mask")
        body = full[len(head):]
        close = _after(self.text(history + [{"role": "assistant", "content": SENTINEL}], False), SENTINEL,
                       "a closing assistant turn")
        if close and not body.endswith(close):
            raise TurnError(f"the chat template closes this assistant turn without its usual {close!r}")
        close_ids = self.ids(close)
        return self.ids(body[: len(body) - len(close)]) + close_ids[:1]

    def lost_fields(self, history: list[dict[str, Any]], message: dict[str, Any]) -> list[str]:
        """The fields of a recorded answer (CHECKED_FIELDS) that the template does not render when it
        is the latest turn: it renders the same without them."""
        if not any(message.get(f) for f in CHECKED_FIELDS):
            return []
        full = self.text(history + [message], add_generation_prompt=False)
        return [f for f in CHECKED_FIELDS if message.get(f) and
                self.text(history + [{k: v for k, v in message.items() if k != f}], add_generation_prompt=False) == full]

    def answer_message(self, answer: Answer, tags: ReasoningTags | None) -> dict[str, Any]:
        """A regenerated answer as the assistant message a server returns: decoded without its stop
        token, the reasoning before the closing tag in `reasoning_content` (as vLLM's reasoning parsers
        split it; tool calls stay in the content as produced)."""
        ids = answer.token_ids[:-1] if answer.stopped else answer.token_ids
        message: dict[str, Any] = {"role": "assistant"}
        end = reasoning_end(ids, tags.close_id, frozenset()) if tags else 0
        if tags and end:
            start = _after_open(ids, tags.open_id, end - 1)
            message["reasoning_content"] = self.tokenizer.decode(ids[start:end - 1])
        elif tags and tags.open_id in ids:  # cut while reasoning: all of it is reasoning, no content yet
            start = _after_open(ids, tags.open_id, len(ids))
            message["reasoning_content"] = self.tokenizer.decode(ids[start:])
            end = len(ids)
        message["content"] = self.tokenizer.decode(ids[end:])
        return message


def reasoning_end(ids: list[int], close_id: int, blank_ids: frozenset[int]) -> int:
    """Where the visible answer starts: after the last `close_id` and the blank tokens following it;
    0 when the answer carries no reasoning block (the opening tag may sit in the generation prompt)."""
    ends = [i for i, t in enumerate(ids) if t == close_id]
    if not ends:
        return 0
    end = ends[-1] + 1
    while end < len(ids) and ids[end] in blank_ids:
        end += 1
    return end


def _after_open(ids: list[int], open_id: int, close_at: int) -> int:
    """Where the reasoning starts: after the last opening tag before `close_at`, else 0 (opened in the
    generation prompt)."""
    opens = [i for i in range(close_at) if ids[i] == open_id]
    return opens[-1] + 1 if opens else 0


def history_ids(ids: list[int], mode: str, tags: ReasoningTags) -> list[int]:
    """An answer's token ids as later contexts hold it under `mode` ("drop": without its reasoning
    block; "empty": with an empty one; otherwise as produced)."""
    end = reasoning_end(ids, tags.close_id, tags.blank_ids)
    if not end or mode not in ("drop", "empty"):
        return list(ids)
    if mode == "drop":
        return ids[end:]
    close_at = max(i for i, t in enumerate(ids) if t == tags.close_id)
    return ids[:_after_open(ids, tags.open_id, close_at)] + ids[close_at:]


@dataclass
class ReasoningTags:
    open_id: int
    close_id: int
    blank_ids: frozenset[int]  # tokens that are only whitespace (stripped after the closing tag)


@dataclass
class Part:
    """A finished sample of a conversation that was split (see the module docstring)."""

    ids: list[int]
    mask: list[int]


@dataclass
class Sample:
    """One conversation being built: ids + mask so far; `context()` is what the target reads next.

    `history_mode`: how earlier answers appear in later contexts (HISTORY_MODES); `reasoning`: the tags
    ("drop" and "empty" need them; "template" uses them to split regenerated answers' reasoning)."""

    template: Template
    points: list[list[dict[str, Any]]]  # the non-assistant turns before each answer
    reasoning: ReasoningTags | None = None
    history_mode: str = "keep"
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turn: int = 0
    truncated: bool = False
    cut: bool = False  # ended early: the context reached the length limit
    history: list[dict[str, Any]] = field(default_factory=list)  # placeholders for earlier answers (glue)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation so far, answers as messages
    parts: list[Part] = field(default_factory=list)  # samples finished by a split
    split_reasoning: bool = False  # a split came from an answer's reasoning block
    answers: list[tuple[int, bool]] = field(default_factory=list)  # (length, cut at --max-new-tokens) of each answer
    # that ended on its own or at --max-new-tokens (one stopped by the length limit ends the sample: `cut`)
    lost: list[tuple[int, str]] = field(default_factory=list)  # (message index, field) the template does not render

    def __post_init__(self) -> None:
        if not self.points:
            raise TurnError("no user turn to answer", reason="no user turn")
        if self.history_mode not in HISTORY_MODES:
            raise TurnError(f"unknown history mode {self.history_mode!r}")
        if self.history_mode in ("drop", "empty") and self.reasoning is None:
            raise TurnError(f"history mode {self.history_mode!r} needs the reasoning tags")
        self.history = list(self.points[0])
        self.messages = list(self.points[0])
        self.ids = self.template.head(self.history)
        self.mask = [0] * len(self.ids)

    @property
    def done(self) -> bool:
        return self.cut or self.turn >= len(self.points)

    def context(self) -> list[int]:
        return list(self.ids)

    def stop(self) -> None:
        """No room for another answer: the sample ends after the last complete one."""
        self.cut = True

    def samples(self) -> list[tuple[list[int], list[int]]]:
        """(ids, mask) of every sample this conversation gives: the split-off parts, then the current one."""
        return [(p.ids, p.mask) for p in self.parts] + [(self.ids, self.mask)]

    def add(self, answer: Answer, message: dict[str, Any] | None = None) -> None:
        """Append the answer to the current point, then what the next context holds (if any).
        `message`: the recorded answer as a message (regenerated answers are decoded)."""
        if self.done:
            raise TurnError("all turns are answered already")
        start = len(self.ids)
        self.ids += answer.token_ids
        self.mask += [1] * len(answer.token_ids)
        self.turn += 1
        if answer.room_cut:  # stopped by the length limit: the conversation ends here (counted as cut there)
            self.cut = True
            return
        self.answers.append((len(answer.token_ids), not answer.stopped))
        self.truncated |= not answer.stopped
        if self.turn >= len(self.points):
            return
        following = self.points[self.turn]
        has_reasoning = bool(message and message.get("reasoning_content")) or (
            self.reasoning is not None and self.reasoning.close_id in answer.token_ids)
        if self.history_mode == "template":
            message = message or self.template.answer_message(answer, self.reasoning)
            nxt = self.template.head(self.messages + [message] + following)
            self._continue(nxt, has_reasoning)
        else:
            close, glue = self.template.glue(self.history, following)
            produced = self.ids[start:]
            kept = produced if self.reasoning is None else history_ids(produced, self.history_mode, self.reasoning)
            ended = answer.stopped and close and kept and kept[-1] == close[0]
            rest = close[1:] if ended else close
            self._continue(self.ids[:start] + kept + rest + glue, has_reasoning)
        self.history += [{"role": "assistant", "content": PLACEHOLDER}] + following
        self.messages += [message or {"role": "assistant", "content": PLACEHOLDER}] + following

    def _continue(self, nxt: list[int], has_reasoning: bool) -> None:
        """Go on with context `nxt`: in this sample when it extends it, else in a new one (a split)."""
        if nxt[:len(self.ids)] == self.ids:
            self.mask += [0] * (len(nxt) - len(self.ids))
        else:
            self.parts.append(Part(self.ids, self.mask))
            self.split_reasoning |= has_reasoning
            self.mask = [0] * len(nxt)
        self.ids = list(nxt)


def recorded_points(messages: list[dict[str, Any]]) -> tuple[list[list[dict[str, Any]]], list[int]]:
    """A recorded conversation -> (the non-assistant turns before each answer, the answers' indices).

    Every assistant turn after the first user turn is an answer; turns before the first user turn
    (an opening assistant greeting included) go into the first context; turns after the last
    answer are dropped (nothing after them is trained on)."""
    points: list[list[dict[str, Any]]] = []
    answers: list[int] = []
    cur: list[dict[str, Any]] = []
    seen_user = False
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and seen_user:
            points.append(cur)
            answers.append(i)
            cur = []
        else:
            cur.append(m)
            seen_user |= m["role"] == "user"
    return points, answers


def recorded_sample(template: Template, messages: list[dict[str, Any]], reasoning: ReasoningTags | None = None,
                    history: str = "keep") -> Sample:
    """A conversation with its recorded answers as one sample (no target involved); `lost` lists the
    fields of answers the template does not render."""
    points, answers = recorded_points(messages)
    if not answers:
        raise TurnError("no assistant turn (pass --regenerate to fill responses from the target)",
                        reason="no assistant turn")
    sample = Sample(template, points, reasoning, history)
    for index in answers:
        message = messages[index]
        sample.lost += [(index, f) for f in template.lost_fields(sample.history, message)]
        sample.add(Answer(token_ids=template.recorded_answer(sample.history, message), stopped=True), message)
    return sample
