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

`history_reasoning="drop"` serves contexts the way a Qwen3-style server does: once a later turn
follows, an earlier answer's reasoning block (through the closing tag and the newlines after it)
is removed from the context, and that answer's remaining tokens get mask 0 (they no longer follow
the context the target wrote them in). "keep" (the default) leaves every answer as produced.

How the glue is found (`Template.glue`): render the history with a sentinel as the assistant's
content, without and with the following turns + generation prompt; the text after the sentinel
is the closing glue (without) and closing glue + next turns (with).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

SENTINEL = "EAGLEANSWERSENTINEL"  # plain letters: survives strip/trim/split filters of templates
PLACEHOLDER = "EAGLEEARLIERANSWER"  # an earlier assistant turn's content when only the glue matters


class TurnError(ValueError):
    """The chat template cannot be split into turns this way; the message says what was found."""


class Answer(BaseModel):
    """An assistant turn as token ids; `stopped`: it ended with a stop token of its own."""

    token_ids: list[int]
    stopped: bool = True


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


def reasoning_end(ids: list[int], open_id: int, close_id: int, blank_ids: frozenset[int]) -> int:
    """Where the visible answer starts: after the last `close_id` and the blank tokens following it;
    0 when the answer carries no reasoning block (`open_id` may sit in the generation prompt)."""
    del open_id  # Qwen3-style templates drop everything before the closing tag, opened here or not
    ends = [i for i, t in enumerate(ids) if t == close_id]
    if not ends:
        return 0
    end = ends[-1] + 1
    while end < len(ids) and ids[end] in blank_ids:
        end += 1
    return end


@dataclass
class ReasoningTags:
    open_id: int
    close_id: int
    blank_ids: frozenset[int]  # tokens that are only whitespace (stripped after the closing tag)


@dataclass
class Sample:
    """One conversation being built: ids + mask so far; `context()` is what the target reads next."""

    template: Template
    points: list[list[dict[str, Any]]]  # the non-assistant turns before each answer
    reasoning: ReasoningTags | None = None  # set: drop earlier answers' reasoning from later contexts
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turn: int = 0
    truncated: bool = False
    cut: bool = False  # ended early: the context reached the length limit
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.points:
            raise TurnError("no user turn to answer")
        self.history = list(self.points[0])
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

    def add(self, answer: Answer) -> None:
        """Append the answer to the current point, then the glue to the next one (if any)."""
        if self.done:
            raise TurnError("all turns are answered already")
        start = len(self.ids)
        self.ids += answer.token_ids
        self.mask += [1] * len(answer.token_ids)
        self.truncated |= not answer.stopped
        self.turn += 1
        if self.turn >= len(self.points):
            return
        following = self.points[self.turn]
        close, nxt = self.template.glue(self.history, following)
        if self.reasoning is not None:
            cut = reasoning_end(self.ids[start:], self.reasoning.open_id, self.reasoning.close_id,
                                self.reasoning.blank_ids)
            if cut:
                del self.ids[start:start + cut]
                del self.mask[start:start + cut]
                self.mask[start:] = [0] * (len(self.mask) - start)
        ended = answer.stopped and close and self.ids[start:] and self.ids[-1] == close[0]
        rest = close[1:] if ended else close
        self.ids += rest + nxt
        self.mask += [0] * (len(rest) + len(nxt))
        self.history += [{"role": "assistant", "content": PLACEHOLDER}] + following


def recorded_points(messages: list[dict[str, Any]]) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """A recorded conversation -> (the non-assistant turns before each answer, the answers).

    Every assistant turn after the first user turn is an answer; turns before the first user turn
    (an opening assistant greeting included) go into the first context; turns after the last
    answer are dropped (nothing after them is trained on)."""
    points: list[list[dict[str, Any]]] = []
    answers: list[dict[str, Any]] = []
    cur: list[dict[str, Any]] = []
    seen_user = False
    for m in messages:
        if m["role"] == "assistant" and seen_user:
            points.append(cur)
            answers.append(m)
            cur = []
        else:
            cur.append(m)
            seen_user |= m["role"] == "user"
    return points, answers


def recorded_sample(template: Template, messages: list[dict[str, Any]],
                    reasoning: ReasoningTags | None = None) -> Sample:
    """A conversation with its recorded answers as one sample (no target involved)."""
    points, answers = recorded_points(messages)
    if not answers:
        raise TurnError("no assistant turn (pass --regenerate to fill responses from the target)")
    sample = Sample(template, points, reasoning)
    for message in answers:
        sample.add(Answer(token_ids=template.recorded_answer(sample.history, message), stopped=True))
    return sample
