"""Issue 46: reasoning models' data kept whole. Earlier answers appear in later contexts exactly as the
target's own template (and so its server) renders them, turn by turn; every record changed, cut or
skipped is counted by reason; a field the template would silently lose is refused.

Templates: a Kimi-K2.5-style one written here (the latest assistant turn `<think>reasoning</think>answer`,
earlier ones `<think></think>answer`), Kimi-K2.5's own structure (every assistant turn up to the last
one rendered `<think></think>answer`: the latest turn's reasoning too), and the Qwen3-style template
of tests/support/_reasoning_target.py (earlier turns' thinking stripped; the qwen3 toy's template has
no thinking).
"""

from __future__ import annotations

import json
from pathlib import Path

import _reasoning_target as rt
import pytest
from click.testing import CliRunner

from eagle import toy
from eagle.commands import prepare as prepare_verb
from eagle.common import EagleError
from eagle.data import prepare as data
from eagle.data.turns import Answer, ReasoningTags, Template, history_ids, recorded_sample

K25_STYLE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}<|im_system|>system<|im_middle|>{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if loop.last -%}<think>{{ m.reasoning_content or '' }}</think>{%- else -%}<think></think>{%- endif -%}"
    "{{ m.content }}<|im_end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
# Kimi-K2.5's own split: the assistant turns up to the last one are history (`<think></think>`), only
# turns after it (a tool-call loop) keep their reasoning: a finished conversation loses the last answer's.
K25_OWN = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'assistant' and not m.tool_calls -%}{%- set ns.last = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if loop.index0 <= ns.last -%}<think></think>{%- else -%}<think>{{ m.reasoning_content or '' }}</think>"
    "{%- endif -%}{{ m.content }}<|im_end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
KIMI_SPECIAL = ["<|endoftext|>", "<|im_end|>", "<unk>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                "<|im_middle|>"]
KIMI_WORDS = ["user", "assistant", "system", "hello", "again", "hmm", "so", "yes", "done", "be", "brief", "long"]


def kimi_tokenizer(template: str):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(KIMI_SPECIAL + ["<think>", "</think>"] + KIMI_WORDS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens([AddedToken(t, normalized=False) for t in KIMI_SPECIAL])
    tk.add_tokens([AddedToken(t, normalized=False) for t in ("<think>", "</think>")])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<|endoftext|>",
                                   eos_token="<|im_end|>", model_max_length=512)
    fast.chat_template = template
    return fast


def model_dir(tmp: Path, tok) -> Path:
    """A 'model' dir holding only the tokenizer: enough for prepare without --regenerate."""
    tok.save_pretrained(str(tmp))
    return tmp


def render(tok, messages, **kw) -> list[int]:
    return list(tok(tok.apply_chat_template(messages, tokenize=False, **kw), add_special_tokens=False)["input_ids"])


def spans(tok, ids: list[int], mask: list[int]) -> list[list[str]]:
    out: list[list[str]] = []
    for i, m in enumerate(mask):
        if m and (i == 0 or not mask[i - 1]):
            out.append([])
        if m:
            out[-1].append(tok.convert_ids_to_tokens(ids[i]))
    return out


A1 = {"role": "assistant", "content": "yes done", "reasoning_content": "hmm so"}
A2 = {"role": "assistant", "content": "yes", "reasoning_content": "hmm"}
TWO_TURNS = [{"role": "user", "content": "hello"}, A1, {"role": "user", "content": "again"}, A2]


def prepared(model: Path, tmp: Path, records: list, name: str = "o", **kw):
    src = tmp / f"{name}.jsonl"
    src.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records))
    info = data.prepare(model, src, tmp / name, echo=False, **kw)
    from datasets import load_from_disk

    return info, load_from_disk(str(tmp / name)).with_format(None)


# ---------------------------------------------------------------- turn by turn, as the server renders


