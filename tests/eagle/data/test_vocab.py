"""`eagle vocab`: counting, choosing the top-N, d2t/t2d, and the command."""

from __future__ import annotations

import json
from pathlib import Path

import _train_data as td
import pytest
import torch
from click.testing import CliRunner

from eagle.commands import vocab as vocab_verb
from eagle.common import EagleError
from eagle.data import hidden_io, vocab


def test_count_only_loss_masked_tokens():
    rows = [([1, 2, 2, 3], [0, 1, 1, 1]), ([3, 3, 0], [1, 0, 1])]
    assert vocab.count_tokens(rows, 5).tolist() == [1, 0, 2, 2, 0]


def test_count_rejects_ids_outside_vocab_and_ragged_rows():
    with pytest.raises(EagleError, match="outside the target vocabulary"):
        vocab.count_tokens([([1, 7], [1, 1])], 5)
    with pytest.raises(EagleError, match="loss_mask has 1"):
        vocab.count_tokens([([1, 2], [1])], 5)


def test_choose_top_breaks_ties_by_id_and_sorts():
    counts = torch.tensor([0, 5, 3, 5, 3, 1])
    assert vocab.choose_top(counts, 3) == [1, 2, 3]  # 1 and 3 (5 each), then 2 before 4 (tie at 3)
    assert vocab.choose_top(counts, 1) == [1]


def test_choose_top_fills_with_smallest_unused_ids():
    counts = torch.tensor([0, 0, 4, 0, 9, 0])
    assert vocab.choose_top(counts, 4) == [0, 1, 2, 4]
    with pytest.raises(EagleError, match="between 1 and the target vocab size 6"):
        vocab.choose_top(counts, 7)


def test_build_maps_roundtrip():
    d2t, t2d = vocab.build_maps([0, 3, 4, 9], 12)
    assert d2t.dtype == torch.int64 and d2t.tolist() == [0, 2, 2, 6]
    assert t2d.dtype == torch.bool and t2d.nonzero().flatten().tolist() == [0, 3, 4, 9]
    assert (d2t + torch.arange(4)).tolist() == [0, 3, 4, 9]  # draft index i -> target id i + d2t[i]
    assert vocab.check_maps(d2t, t2d) == []


def test_check_maps_catches_inconsistency():
    d2t, t2d = vocab.build_maps([0, 3, 4, 9], 12)
    t2d_bad = t2d.clone()
    t2d_bad[5] = True
    assert "exactly" in vocab.check_maps(d2t, t2d_bad)[0]
    assert "ascending" in vocab.check_maps(torch.tensor([0, 2, 0, 6]), t2d)[0]
    assert "outside" in vocab.check_maps(torch.tensor([0, 2, 2, 60]), t2d)[0]
    assert "int64" in vocab.check_maps(d2t.int(), t2d)[0]


@pytest.mark.slow
def test_same_mapping_as_speculators():
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 6, (300,), generator=g)  # many ties
    counts[torch.randperm(300, generator=g)[:200]] = 0
    for n in (10, 64, 150):
        d2t, t2d = vocab.build_maps(vocab.choose_top(counts, n), 300)
        freq = {i: int(c) for i, c in enumerate(counts.tolist()) if c}
        ref_d2t, ref_t2d = build_vocab_mappings_from_distribution(freq, n, 300)
        assert torch.equal(d2t, ref_d2t) and torch.equal(t2d, ref_t2d)


@pytest.fixture
def small_data(tmp_path):
    from datasets import Dataset

    d = tmp_path / "data"
    rows = {"input_ids": [[5, 6, 7, 7], [7, 8, 9]], "loss_mask": [[0, 1, 1, 1], [1, 1, 0]], "seq_len": [4, 3]}
    Dataset.from_dict(rows).save_to_disk(str(d))
    hidden_io.write_data_meta(d, hidden_io.DataMeta(target="t", layer_ids=[1, 2, 3], hidden_size=8, vocab_size=16,
                                                    num_layers=8, num_samples=2))
    return d


