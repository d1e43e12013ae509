"""`eagle prepare`: record parsing, assistant-only loss masks, bad records, regeneration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eagle import toy
from eagle.commands import prepare as prepare_verb
from eagle.common import EagleError
from eagle.data import prepare as data

W = toy.make_words(12)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    """A 'model' dir holding only the toy tokenizer: enough for prepare without --regenerate."""
    d = tmp_path_factory.mktemp("tok")
    toy.build_tokenizer(2048).save_pretrained(str(d))
    return d


@pytest.fixture(scope="module")
def tok(tok_dir):
    return data.load_tokenizer(tok_dir)


def msgs(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": r, "content": c} for r, c in pairs]


# ---------------------------------------------------------------- parsing


def test_parse_openai_and_sharegpt_agree():
    fmt1, m1 = data.parse_record({"messages": msgs(("system", "s"), ("user", "u"), ("assistant", "a"))})
    fmt2, m2 = data.parse_record({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "u"},
                                                    {"from": "gpt", "value": "a"}]})
    assert (fmt1, fmt2) == ("messages", "conversations")
    assert m1 == m2 == msgs(("system", "s"), ("user", "u"), ("assistant", "a"))


def test_parse_text_parts_are_joined():
    _, m = data.parse_record({"messages": [{"role": "user", "content": [{"type": "text", "text": "a "},
                                                                         {"type": "text", "text": "b"}]}]})
    assert m == msgs(("user", "a b"))


@pytest.mark.parametrize("obj, why", [
    ([1, 2], "expected a JSON object"),
    ({"text": "hi"}, "no 'messages'"),
    ({"messages": []}, "non-empty list"),
    ({"messages": [{"role": "user"}]}, "missing 'content'"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "unknown role 'wizard'"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "no user turn"),
    ({"conversations": [{"from": "human", "value": 3}]}, "content must be a string"),
    ({"conversations": [{"value": "x"}]}, "missing 'from'"),
])
def test_parse_rejects_bad_records(obj, why):
    with pytest.raises(data.RecordError, match=why):
        data.parse_record(obj)


def test_read_records_reports_line_numbers(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join([
        json.dumps({"messages": msgs(("user", W[0]), ("assistant", W[1]))}),
        "{not json",
        "",
        json.dumps({"messages": msgs(("robot", W[0]))}),
        json.dumps({"conversations": [{"from": "human", "value": W[2]}, {"from": "gpt", "value": W[3]}]}),
    ]) + "\n")
    good, bad = data.read_records(f)
    assert [r.line for r in good] == [1, 5] and [r.fmt for r in good] == ["messages", "conversations"]
    assert [(n, reason) for n, reason, _ in bad] == [(2, "invalid JSON"), (4, "unknown role")]
    assert "invalid JSON (" in bad[0][2] and "unknown role 'robot'" in bad[1][2]


def test_a_byte_order_mark_starts_no_record_and_text_parts_are_content(tmp_path):
    """A JSONL file saved with a UTF-8 BOM (as Windows tools write it) keeps its first record, and
    OpenAI messages whose content is a list of text parts (what chat APIs export) are read, in
    prepare's records and in the prompts every decoder sends."""
    from eagle.prompts import read_prompt_messages

    parts = [{"type": "text", "text": W[0] + " "}, {"type": "text", "text": W[1]}]
    f = tmp_path / "d.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + "\n".join([
        json.dumps({"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": W[2]}]}),
        json.dumps({"messages": msgs(("user", W[3]), ("assistant", W[4]))}),
    ]).encode() + b"\n")
    good, bad = data.read_records(f)
    assert bad == [] and [r.line for r in good] == [1, 2]
    assert good[0].messages[0]["content"] == f"{W[0]} {W[1]}"
    prompts = read_prompt_messages(f)
    assert prompts == [[{"role": "user", "content": f"{W[0]} {W[1]}"}], [{"role": "user", "content": W[3]}]]


