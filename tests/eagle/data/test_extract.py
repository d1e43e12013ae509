"""`eagle extract` and eagle/data/hidden_io.py: layer ids, batching, format, equality with transformers, resume."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eagle import toy
from eagle.commands import extract as extract_verb
from eagle.common import EagleError
from eagle.data import extract, hidden_io
from eagle.data import prepare as data

# ---------------------------------------------------------------- pure rules


def test_disk_check_names_sizes_and_path(tmp_path):
    extract.check_disk(tmp_path, 1000, 0)
    with pytest.raises(EagleError, match=r"needs 0\.00 GB .* GB free at " + re.escape(str(tmp_path))):
        extract.check_disk(tmp_path / "not" / "yet", 1000, 10**18)


def test_bytes_per_sample():
    assert extract.bytes_per_sample(10, 3, 128) == 10 * 4 * 128 * 2 + 80 + extract.HEADER_BYTES


# ---------------------------------------------------------------- hidden_io checks (pure)


def sample(t=5, layers=4, h=8):
    return {"hidden_states": torch.randn(t, layers, h).to(torch.bfloat16), "token_ids": torch.arange(t)}


def test_check_sample_valid_and_invalid():
    assert hidden_io.check_sample(sample(), list(range(5)), 4, 8) == []
    bad = sample()
    bad["hidden_states"][2, 1, 3] = float("nan")
    assert "NaN/Inf" in hidden_io.check_sample(bad)[0]
    assert "differ from the dataset row" in hidden_io.check_sample(sample(), [0, 1, 2, 3, 9])[0]
    assert "expected 3 (aux + last)" in hidden_io.check_sample(sample(), None, 3)[0]
    assert "dtype" in hidden_io.check_sample({**sample(), "hidden_states": torch.zeros(5, 4, 8)})[0]
    assert "missing tensors" in hidden_io.check_sample({"hidden_states": torch.zeros(5, 4, 8)})[0]
    assert "[T, L+1, H]" in hidden_io.check_sample({**sample(), "hidden_states": torch.zeros(5, 8)})[0]


def test_write_is_atomic_and_validate_detects_damage(tmp_path):
    s = sample()
    p = hidden_io.write_sample(tmp_path, 3, s["hidden_states"], s["token_ids"])
    assert p.name == "hs_3.safetensors" and [f.name for f in p.parent.iterdir()] == ["hs_3.safetensors"]
    assert hidden_io.validate_file(p, list(range(5)), 4, 8) == []
    p.write_bytes(p.read_bytes()[:-40])  # truncated
    assert "unreadable" in hidden_io.validate_file(p)[0]
    assert "missing" in hidden_io.validate_file(tmp_path / "nope.safetensors")[0]


# ---------------------------------------------------------------- on the toy target


@pytest.fixture(scope="module")
def prepared(toy_target, tmp_path_factory) -> Path:
    """6 conversations in the toy language (with answers), prepared without generation."""
    chain = toy.make_chain(2048, 400, 0)
    rng = random.Random(5)
    src = tmp_path_factory.mktemp("src") / "c.jsonl"
    src.write_text("".join(json.dumps({"messages": toy.sample_conversation(chain, rng)}) + "\n" for _ in range(6)))
    out = tmp_path_factory.mktemp("prep") / "data"
    data.prepare(toy_target, src, out, echo=False)
    return out


@pytest.fixture(scope="module")
def extracted(toy_target, prepared, tmp_path_factory) -> tuple[Path, extract.ExtractResult]:
    out = tmp_path_factory.mktemp("ext") / "data"
    shutil.copytree(prepared, out)
    res = extract.extract(toy_target, out, batch_tokens=160, echo=False)  # several padded batches
    return out, res


@pytest.mark.slow
def test_extract_equals_a_direct_transformers_forward(toy_target, extracted):
    from transformers import LlamaForCausalLM

    out, res = extracted
    assert res.layer_ids == [2, 4, 5] and res.extracted == res.samples == 6 and res.skipped == 0
    # the capture loop is part of the run; the rest (model load, setup) is load_seconds
    assert 0 < res.capture_seconds <= res.seconds and res.load_seconds > 0
    assert abs(res.capture_seconds + res.load_seconds - res.seconds) < 2e-3
    assert res.capture_tok_s >= res.tok_s > 0
    # capture_seconds is rounded to ms, the rate comes from the unrounded time
    assert res.new_tokens / (res.capture_seconds + 6e-4) <= res.capture_tok_s <= res.new_tokens / (res.capture_seconds - 6e-4)
    model = LlamaForCausalLM.from_pretrained(str(toy_target)).eval()
    n = model.config.num_hidden_layers
    for i in hidden_io.list_samples(out):
        s = hidden_io.load_sample(out, i)
        hs = s["hidden_states"]
        assert hs.dtype == torch.bfloat16 and hs.shape == (s["input_ids"].shape[0], 4, 128)
        with torch.no_grad():
            ref = model(s["input_ids"][None], output_hidden_states=True).hidden_states
        for j, k in enumerate([2, 4, 5]):  # aux layer k = input of decoder layer k = hidden_states[k]
            torch.testing.assert_close(hs[:, j].float(), ref[k][0].to(torch.bfloat16).float(), atol=2e-2, rtol=1e-2)
        # the last slot is the PRE-norm last layer: the final norm of it gives hidden_states[N] ...
        with torch.no_grad():
            normed = model.model.norm(hs[:, 3].float()[None])[0]
        torch.testing.assert_close(normed, ref[n][0], atol=5e-2, rtol=2e-2)
        # ... and it is not hidden_states[N] itself (post-norm in transformers 5)
        assert (hs[:, 3].float() - ref[n][0]).abs().max() > 0.1


@pytest.mark.slow
def test_speculators_reads_our_files(extracted):
    from speculators.train.data import ArrowDataset

    out, _ = extracted
    ds = ArrowDataset(max_len=512, datapath=str(out), on_missing="raise")
    assert len(ds) == 6
    for i in range(len(ds)):
        item = ds[i]
        mine = hidden_io.load_sample(out, i)
        t = mine["input_ids"].shape[0]
        assert item["hidden_states"].shape == (t, 3 * 128)
        assert item["verifier_last_hidden_states"].shape == (t, 128)
        assert torch.equal(item["input_ids"], mine["input_ids"])
        assert torch.equal(item["loss_mask"].long(), mine["loss_mask"])
        assert torch.equal(item["verifier_last_hidden_states"], mine["hidden_states"][:, -1])


@pytest.mark.slow
def test_data_meta_and_listing(toy_target, extracted):
    out, res = extracted
    meta = hidden_io.read_data_meta(out)
    assert meta.layer_ids == [2, 4, 5] and meta.hidden_size == 128 and meta.vocab_size == 2048
    assert meta.num_layers == 8 and meta.num_samples == 6 and meta.target == str(toy_target)
    assert hidden_io.list_samples(out) == list(range(6))
    assert res.total_bytes == sum(hidden_io.hs_path(out, i).stat().st_size for i in range(6))


@pytest.mark.slow
def test_resume_skips_valid_files_and_redoes_damaged_ones(toy_target, prepared, tmp_path):
    out = tmp_path / "data"
    shutil.copytree(prepared, out)
    first = extract.extract(toy_target, out, echo=False)
    assert first.extracted == 6
    stamp = {i: hidden_io.hs_path(out, i).stat().st_mtime_ns for i in range(6)}
    again = extract.extract(toy_target, out, echo=False)
    assert (again.extracted, again.skipped, again.new_tokens) == (0, 6, 0)
    assert (again.capture_seconds, again.capture_tok_s, again.tok_s) == (0.0, 0.0, 0.0)  # nothing captured
    assert all(hidden_io.hs_path(out, i).stat().st_mtime_ns == stamp[i] for i in range(6))
    # damage: a NaN in one file, a truncated second, a missing third
    from safetensors.torch import load_file, save_file

    t = load_file(str(hidden_io.hs_path(out, 1)))
    t["hidden_states"][0, 0, 0] = float("nan")
    save_file(t, str(hidden_io.hs_path(out, 1)))
    assert "NaN" in hidden_io.validate_file(hidden_io.hs_path(out, 1))[0]
    with pytest.raises(EagleError, match="NaN"):
        hidden_io.load_sample(out, 1)
    p2 = hidden_io.hs_path(out, 2)
    p2.write_bytes(p2.read_bytes()[:100])
    hidden_io.hs_path(out, 4).unlink()
    fixed = extract.extract(toy_target, out, echo=False)
    assert (fixed.extracted, fixed.skipped) == (3, 3)
    assert all(hidden_io.validate_file(hidden_io.hs_path(out, i)) == [] for i in range(6))
    assert all(hidden_io.hs_path(out, i).stat().st_mtime_ns == stamp[i] for i in (0, 3, 5))
    # other layer ids: everything is stale
    other = extract.extract(toy_target, out, layer_ids="1,3,6", echo=False)
    assert other.extracted == 6 and hidden_io.read_data_meta(out).layer_ids == [1, 3, 6]


@pytest.mark.slow
def test_another_target_makes_the_files_stale(toy_target, toy_successor, extracted, tmp_path):
    src, _ = extracted
    out = tmp_path / "data"
    shutil.copytree(src, out)
    before = hidden_io.load_sample(out, 0)["hidden_states"]
    res = extract.extract(toy_successor, out, echo=False)
    assert res.extracted == 6 and res.skipped == 0
    assert hidden_io.read_data_meta(out).target == str(toy_successor)
    assert not torch.equal(hidden_io.load_sample(out, 0)["hidden_states"], before)


@pytest.mark.slow
def test_cli_out_dir_metrics_and_errors(toy_target, prepared, tmp_path):
    runner = CliRunner()
    metrics = tmp_path / "m.json"
    out = tmp_path / "elsewhere"
    r = runner.invoke(extract_verb.command, ["--model", str(toy_target), "--data", str(prepared), "--out", str(out),
                                        "--layer-ids", "1,2,3"], env={"RUNBOOK_METRICS": str(metrics)})
    assert r.exit_code == 0, r.output
    assert "1,2,3 + last (pre-norm)" in r.stdout
    m = json.loads(metrics.read_text())
    assert m["extract_tokens"] == sum(hidden_io.open_prepared(prepared).with_format(None)["seq_len"])
    assert m["extract_tok_s"] > 0 and m["extract_bytes"] > 0
    assert m["extract_capture_tok_s"] >= m["extract_tok_s"]
    assert re.search(r"seconds\s+[\d.,]+ \([\d.,]+ load \+ [\d.,]+ capture\)", r.stdout), r.stdout
    assert re.search(r"capture tok/s\s+[\d.,]+ \(load excluded\)", r.stdout), r.stdout
    assert not (prepared / "hidden_states").exists()  # --out leaves the prepared dir alone
    assert hidden_io.list_samples(out) == list(range(6))  # OUT is a complete data dir
    for args, why, code in [  # bad arguments exit 2, bad data / environment 1
        (["--layer-ids", "2,4,9"], "out of range", 2),
        (["--layer-ids", "4,4,5"], "distinct", 2),
        (["--keep-free", "1e9"], "GB free at", 1),
        (["--data", str(tmp_path / "missing")], "does not exist", 1),
        (["--model", str(tmp_path / "missing")], "no such directory", 2),
    ]:
        base = {"--model": str(toy_target), "--data": str(prepared), "--out": str(tmp_path / "o2")}
        base.update(dict(zip(args[::2], args[1::2], strict=True)))
        r = runner.invoke(extract_verb.command, [x for kv in base.items() for x in kv])
        assert r.exit_code == code and why in r.stderr, (args, r.output)
        assert not (tmp_path / "o2").exists()  # refused before writing anything