def test_build_vocab_writes_file_and_summary(small_data):
    res = vocab.build_vocab(small_data, 3)
    d2t, t2d = vocab.read_vocab(small_data)
    assert (d2t + torch.arange(3)).tolist() == [6, 7, 8]  # 7 x3, then 6 and 8 (once each) beat 9 (masked out)
    assert t2d.shape == (16,) and int(t2d.sum()) == 3
    assert res.loss_tokens == 5 and res.distinct_tokens == 3 and res.coverage == 1.0
    from safetensors.torch import load_file

    blob = load_file(str(small_data / "vocab.safetensors"))
    assert blob["counts"].tolist()[5:10] == [0, 1, 3, 1, 0]
    assert json.loads((small_data / "vocab.json").read_text())["draft_vocab"] == 3
    # the training side reads the same file (E2's reader)
    from eagle.train import dataset

    rd2t, rt2d = dataset.read_vocab(small_data)
    assert torch.equal(rd2t, d2t) and torch.equal(rt2d, t2d)


def test_cli_table_metric_and_errors(small_data, tmp_path):
    runner = CliRunner()
    metrics = tmp_path / "m.json"
    r = runner.invoke(vocab_verb.command, ["--data", str(small_data), "--draft-vocab", "2"], env={"RUNBOOK_METRICS": str(metrics)})
    assert r.exit_code == 0, r.output
    assert "2 / 16" in r.stdout
    assert json.loads(metrics.read_text())["vocab_coverage"] == pytest.approx(4 / 5)
    r = runner.invoke(vocab_verb.command, ["--data", str(small_data), "--draft-vocab", "17"])
    assert r.exit_code == 1 and "between 1 and the target vocab size 16" in r.stderr
    r = runner.invoke(vocab_verb.command, ["--data", str(tmp_path / "nope"), "--draft-vocab", "2"])
    assert r.exit_code == 1 and "does not exist" in r.stderr
    (small_data / hidden_io.META_FILE).unlink()
    r = runner.invoke(vocab_verb.command, ["--data", str(small_data), "--draft-vocab", "2"])
    assert r.exit_code == 1 and "no --model was given" in r.stderr


@pytest.mark.slow
def test_toy_data_fixture_end_to_end(toy_data):
    """The shared fixture (prepare --regenerate -> extract -> vocab) gives a consistent data dir."""
    d2t, t2d = vocab.read_vocab(toy_data)
    assert d2t.shape == (256,) and t2d.shape == (2048,)
    info = json.loads((toy_data / "vocab.json").read_text())
    assert info["coverage"] > 0.99  # the toy language's assistant text uses few distinct words
    assert hidden_io.list_samples(toy_data) == list(range(32))
    s = hidden_io.load_sample(toy_data, 0)
    chosen = set((d2t + torch.arange(256)).tolist())
    masked = s["input_ids"][s["loss_mask"].bool()].tolist()
    assert set(masked) <= chosen or len(set(masked) - chosen) <= 2


# ---------------------------------------------------------------- --from-draft: keep a drafter's vocabulary



@pytest.fixture(scope="module")
def tiny_drafter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real drafter checkpoint (speculators model, our writer) whose vocabulary is the even ids."""
    return td.make_drafter(tmp_path_factory.mktemp("drafter"))[1]


def _prepared(d: Path, vocab_size: int = td.VOCAB) -> Path:
    from datasets import Dataset

    rows = {"input_ids": [[1, 2, 2, 3, 4], [4, 4, 5, 127, 9]], "loss_mask": [[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]],
            "seq_len": [5, 5]}
    Dataset.from_dict(rows).save_to_disk(str(d))
    hidden_io.write_data_meta(d, hidden_io.DataMeta(target="t", layer_ids=td.LAYER_IDS, hidden_size=td.HIDDEN,
                                                    vocab_size=vocab_size, num_layers=td.LAYERS, num_samples=2))
    return d


def _copy_drafter(src: Path, dst: Path, edit) -> Path:
    """A copy of the checkpoint in `src` whose tensors went through `edit(dict)`."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    edit(state)
    save_file(state, str(dst / "model.safetensors"))
    return dst