def test_no_usable_records_names_each_records_reason(tmp_path, tok_dir):
    src = tmp_path / "bad.jsonl"
    src.write_text("{not json\n" + json.dumps({"messages": msgs(("robot", W[0]))}) + "\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(prepare_verb.command, ["--model", str(tok_dir), "--data", str(src), "--out", str(out)])
    assert r.exit_code == 1 and not out.exists()
    assert "no usable records" in r.stderr and f"{src}:1: invalid JSON" in r.stderr
    with pytest.raises(EagleError) as refused:  # quiet (no warnings printed): the error itself says why
        data.prepare(tok_dir, src, out, echo=False)
    assert f"{src}:1: invalid JSON" in str(refused.value) and not out.exists()
    assert f"{src}:2: messages[0]: unknown role 'robot'" in str(refused.value)


def test_answer_points():
    conv = msgs(("system", "s"), ("user", "a"), ("assistant", "b"), ("user", "c"), ("user", "d"))
    assert data.answer_points(conv) == [msgs(("system", "s"), ("user", "a")), msgs(("user", "c"), ("user", "d"))]
    assert data.answer_points(msgs(("assistant", "hi"), ("user", "a"), ("assistant", "b"))) == [msgs(("user", "a"))]
    assert data.answer_points(msgs(("user", "a"), ("assistant", "b"), ("system", "s"))) == [msgs(("user", "a"))]


# ---------------------------------------------------------------- loss mask


def test_mask_covers_exactly_the_assistant_tokens(tok):
    conv = msgs(("system", W[0]), ("user", f"{W[1]} {W[2]}"), ("assistant", f"{W[3]} {W[4]} {W[5]}"),
                ("user", W[6]), ("assistant", f"{W[7]} {W[8]}"))
    ids, mask = data.tokenize_conversation(tok, conv)
    toks = tok.convert_ids_to_tokens(ids)
    masked = [t for t, m in zip(toks, mask, strict=True) if m]
    assert masked == [W[3], W[4], W[5], "<|end|>", W[7], W[8], "<|end|>"]
    # every masked span starts right after <|assistant|>
    starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
    assert [toks[i - 1] for i in starts] == ["<|assistant|>", "<|assistant|>"]
    assert len(ids) == len(mask) == len(toks)


def test_mask_without_assistant_turn_is_an_error(tok):
    with pytest.raises(data.RecordError, match="--regenerate"):
        data.tokenize_conversation(tok, msgs(("user", W[0])))


# ---------------------------------------------------------------- the command


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def mixed_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "mixed.jsonl", [
        json.dumps({"messages": msgs(("user", W[0]), ("assistant", f"{W[1]} {W[2]}"))}),
        json.dumps({"conversations": [{"from": "human", "value": W[3]}, {"from": "gpt", "value": W[4]}]}),
        '{"messages": [',
        json.dumps({"messages": msgs(("user", W[5]))}),  # prompt-only: bad without --regenerate
        json.dumps({"messages": msgs(("user", W[6]), ("assistant", W[7]), ("user", W[8]), ("assistant", W[9]))}),
    ])


