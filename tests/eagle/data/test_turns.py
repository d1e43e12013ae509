"""Token-space samples (eagle/data/turns.py) under a Qwen3-style reasoning template, and `eagle prepare
--regenerate` with the transformers backend on a target whose answer is known by construction.

The vLLM backend of the same flows is in tests/e2e/test_prepare_vllm.py (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import _reasoning_target as rt
import pytest

from eagle.common import EagleError
from eagle.data import prepare as data
from eagle.data.turns import Answer, Sample, Template, TurnError, recorded_sample

ANSWER, build_target, build_tokenizer = rt.ANSWER, rt.build_target, rt.build_tokenizer

REASONED = "<think>\nhmm so\n</think>\n\nyes done"


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return build_target(tmp_path_factory.mktemp("reasoning") / "target")


def toks(tok, ids: list[int]) -> list[str]:
    return tok.convert_ids_to_tokens(ids)


def spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of masked tokens."""
    out: list[list[int]] = []
    for i, (t, m) in enumerate(zip(ids, mask, strict=True)):
        if m and (i == 0 or not mask[i - 1]):
            out.append([])
        if m:
            out[-1].append(t)
    return out


def render(tok, messages, **kw) -> list[int]:
    return list(tok(tok.apply_chat_template(messages, tokenize=False, **kw), add_special_tokens=False)["input_ids"])


def conv(*turns: tuple[str, str]) -> list[dict]:
    return [{"role": r, "content": c} for r, c in turns]


# ---------------------------------------------------------------- recorded conversations


def test_two_turn_reasoning_conversation_is_kept_whole_with_the_right_mask(tok) -> None:
    """The Qwen3-style template drops turn 1's reasoning once turn 2 exists, so turn 1 is not a prefix of
    the whole render (the old prepare reported such records and skipped them). Token space keeps it."""
    messages = conv(("user", "hello"), ("assistant", REASONED), ("user", "again"),
                    ("assistant", "<think>\nhmm\n</think>\n\nyes"))
    old_style = render(tok, messages[:2])
    assert render(tok, messages)[: len(old_style)] != old_style  # the template rewrites history
    sample = recorded_sample(Template(tok), messages)
    masked = [toks(tok, s) for s in spans(sample.ids, sample.mask)]
    assert masked == [["<think>", "\n", "hmm", "so", "\n", "</think>", "\n\n", "yes", "done", "<|im_end|>"],
                      ["<think>", "\n", "hmm", "\n", "</think>", "\n\n", "yes", "<|im_end|>"]]
    assert toks(tok, sample.ids).count("<|im_start|>") == 4 and "again" in toks(tok, sample.ids)
    # drop: turn 2's context is exactly what the template itself renders for the conversation; turn 1,
    # as written, is a sample of its own (split), so both answers are trained in their own contexts
    dropped = recorded_sample(Template(tok), messages, data.reasoning_tags(tok, "<think>,</think>"), "drop")
    (first, first_mask), (second, second_mask) = dropped.samples()
    assert first == render(tok, messages[:2])[:-1] and [toks(tok, s) for s in spans(first, first_mask)] == [masked[0]]
    assert second == render(tok, messages)[:-1]  # (the template's trailing "\n" after the last turn)
    assert [toks(tok, s) for s in spans(second, second_mask)] == [masked[1]]  # turn 1 is context here
    tags = data.reasoning_tags(tok, "<think>,</think>")
    templated = recorded_sample(Template(tok), messages, tags, history="template")  # the template's own rendering
    assert templated.samples() == dropped.samples() and templated.split_reasoning
    # the same through data.tokenize_conversation, and with the thinking switch
    assert data.tokenize_conversation(tok, messages) == (sample.ids, sample.mask)
    off = recorded_sample(Template(tok, {"enable_thinking": False}), conv(("user", "hello"), ("assistant", "yes")))
    assert [toks(tok, s) for s in spans(off.ids, off.mask)] == [["yes", "<|im_end|>"]]
    assert toks(tok, off.ids)[-6:-2] == ["<think>", "\n\n", "</think>", "\n\n"]  # in the prompt, not the answer