def test_from_draft_keeps_the_drafters_vocabulary(tiny_drafter, tmp_path):
    from safetensors.torch import load_file

    from eagle.drafter import checkpoint
    from eagle.train import dataset

    data = _prepared(tmp_path / "data")
    ckpt = checkpoint.load_draft_state(tiny_drafter)
    runner = CliRunner()
    metrics = tmp_path / "m.json"
    r = runner.invoke(vocab_verb.command, ["--data", str(data), "--from-draft", str(tiny_drafter), "--json"],
                      env={"RUNBOOK_METRICS": str(metrics)})
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    blob = load_file(str(data / "vocab.safetensors"))
    assert torch.equal(blob["d2t"], ckpt["d2t"]) and blob["d2t"].dtype == torch.int64
    assert torch.equal(blob["t2d"], ckpt["t2d"])
    # counts and coverage are this data's: loss-masked tokens 2 2 3 4 | 4 4 5 127 -> even ids 2,2,4,4,4 of 8
    assert blob["counts"].tolist()[:6] == [0, 0, 2, 1, 3, 1] and int(blob["counts"][127]) == 1
    assert int(blob["counts"].sum()) == 8 and int(blob["counts"][9]) == 0  # 9 is masked out
    assert res["draft_vocab"] == td.DRAFT_VOCAB and res["vocab_size"] == td.VOCAB
    assert res["loss_tokens"] == 8 and res["distinct_tokens"] == 5
    assert res["coverage"] == pytest.approx(5 / 8) and res["from_draft"] == str(tiny_drafter)
    assert json.loads((data / "vocab.json").read_text()) == res
    assert json.loads(metrics.read_text())["vocab_coverage"] == pytest.approx(5 / 8)
    # what `eagle train --init-from` compares: the training reader sees the drafter's d2t
    rd2t, _ = dataset.read_vocab(data)
    assert torch.equal(rd2t, ckpt["d2t"])
    # ... which choosing from this data would not have given
    chosen, _ = vocab.build_maps(vocab.choose_top(blob["counts"], td.DRAFT_VOCAB), td.VOCAB)
    assert not torch.equal(chosen, ckpt["d2t"])
    assert not list(data.glob(".tmp-*"))


def test_from_draft_without_t2d_rebuilds_it(tiny_drafter, tmp_path):
    data = _prepared(tmp_path / "data")
    src = _copy_drafter(tiny_drafter, tmp_path / "no-t2d", lambda s: s.pop("t2d"))
    vocab.build_vocab(data, from_draft=src)
    d2t, t2d = vocab.read_vocab(data)
    assert t2d.nonzero().flatten().tolist() == list(range(0, td.VOCAB, 2))


def _fails(args: list[str], *needles: str, code: int = 2) -> None:
    """Exit `code` (1: bad usage or data; 2: a drafter that cannot be read or used), one error line."""
    r = CliRunner().invoke(vocab_verb.command, args)
    assert r.exit_code == code, r.output
    assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1
    assert "Traceback" not in r.output
    for needle in needles:
        assert needle in r.stderr, r.stderr


def test_from_draft_errors(tiny_drafter, tmp_path):
    data = _prepared(tmp_path / "data")
    _fails(["--data", str(data), "--from-draft", str(tiny_drafter), "--draft-vocab", "8"], "exactly one of --draft-vocab",
           code=1)
    _fails(["--data", str(data)], "exactly one of --draft-vocab", "--from-draft", code=1)
    _fails(["--data", str(data), "--from-draft", str(tmp_path / "nope")], f"{tmp_path / 'nope'}: no such directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(["--data", str(data), "--from-draft", str(empty)], str(empty / "config.json"), "not found")
    no_d2t = _copy_drafter(tiny_drafter, tmp_path / "no-d2t", lambda s: s.pop("d2t"))
    _fails(["--data", str(data), "--from-draft", str(no_d2t)], str(no_d2t / "model.safetensors"), "has no d2t",
           "--draft-vocab N")

    def break_t2d(s):
        s["t2d"][1] = True

    bad = _copy_drafter(tiny_drafter, tmp_path / "bad-t2d", break_t2d)
    _fails(["--data", str(data), "--from-draft", str(bad)], str(bad / "model.safetensors"), "t2d does not mark exactly")
    other = _prepared(tmp_path / "other-vocab", vocab_size=256)
    _fails(["--data", str(other), "--from-draft", str(tiny_drafter)], str(tiny_drafter / "config.json"),
           "vocabulary has 128 tokens", "has 256", "--draft-vocab N")
    assert not (data / "vocab.safetensors").exists() and not (other / "vocab.safetensors").exists()