def test_k25_style_two_turns_equal_the_templates_rendering_turn_by_turn(tmp_path) -> None:
    tok = kimi_tokenizer(K25_STYLE)
    info, ds = prepared(model_dir(tmp_path / "m", tok), tmp_path, [{"messages": TWO_TURNS}])
    assert info.history_reasoning == "template" and info.samples == 2 and info.skipped == 0
    one, two = ds[0], ds[1]
    # turn 1: what the model wrote after its generation prompt, reasoning included
    assert one["input_ids"] == render(tok, TWO_TURNS[:2])
    assert spans(tok, one["input_ids"], one["loss_mask"]) == [["<think>", "hmm", "so", "</think>", "yes", "done",
                                                              "<|im_end|>"]]
    # turn 2: the server's context (turn 1 rendered <think></think>answer), then the answer
    context = render(tok, TWO_TURNS[:3], add_generation_prompt=True)
    assert two["input_ids"] == render(tok, TWO_TURNS) == context + tok.convert_tokens_to_ids(
        ["<think>", "hmm", "</think>", "yes", "<|im_end|>"])
    assert tok.convert_ids_to_tokens(context).count("<think>") == 1  # the empty block of turn 1
    assert spans(tok, two["input_ids"], two["loss_mask"]) == [["<think>", "hmm", "</think>", "yes", "<|im_end|>"]]
    assert sum(two["loss_mask"][:len(context)]) == 0
    assert info.changed == 1 and info.changed_reasons == {
        "split: earlier answers' reasoning is not in later contexts": 1}
    # empty reproduces the same server; keep and drop do not
    _, empty = prepared(tmp_path / "m", tmp_path, [{"messages": TWO_TURNS}], name="empty", history_reasoning="empty")
    assert empty["input_ids"] == ds["input_ids"] and empty["loss_mask"] == ds["loss_mask"]
    _, keep = prepared(tmp_path / "m", tmp_path, [{"messages": TWO_TURNS}], name="keep", history_reasoning="keep")
    assert len(keep) == 1 and tok.convert_ids_to_tokens(keep[0]["input_ids"]).count("hmm") == 2  # turn 1 kept whole
    _, drop = prepared(tmp_path / "m", tmp_path, [{"messages": TWO_TURNS}], name="drop", history_reasoning="drop")
    assert drop[1]["input_ids"] != render(tok, TWO_TURNS)  # no <think></think> left: not what K2.5 serves


def test_qwen3_style_two_turns_equal_the_templates_rendering_turn_by_turn(tmp_path) -> None:
    tok = rt.build_tokenizer()
    info, ds = prepared(model_dir(tmp_path / "m", tok), tmp_path, [{"messages": TWO_TURNS}])
    assert info.samples == 2
    one, two = ds[0], ds[1]
    assert one["input_ids"] == render(tok, TWO_TURNS[:2])[:-1]  # (the template's "\n" after the last turn)
    assert spans(tok, one["input_ids"], one["loss_mask"]) == [["<think>", "\n", "hmm", "so", "\n", "</think>", "\n\n",
                                                              "yes", "done", "<|im_end|>"]]
    context = render(tok, TWO_TURNS[:3], add_generation_prompt=True)
    assert two["input_ids"] == render(tok, TWO_TURNS)[:-1] and two["input_ids"][:len(context)] == context
    assert tok.convert_ids_to_tokens(context).count("<think>") == 0  # Qwen3 strips turn 1's thinking
    assert spans(tok, two["input_ids"], two["loss_mask"]) == [["<think>", "\n", "hmm", "\n", "</think>", "\n\n", "yes",
                                                              "<|im_end|>"]]
    # drop is Qwen3's server too; keep gives one sample whose turn 2 follows a context no server renders
    _, drop = prepared(tmp_path / "m", tmp_path, [{"messages": TWO_TURNS}], name="drop", history_reasoning="drop")
    assert drop["input_ids"] == ds["input_ids"] and drop["loss_mask"] == ds["loss_mask"]
    _, keep = prepared(tmp_path / "m", tmp_path, [{"messages": TWO_TURNS}], name="keep", history_reasoning="keep")
    assert len(keep) == 1 and len(spans(tok, keep[0]["input_ids"], keep[0]["loss_mask"])) == 2
    # a template that keeps earlier answers as they were written: one sample, nothing changed
    plain = recorded_sample(Template(toy.build_tokenizer(64)), [{"role": "user", "content": "a"},
                                                                {"role": "assistant", "content": "b"},
                                                                {"role": "user", "content": "c"},
                                                                {"role": "assistant", "content": "d"}],
                            history="template")
    assert len(plain.samples()) == 1