def test_tools_reach_the_template_and_tool_calls_are_masked(tmp_path, target) -> None:
    record = {"tools": [{"type": "function", "function": {"name": "get_weather"}}],
              "messages": [{"role": "user", "content": "weather please"},
                           {"role": "assistant", "content": None,
                            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {}}}]},
                           {"role": "tool", "content": "sunny"},
                           {"role": "assistant", "content": "sunny"}]}
    src = tmp_path / "tools.jsonl"
    src.write_text(json.dumps(record) + "\n")
    info = data.prepare(target, src, tmp_path / "out", echo=False)
    # Qwen3's template renders the tool-calling turn without its empty thinking block once more turns
    # follow: the final answer's context is that rendering, so the tool call is a sample of its own
    assert info.samples == 2 and info.skipped == 0 and info.changed == 1
    from datasets import load_from_disk

    call, final = load_from_disk(str(tmp_path / "out")).with_format(None)
    tok = build_tokenizer()
    words = toks(tok, final["input_ids"])
    assert words[:8] == ["<|im_start|>", "system", "\n", "#", "Tools", "<tools>", "get_weather", "</tools>"]
    empty_think = ["<think>", "\n\n", "</think>", "\n\n"]  # the template's block for a turn without reasoning
    assert [toks(tok, s) for s in spans(call["input_ids"], call["loss_mask"])] == [
        empty_think + ["<tool_call>", "\n", "get_weather", "\n", "</tool_call>", "<|im_end|>"]]
    assert [toks(tok, s) for s in spans(final["input_ids"], final["loss_mask"])] == [empty_think + ["sunny", "<|im_end|>"]]
    assert final["input_ids"] == render(tok, record["messages"], tools=record["tools"])[:-1]
    assert words.count("<tool_response>") == 1 and "sunny" in words[: words.index("</tool_response>")]
    # keep: one sample, both answers as written
    info = data.prepare(target, src, tmp_path / "keep", echo=False, history_reasoning="keep")
    row = load_from_disk(str(tmp_path / "keep")).with_format(None)[0]
    assert info.samples == 1 and len(spans(row["input_ids"], row["loss_mask"])) == 2


def test_a_template_that_changes_the_closing_is_reported(tok) -> None:
    class Odd:
        def __init__(self, inner):
            self.inner = inner

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kw):
            text = self.inner.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
            return text.replace("<|im_end|>\n<|im_start|>user", "\n<|im_start|>user")  # closes differently mid-chat

        def __call__(self, *a, **kw):
            return self.inner(*a, **kw)

    sample = Sample(Template(Odd(tok)), [conv(("user", "hello")), conv(("user", "again"))])
    with pytest.raises(TurnError, match="ends an assistant turn differently"):
        sample.add(Answer(token_ids=[1], stopped=True))


# ---------------------------------------------------------------- --regenerate, transformers backend


def _prepare(target, tmp_path, records, name="o", **kw):
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    info = data.prepare(target, src, tmp_path / name, regenerate=True, echo=False, **kw)
    from datasets import load_from_disk

    return info, load_from_disk(str(tmp_path / name)).with_format(None)