def test_prepare_both_formats_skips_and_reports_bad_lines(tmp_path, tok_dir, tok):
    src = mixed_file(tmp_path)
    r = CliRunner().invoke(prepare_verb.command, ["--model", str(tok_dir), "--data", str(src), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert f"{src}:3: invalid JSON" in r.stderr
    assert f"{src}:4: no assistant turn" in r.stderr
    assert "skipped 2 bad record(s)" in r.stderr
    from datasets import load_from_disk

    ds = load_from_disk(str(tmp_path / "out"))
    assert ds.column_names == ["input_ids", "loss_mask", "seq_len"] or set(ds.column_names) == {"input_ids", "loss_mask", "seq_len"}
    assert len(ds) == 3
    row = ds[1]
    assert isinstance(row["input_ids"], torch.Tensor) and row["input_ids"].dtype == torch.int64
    assert int(row["seq_len"]) == row["input_ids"].shape[0] == row["loss_mask"].shape[0]
    masked = [t for t, m in zip(tok.convert_ids_to_tokens(row["input_ids"].tolist()), row["loss_mask"].tolist(), strict=True) if m]
    assert masked == [W[4], "<|end|>"]
    info = json.loads((tmp_path / "out" / "prepared.json").read_text())
    assert info["fmt_counts"] == {"messages": 3, "conversations": 1} and info["skipped"] == 2
    assert info["samples"] == 3 and info["loss_tokens"] == 3 + 2 + 4


def test_prepare_on_bad_record_fail_writes_nothing(tmp_path, tok_dir):
    src = mixed_file(tmp_path)
    out = tmp_path / "out"
    r = CliRunner().invoke(prepare_verb.command, ["--model", str(tok_dir), "--data", str(src), "--out", str(out),
                                          "--on-bad-record", "fail"])
    assert r.exit_code == 1
    assert f"{src}:3: invalid JSON" in r.stderr and "nothing written" in r.stderr
    assert not out.exists()


def test_prepare_limit_and_max_len(tmp_path, tok_dir):
    src = mixed_file(tmp_path)
    info = data.prepare(tok_dir, src, tmp_path / "o", limit=2, max_len=6, echo=False)
    assert info.samples == 2
    from datasets import load_from_disk

    assert max(load_from_disk(str(tmp_path / "o"))["seq_len"]) == 6


@pytest.mark.parametrize("args, why", [
    (["--data", "missing.jsonl"], "no such file"),
    (["--model", "missing-model"], "no such directory"),
])
def test_prepare_bad_paths(tmp_path, tok_dir, args, why):
    src = mixed_file(tmp_path)
    base = {"--model": str(tok_dir), "--data": str(src), "--out": str(tmp_path / "o")}
    base[args[0]] = str(tmp_path / args[1])
    r = CliRunner().invoke(prepare_verb.command, [x for kv in base.items() for x in kv])
    assert r.exit_code == 1 and why in r.stderr and "Traceback" not in r.output


def test_prepare_refuses_foreign_out_dir(tmp_path, tok_dir):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(EagleError, match="not made by `eagle prepare`"):
        data.prepare(tok_dir, mixed_file(tmp_path), out, echo=False)
    assert (out / "notes.txt").read_text() == "mine"


def test_prepare_rerun_keeps_identical_data_and_replaces_changed(tmp_path, tok_dir):
    src = mixed_file(tmp_path)
    out = tmp_path / "o"
    data.prepare(tok_dir, src, out, echo=False)
    (out / "hidden_states").mkdir()
    (out / "hidden_states" / "hs_0.safetensors").write_bytes(b"x")
    data.prepare(tok_dir, src, out, echo=False)  # same rows: hidden states kept
    assert (out / "hidden_states" / "hs_0.safetensors").exists()
    data.prepare(tok_dir, src, out, limit=1, echo=False)  # different rows: replaced as a whole
    assert not (out / "hidden_states").exists()
    assert len(list(tmp_path.glob(".*"))) == 0  # no temp dirs left behind


@pytest.mark.slow
def test_regenerate_uses_the_targets_greedy_answers(tmp_path, toy_target):
    from transformers import AutoTokenizer, LlamaForCausalLM

    prompts = toy.make_prompts(3, salt=7)
    prompts.append({"messages": msgs(("user", prompts[0]["messages"][-1]["content"]), ("assistant", "ignored"),
                                     ("user", prompts[1]["messages"][-1]["content"]))})
    src = write_jsonl(tmp_path / "p.jsonl", [json.dumps(p) for p in prompts])
    out = tmp_path / "o"
    info = data.prepare(toy_target, src, out, regenerate=True, max_new_tokens=12, batch_size=2, echo=False)
    assert info.samples == 4 and info.regenerated
    tok = AutoTokenizer.from_pretrained(str(toy_target))
    model = LlamaForCausalLM.from_pretrained(str(toy_target)).eval()
    from datasets import load_from_disk

    ds = load_from_disk(str(out)).with_format(None)
    cut = 0
    for k in range(3):  # single-turn: the masked tokens are exactly the unbatched greedy continuation
        prompt_ids = data.render_ids(tok, prompts[k]["messages"], add_generation_prompt=True)
        gen = model.generate(torch.tensor([prompt_ids]), max_new_tokens=12, do_sample=False)[0, len(prompt_ids):].tolist()
        ids, mask = ds["input_ids"][k], ds["loss_mask"][k]
        assert ids[: len(prompt_ids)] == prompt_ids
        masked = [t for t, m in zip(ids, mask, strict=True) if m]
        assert masked == gen and ids == prompt_ids + gen  # as produced: no end-of-turn appended to a cut answer
        cut += tok.eos_token_id not in gen
    assert info.truncated >= cut > 0
    # multi-turn: two answered turns, the old assistant text is gone
    toks = tok.convert_ids_to_tokens(ds["input_ids"][3])
    assert toks.count("<|assistant|>") == 2 and "<unk>" not in toks
    assert sum(1 for a, b in zip(ds["loss_mask"][3], ds["loss_mask"][3][1:], strict=False) if b and not a) == 2