def test_drop_and_empty_edit_the_reasoning_block_opened_in_the_answer_or_in_the_prompt(tmp_path) -> None:
    tags = ReasoningTags(open_id=1, close_id=2, blank_ids=frozenset({9}))
    assert history_ids([1, 5, 6, 2, 9, 7, 3], "drop", tags) == [7, 3]
    assert history_ids([1, 5, 6, 2, 9, 7, 3], "empty", tags) == [1, 2, 9, 7, 3]  # <think></think> answer
    assert history_ids([5, 6, 2, 7, 3], "empty", tags) == [2, 7, 3]  # <think> was in the generation prompt
    assert history_ids([7, 3], "empty", tags) == [7, 3] == history_ids([7, 3], "drop", tags)  # no reasoning
    # the toys' tokenizer has no <think>: it would read it as <unk>; drop and empty refuse, naming the tag
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
                   + "\n")
    toy_dir = model_dir(tmp_path / "toy", toy.build_tokenizer(64))
    with pytest.raises(EagleError, match="--history-reasoning empty: '<think>' is not a single token"):
        data.prepare(toy_dir, src, tmp_path / "o", echo=False, history_reasoning="empty")
    assert data.prepare(toy_dir, src, tmp_path / "o", echo=False).samples == 1  # template: no tags needed


def test_k25_style_regenerated_turn_two_reads_what_a_k25_server_sends(tmp_path) -> None:
    """--regenerate under the K2.5-style template: the target's turn-1 answer, returned as a server
    returns it (reasoning_content apart), is rendered <think></think>answer in turn 2's context;
    `empty`'s token edit gives the same context."""
    tok = kimi_tokenizer(K25_STYLE)
    machine = {"<|im_middle|>": "<think>", "<think>": "hmm", "hmm": "so", "so": "</think>", "</think>": "yes",
               "yes": "done", "done": "<|im_end|>"}
    target = rt.build_target(tmp_path / "kimi", tok, machine)
    answer = tok.convert_tokens_to_ids(["<think>", "hmm", "so", "</think>", "yes", "done", "<|im_end|>"])
    user = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "again"}]
    info, ds = prepared(target, tmp_path, [{"messages": user}], regenerate=True)
    assert info.samples == 2 and info.answers == 2 and info.answers_cut == 0 and info.max_new_tokens_keep_99 == 7
    assert ds[0]["input_ids"] == render(tok, user[:1], add_generation_prompt=True) + answer
    served = render(tok, [user[0], {"role": "assistant", "content": "yes done", "reasoning_content": "hmm so"},
                          user[2]], add_generation_prompt=True)
    assert tok.convert_ids_to_tokens(served)[5:13] == ["<|im_assistant|>", "assistant", "<|im_middle|>", "<think>",
                                                       "</think>", "yes", "done", "<|im_end|>"]
    assert ds[1]["input_ids"] == served + answer and spans(tok, ds[1]["input_ids"], ds[1]["loss_mask"]) == [
        tok.convert_ids_to_tokens(answer)]
    _, empty = prepared(target, tmp_path, [{"messages": user}], name="empty", regenerate=True, history_reasoning="empty")
    assert empty["input_ids"] == ds["input_ids"] and empty["loss_mask"] == ds["loss_mask"]
    # an answer cut while reasoning is all reasoning (as vLLM's reasoning parsers return it)
    cut = Template(tok).answer_message(Answer(token_ids=answer[:3], stopped=False), data.reasoning_tags(tok, "<think>,</think>"))
    assert cut == {"role": "assistant", "reasoning_content": "hmm so", "content": ""}
    # generation stopped by --max-len: a cut sample whose full length is unknown, no answer cut at --max-new-tokens
    head = len(render(tok, user[:1], add_generation_prompt=True))
    info, ds = prepared(target, tmp_path, [{"messages": user}], name="short", regenerate=True, max_len=head + 3)
    assert info.samples == 1 and ds[0]["input_ids"] == render(tok, user[:1], add_generation_prompt=True) + answer[:3]
    assert info.cut_at_max_len == 1 and info.cut_share == 1.0 and info.max_len_keep_99 is None
    assert info.answers_cut == 0 and info.truncated == 0
    assert data.report_lines(info) == [f"100% of samples (1) cut at --max-len {head + 3}; their full lengths are unknown "
                                       f"(generation stopped there): --max-len above {head + 3} is needed to keep 99% "
                                       "whole"]


# ---------------------------------------------------------------- counted by reason


