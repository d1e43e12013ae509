"""The toy language, tokenizer, target and successor (`eagle toy-target`)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eagle import toy
from eagle.commands import toy_target
from eagle.common import EagleError

REPO = Path(__file__).resolve().parents[2]
TINY = toy.ToyConfig(num_layers=8, hidden=32, intermediate=64, heads=2, kv_heads=1, vocab=256, active=40,
                     steps=4, batch=4)


def test_words_are_distinct_and_seed_independent():
    words = toy.make_words(2042)
    assert len(set(words)) == 2042
    assert words == toy.make_words(2042)
    assert toy.vocab_tokens(2048)[: len(toy.SPECIALS)] == toy.SPECIALS


def test_chain_is_deterministic_per_seed_and_well_formed():
    a, b, c = toy.make_chain(2048, 400, 0), toy.make_chain(2048, 400, 0), toy.make_chain(2048, 400, 1)
    assert a == b and a != c
    assert len(a.active) == 400
    for w, succ in a.succ.items():
        assert len(set(succ)) == 3 and w not in succ and set(succ) <= set(a.active)
    # the first successor dominates: ~0.75 of transitions
    rng = random.Random(0)
    w = a.active[0]
    hits = sum(a.step(w, rng) == a.succ[w][0] for _ in range(4000))
    assert 0.72 < hits / 4000 < 0.78


def test_shift_changes_the_asked_fraction_of_words():
    base = toy.make_chain(2048, 400, 0)
    shifted, n = toy.shift_chain(base, 0.25, 1)
    assert n == 100
    changed = [w for w in base.active if base.succ[w] != shifted.succ[w]]
    assert 90 <= len(changed) <= 100  # a resample may rarely give the same list


def test_tokenizer_chat_template_and_roundtrip():
    tok = toy.build_tokenizer(2048)
    assert len(tok) == 2048
    w = toy.make_words(4)
    msgs = [{"role": "system", "content": f"{w[0]} {w[1]}"}, {"role": "user", "content": f"{w[2]} {w[3]}"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == f"<|system|> {w[0]} {w[1]} <|end|>\n<|user|> {w[2]} {w[3]} <|end|>\n<|assistant|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<|system|>", w[0], w[1], "<|end|>", "<|user|>", w[2], w[3],
                                              "<|end|>", "<|assistant|>"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids[1:3]) == f"{w[0]} {w[1]}"
    assert tok.eos_token == "<|end|>" and tok.pad_token == "<pad>"
    with pytest.raises(Exception, match="unknown role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_too_few_layers_refused():
    with pytest.raises(EagleError, match="at least 8"):
        toy.build_model(toy.ToyConfig(num_layers=4), toy.build_tokenizer(2048))


def test_shipped_prompt_files_match_the_generator_and_are_disjoint():
    train, heldout = toy.prompt_sets()
    files = [REPO / "plans/data/prompts.jsonl", REPO / "plans/data/prompts-heldout.jsonl"]
    got = [[json.loads(x) for x in f.read_text().splitlines()] for f in files]
    assert got == [train, heldout], "regenerate with: " + toy.write_prompt_files.__doc__.splitlines()[1].strip()
    assert len(train) == 200 and len(heldout) == 24
    assert not {json.dumps(r) for r in train} & {json.dumps(r) for r in heldout}
    assert all(r["messages"][-1]["role"] == "user" for r in train + heldout)


@pytest.mark.slow
def test_build_is_deterministic_for_a_seed(tmp_path):
    m1 = toy.build_toy_target(tmp_path / "a", TINY, echo=False)
    toy.build_toy_target(tmp_path / "b", TINY, echo=False)
    toy.build_toy_target(tmp_path / "c", TINY.model_copy(update={"seed": 1}), echo=False)
    from safetensors.torch import load_file

    a, b, c = (load_file(str(tmp_path / d / "model.safetensors")) for d in "abc")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    assert m1.config == TINY and m1.dtype == "float32"
    assert a["model.embed_tokens.weight"].dtype == torch.float32


@pytest.mark.slow
def test_toy_target_greedy_outputs_are_peaked(toy_target):
    heldout = [json.loads(x) for x in (REPO / "plans/data/prompts-heldout.jsonl").read_text().splitlines()]
    peak = toy.greedy_peakedness(toy_target, heldout[:6], max_new_tokens=24)
    # measured 0.70 top-1 / 0.54 margin (the language's own top successor has p = 0.75)
    assert peak["top1"] > 0.6
    assert peak["margin"] > 0.4
    meta = toy.read_toy_meta(toy_target)
    assert meta.final_loss < 1.3 and meta.config.num_layers >= 8


@pytest.mark.slow
def test_successor_differs_but_is_close(toy_target, toy_successor):
    from transformers import AutoTokenizer, LlamaForCausalLM

    assert (toy_target / "config.json").read_text() == (toy_successor / "config.json").read_text()
    assert (toy_target / "tokenizer.json").read_bytes() == (toy_successor / "tokenizer.json").read_bytes()
    meta = toy.read_toy_meta(toy_successor)
    assert meta.base is not None and meta.shifted_words == 100
    a = LlamaForCausalLM.from_pretrained(str(toy_target)).eval()
    b = LlamaForCausalLM.from_pretrained(str(toy_successor)).eval()
    rel = [((pa - pb).norm() / pa.norm()).item() for pa, pb in zip(a.parameters(), b.parameters(), strict=True)]
    assert 0.01 < sum(rel) / len(rel) < 0.6
    tok = AutoTokenizer.from_pretrained(str(toy_target))
    heldout = [json.loads(x) for x in (REPO / "plans/data/prompts-heldout.jsonl").read_text().splitlines()]
    agree = total = 0
    with torch.no_grad():
        for rec in heldout[:4]:
            text = tok.apply_chat_template(rec["messages"], tokenize=False, add_generation_prompt=True)
            ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
            seq = a.generate(ids, max_new_tokens=24, do_sample=False)
            pa = a(seq).logits.argmax(-1)[0, ids.shape[1] - 1 : -1]
            pb = b(seq).logits.argmax(-1)[0, ids.shape[1] - 1 : -1]
            agree += int((pa == pb).sum())
            total += pa.numel()
    # measured 0.84 on 8 prompts: a quarter of the words changed their most likely successor
    assert 0.5 < agree / total < 0.98


def test_cli_refuses_nonempty_out_and_bad_layers(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("keep me")
    runner = CliRunner()
    r = runner.invoke(toy_target.command, ["--out", str(tmp_path / "x")])
    assert r.exit_code == 1 and "error:" in r.stderr and "not empty" in r.stderr
    assert (tmp_path / "x" / "f").read_text() == "keep me"
    r = runner.invoke(toy_target.command, ["--out", str(tmp_path / "y"), "--num-layers", "4"])
    assert r.exit_code == 1 and "at least 8" in r.stderr
    r = runner.invoke(toy_target.command, ["--base", str(tmp_path / "nope"), "--out", str(tmp_path / "z")])
    assert r.exit_code == 1 and "not a toy target" in r.stderr


def test_eagle_cli_lists_toy_target():
    r = subprocess.run([sys.executable, "-m", "eagle.cli", "toy-target", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--base" in r.stdout


def test_cached_target_builds_once_and_renames_into_place(tmp_path, monkeypatch):
    calls = []
    real = toy.build_toy_target

    def counting(out, cfg, echo=False, **kw):
        calls.append(out)
        return real(out, cfg, echo=echo, **kw)

    monkeypatch.setattr(toy, "build_toy_target", counting)
    cfg = TINY.model_copy(update={"steps": 1})
    p1 = toy.cached_target(cfg, root=tmp_path)
    p2 = toy.cached_target(cfg, root=tmp_path)
    assert p1 == p2 and (p1 / toy.META_FILE).is_file()
    assert len(calls) == 1 and calls[0].name.startswith(".tmp-")
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.slow
def test_toy_target_with_eagle_cache_copies_the_cached_toy_and_its_successor(tmp_path, monkeypatch):
    """$EAGLE_CACHE: `eagle toy-target` builds each toy once per machine and copies it to --out; a
    successor of that very toy (default --steps/--shift/--seed) too; anything else is built here."""
    built: list[Path] = []
    real_target, real_successor = toy.build_toy_target, toy.build_successor

    def target(out, cfg, echo=False, **kw):
        built.append(out)
        return real_target(out, cfg, echo=echo, **kw)

    def successor(base, out, **kw):
        built.append(out)
        return real_successor(base, out, **kw)

    monkeypatch.setattr(toy, "build_toy_target", target)
    monkeypatch.setattr(toy, "build_successor", successor)
    cache = tmp_path / "cache"
    monkeypatch.setenv("EAGLE_CACHE", str(cache))
    tiny = ["--num-layers", "8", "--hidden", "32", "--intermediate", "64", "--heads", "2", "--kv-heads", "1",
            "--vocab", "256", "--active", "40", "--steps", "2"]
    runner = CliRunner()
    for out in ("a", "b"):
        r = runner.invoke(toy_target.command, ["--out", str(tmp_path / out), *tiny])
        assert r.exit_code == 0, r.output
        assert "$EAGLE_CACHE" in r.output
    assert len(built) == 1 and built[0].parent == cache  # built once, in the cache
    weights = "model.safetensors"
    assert (tmp_path / "a" / weights).read_bytes() == (tmp_path / "b" / weights).read_bytes()
    assert toy.read_toy_meta(tmp_path / "b").config.hidden == 32

    for out in ("s1", "s2"):
        r = runner.invoke(toy_target.command, ["--base", str(tmp_path / "a"), "--out", str(tmp_path / out)])
        assert r.exit_code == 0, r.output
        assert "$EAGLE_CACHE" in r.output
        assert toy.read_toy_meta(tmp_path / out).base == str(tmp_path / "a")  # as if built from --base here
    assert len(built) == 2 and built[1].parent == cache
    assert (tmp_path / "s1" / weights).read_bytes() == (tmp_path / "s2" / weights).read_bytes()
    assert (tmp_path / "s1" / weights).read_bytes() != (tmp_path / "a" / weights).read_bytes()

    # Not the default successor (--steps given): built here, not taken from the cache.
    r = runner.invoke(toy_target.command, ["--base", str(tmp_path / "a"), "--out", str(tmp_path / "s3"), "--steps", "1"])
    assert r.exit_code == 0, r.output
    assert "$EAGLE_CACHE" not in r.output and built[-1] == tmp_path / "s3"