def test_regenerated_answers_are_the_targets_token_ids_reasoning_and_special_tokens_included(tmp_path, target,
                                                                                              tok) -> None:
    two_turns = {"messages": conv(("user", "hello"), ("assistant", "ignored"), ("user", "again"))}
    info, ds = _prepare(target, tmp_path, [{"messages": conv(("user", "hello there"))}, two_turns],
                        history_reasoning="keep")
    assert info.samples == 2 and info.truncated == 0 and info.backend == "hf"
    assert info.answers == 3 and info.answers_cut == 0 and info.max_new_tokens_keep_99 == len(ANSWER)
    one, two = ds[0], ds[1]
    assert [toks(tok, s) for s in spans(one["input_ids"], one["loss_mask"])] == [ANSWER]
    assert one["input_ids"] == render(tok, conv(("user", "hello there")), add_generation_prompt=True) + \
        tok.convert_tokens_to_ids(ANSWER)
    # two turns, one sample: turn 2's context is turn 1's as the target produced it (keep)
    assert [toks(tok, s) for s in spans(two["input_ids"], two["loss_mask"])] == [ANSWER, ANSWER]
    words = toks(tok, two["input_ids"])
    assert words.count("<think>") == 2 and "ignored" not in words and "<unk>" not in words
    # drop: turn 2 was answered in the context the template would serve (reasoning of turn 1 gone);
    # turn 1, as produced, is a sample of its own
    info, ds = _prepare(target, tmp_path, [two_turns], name="drop", history_reasoning="drop")
    first, row = ds[0], ds[1]
    assert first["input_ids"] == render(tok, conv(("user", "hello")), add_generation_prompt=True) + \
        tok.convert_tokens_to_ids(ANSWER) and sum(first["loss_mask"]) == len(ANSWER)
    assert [toks(tok, s) for s in spans(row["input_ids"], row["loss_mask"])] == [ANSWER]  # only turn 2
    served = render(tok, conv(("user", "hello"), ("assistant", REASONED), ("user", "again")), add_generation_prompt=True)
    assert row["input_ids"] == served + tok.convert_tokens_to_ids(ANSWER)
    assert json.loads((tmp_path / "drop" / "prepared.json").read_text())["history_reasoning"] == "drop"
    # template (the default): turn 2's context is the template's rendering of turn 1 as a server returns
    # it (decoded, its reasoning in reasoning_content)
    info, ds = _prepare(target, tmp_path, [two_turns], name="template")
    assert info.history_reasoning == "template" and info.samples == 2 and info.changed == 1
    row = ds[1]
    answer = tok.convert_tokens_to_ids(ANSWER)
    returned = {"role": "assistant", "reasoning_content": tok.decode(answer[1:3]), "content": tok.decode(answer[4:-1])}
    served = render(tok, [*conv(("user", "hello")), returned, *conv(("user", "again"))], add_generation_prompt=True)
    assert row["input_ids"] == served + answer and "hmm" not in toks(tok, served)


def test_a_cut_answer_gets_no_end_of_turn_it_never_produced(tmp_path, target, tok) -> None:
    records = [{"messages": conv(("user", "hello"))},
               {"messages": conv(("user", "hello"), ("assistant", "x"), ("user", "again"))}]
    info, ds = _prepare(target, tmp_path, records, max_new_tokens=4, history_reasoning="keep")
    assert info.truncated == 2 and info.samples == 2
    assert info.answers == info.answers_cut == 3 and info.answers_cut_share == 1.0
    assert info.max_new_tokens_keep_99 is None  # the cut answers' full lengths are unknown
    assert data.report_lines(info)[-1].startswith("100% of regenerated answers (3) cut at --max-new-tokens 4; their "
                                                  "full lengths are unknown")
    assert toks(tok, ds[0]["input_ids"])[-4:] == ANSWER[:4] and ds[0]["loss_mask"][-4:] == [1] * 4
    words, mask = toks(tok, ds[1]["input_ids"]), ds[1]["loss_mask"]
    assert [toks(tok, s) for s in spans(ds[1]["input_ids"], mask)] == [ANSWER[:4], ANSWER[:4]]
    cut = words.index("</think>") + 1  # the glue that lets the conversation go on is context (mask 0)
    assert words[cut:cut + 2] == ["<|im_end|>", "\n"] and mask[cut:cut + 2] == [0, 0]


def test_thinking_switch_and_sampling_options(tmp_path, target, tok) -> None:
    info, ds = _prepare(target, tmp_path, [{"messages": conv(("user", "hello"))}], name="nothink",
                        template_kwargs={"enable_thinking": False})
    assert [toks(tok, s) for s in spans(ds[0]["input_ids"], ds[0]["loss_mask"])] == [["yes", "done", "<|im_end|>"]]
    assert info.template_kwargs == {"enable_thinking": False}
    from eagle.serving.client import Sampling

    info, ds = _prepare(target, tmp_path, [{"messages": conv(("user", "hello"))}], name="sampled", n=2,
                        sampling=Sampling(temperature=0.7, top_p=0.9, seed=1))
    assert info.samples == 2 and info.n == 2 and info.sampling["temperature"] == 0.7
    with pytest.raises(EagleError, match="identical copies"):
        _prepare(target, tmp_path, [{"messages": conv(("user", "hello"))}], name="bad", n=2)