def test_changed_cut_and_skipped_records_are_counted_by_reason(tmp_path) -> None:
    tok = kimi_tokenizer(K25_STYLE)
    model = model_dir(tmp_path / "m", tok)
    one_turn = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "yes"}]
    long = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": " ".join(["long"] * 40)}]
    records = [{"messages": TWO_TURNS}, {"messages": one_turn}, "{not json\n",
               {"messages": [{"role": "user", "content": "hello"}]}, {"messages": long},
               {"messages": [{"role": "robot", "content": "x"}]}]
    metrics = tmp_path / "metrics.json"
    src = tmp_path / "d.jsonl"
    src.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records))
    r = CliRunner().invoke(prepare_verb.command, ["--model", str(model), "--data", str(src), "--out",
                                                  str(tmp_path / "o"), "--max-len", "30", "--json"],
                           env={"RUNBOOK_METRICS": str(metrics)})
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["records"] == 6 and info["samples"] == 4 and info["skipped"] == 3
    assert info["skipped_reasons"] == {"invalid JSON": 1, "no assistant turn": 1, "unknown role": 1}
    assert info["changed"] == 1 and list(info["changed_reasons"].values()) == [1]
    long_len = len(render(tok, long))
    assert info["cut_at_max_len"] == 1 and info["cut_share"] == 0.25 and info["max_len_keep_99"] == long_len
    assert f"25% of samples (1) cut at --max-len 30; --max-len {long_len} keeps 99% whole" in r.stderr
    assert "1 record(s) changed: split: earlier answers" in r.stderr
    m = json.loads(metrics.read_text())
    assert m["prepare_skipped"] == 3 and m["prepare_skipped_invalid_json"] == 1 and m["prepare_changed"] == 1
    assert m["prepare_cut_at_max_len"] == 1 and m["prepare_max_len_keep_99"] == long_len
    table = CliRunner().invoke(prepare_verb.command, ["--model", str(model), "--data", str(src), "--out",
                                                      str(tmp_path / "o"), "--max-len", "30"])
    assert "skipped: no assistant turn" in table.stdout and f"--max-len {long_len} keeps 99% whole" in table.stdout


def test_keep_99_and_its_unknown_case() -> None:
    assert data.keep_99(list(range(1, 101)), [False] * 100) == 99
    assert data.keep_99([5] * 98 + [9, 9], [False] * 98 + [True, True]) is None  # 2% cut: their lengths unknown
    assert data.keep_99([5] * 199 + [9], [False] * 199 + [True]) == 5
    assert "above 256 is needed" in data.cut_message("answers", "--max-new-tokens", 256, 2, 0.02, None)


# ---------------------------------------------------------------- a field the template would lose


def test_a_field_the_template_never_renders_is_refused_naming_field_record_and_fix(tmp_path) -> None:
    tok = kimi_tokenizer(K25_OWN)
    model = model_dir(tmp_path / "m", tok)
    one_turn = [{"role": "user", "content": "hello"}, A1]
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "hello"},
                                            {"role": "assistant", "content": "yes"}]}) + "\n"
                   + json.dumps({"messages": one_turn}) + "\n")
    out = tmp_path / "o"
    with pytest.raises(EagleError) as refused:
        data.prepare(model, src, out, echo=False)
    msg = str(refused.value)
    assert f"{src}:2: messages[1] carries reasoning_content" in msg and f"{src}:1:" not in msg
    assert "--accept-lost-field reasoning_content" in msg and "--regenerate" in msg and not out.exists()
    r = CliRunner().invoke(prepare_verb.command, ["--model", str(model), "--data", str(src), "--out", str(out)])
    assert r.exit_code == 1 and "carries reasoning_content" in r.stderr and not out.exists()
    info = data.prepare(model, src, out, echo=False, accept_lost_fields=("reasoning_content",))
    assert info.samples == 2 and info.changed == 1
    assert info.changed_reasons == {"reasoning_content not rendered by the chat template (accepted)": 1}
    # the toys' template (every --arch, kimi_k25 included) renders no reasoning at all
    toy_dir = model_dir(tmp_path / "toy", toy.build_tokenizer(64))
    with pytest.raises(EagleError, match=r"d.jsonl:2: messages\[1\] carries reasoning_content"):
        data.prepare(toy_dir, src, tmp_path / "t", echo=False)
