"""`eagle extract` data parallel: --shard K/N and torchrun split the samples by index and give the same files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _train_data as td
import pytest
from helpers import eagle_inproc

from eagle import distributed
from eagle.common import EagleError
from eagle.data import extract, hidden_io
from eagle.serving.server import free_port

N_SAMPLES = 9  # odd: the two shards differ in size

# ---------------------------------------------------------------- pure rules


@pytest.mark.parametrize("spec, env, want", [
    (None, {}, (0, 1)),
    (None, {"RANK": "1", "WORLD_SIZE": "2"}, (1, 2)),
    ("1/3", {"RANK": "0", "WORLD_SIZE": "2"}, (1, 3)),  # explicit --shard wins over torchrun's env
    ("0/1", {}, (0, 1)),
])
def test_parse_shard(spec, env, want):
    assert extract.parse_shard(spec, env) == want


@pytest.mark.parametrize("spec", ["2/2", "1", "a/2", "-1/2", "0/0", "1/2/3"])
def test_parse_shard_refuses(spec):
    with pytest.raises(EagleError, match="expected K/N with 0 <= K < N"):
        extract.parse_shard(spec, {})


def test_shard_device():
    torchrun = distributed.topology({"LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    alone = distributed.topology({})
    assert distributed.rank_device("auto", torchrun, cuda=True) == "cuda:1"
    assert distributed.rank_device("cuda", torchrun, cuda=True) == "cuda:1"
    assert distributed.rank_device("cuda:0", torchrun, cuda=True) == "cuda:0"  # explicit index kept
    assert distributed.rank_device("auto", torchrun, cuda=False) == "auto"  # cpu
    assert distributed.rank_device("auto", alone, cuda=True) == "auto"  # not under torchrun


def _result(shard: str, new_tokens: int, seconds: float, capture: float) -> extract.ExtractResult:
    return extract.ExtractResult(out="o", layer_ids=[2, 4, 5], samples=3, extracted=3, skipped=0, tokens=new_tokens,
                                 new_tokens=new_tokens, seconds=seconds, tok_s=new_tokens / seconds, bytes_written=10,
                                 total_bytes=10, shard=shard, capture_seconds=capture, load_seconds=seconds - capture,
                                 capture_tok_s=new_tokens / capture)


def test_merge_results_and_metrics():
    # rank 0 is slower overall (long load), rank 1 has the slower capture: each maximum is taken on its own
    a, b = _result("0/2", 300, 5.0, 1.0), _result("1/2", 100, 4.0, 2.0)
    m = extract.merge_results([a, b])
    assert (m.samples, m.tokens, m.new_tokens, m.seconds, m.total_bytes) == (6, 400, 400, 5.0, 20)
    assert m.tok_s == 80.0  # all tokens over the slowest shard's time
    assert (m.capture_seconds, m.load_seconds, m.capture_tok_s) == (2.0, 4.0, 200.0)  # slowest capture: rank 1's
    assert (m.shard, m.shard_tokens, m.shard_tok_s, m.shard_capture_tok_s) == ("all/2", [300, 100], [60.0, 25.0],
                                                                              [300.0, 50.0])
    metrics = extract.summary_metrics(m, [a, b])
    assert metrics == {"extract_tokens": 400, "extract_bytes": 20, "extract_tok_s": 80.0,
                       "extract_capture_tok_s": 200.0,
                       "extract_rank0_tokens": 300, "extract_rank0_tok_s": 60.0, "extract_rank0_capture_tok_s": 300.0,
                       "extract_rank1_tokens": 100, "extract_rank1_tok_s": 25.0, "extract_rank1_capture_tok_s": 50.0}
    assert extract.summary_metrics(b, None) == {"extract_shard1_tokens": 100, "extract_shard1_bytes": 10,
                                                "extract_shard1_tok_s": 25.0, "extract_shard1_capture_tok_s": 50.0}


def test_results_of_older_runs_still_validate():
    old = _result("0/1", 30, 1.0, 1.0).model_dump()
    for k in ("capture_seconds", "load_seconds", "capture_tok_s", "shard_capture_tok_s"):
        del old[k]
    r = extract.ExtractResult.model_validate(old)
    assert (r.capture_seconds, r.load_seconds, r.capture_tok_s, r.shard_capture_tok_s) == (0.0, 0.0, 0.0, [])


# ---------------------------------------------------------------- real runs on a tiny target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Llama target and a prepared dataset of N_SAMPLES rows of different lengths."""
    import datasets

    root = tmp_path_factory.mktemp("shard")
    target = td.make_target(root / "target")
    seqs = [s[: 6 + 3 * i] for i, s in enumerate(td.markov_sequences(N_SAMPLES, 40, seed=1))]
    datasets.Dataset.from_dict({"input_ids": seqs, "loss_mask": [[1] * len(s) for s in seqs],
                                "seq_len": [len(s) for s in seqs]}).save_to_disk(str(root / "data"))
    return target, root / "data"


def _run(cmd: list[str], metrics: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RUNBOOK_METRICS", None)
    if metrics is not None:
        env["RUNBOOK_METRICS"] = str(metrics)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait(p: subprocess.Popen) -> str:
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, out + err
    assert "Traceback" not in err
    return out


def _files(d: Path) -> dict[str, bytes]:
    """Every file a run leaves in its out dir (hidden states, meta, dataset copy), by relative path."""
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def _args(tiny: tuple[Path, Path], out: Path) -> list[str]:
    target, data = tiny
    # --batch-tokens 1: every sample runs alone, so its numbers cannot depend on which others share its batch
    return ["extract", "--model", str(target), "--data", str(data), "--out", str(out), "--device", "cpu",
            "--batch-tokens", "1", "--keep-free", "0"]


@pytest.mark.slow
def test_two_shards_write_the_same_files_as_one_process(tiny, tmp_path):
    shards = [_run([sys.executable, "-m", "eagle.cli", *_args(tiny, tmp_path / "two"), "--shard", f"{k}/2",
                    "--json"], tmp_path / f"m{k}.json") for k in range(2)]  # both at once, like two GPUs
    # the whole set in one process meanwhile: this one (eagle's main, its argv; one torch import fewer)
    one = eagle_inproc(*_args(tiny, tmp_path / "one"), "--json", env={"OMP_NUM_THREADS": "1"})
    assert one.returncode == 0 and "Traceback" not in one.stderr, one.stdout + one.stderr
    res = [extract.ExtractResult.model_validate_json(_wait(p)) for p in shards]

    single, sharded = _files(tmp_path / "one"), _files(tmp_path / "two")
    assert sorted(single) == sorted(sharded)
    assert sum(n.startswith("hidden_states/hs_") for n in single) == N_SAMPLES
    assert [n for n in single if single[n] != sharded[n]] == []
    assert [r.extracted for r in res] == [5, 4]  # index % 2 == K: 0,2,4,6,8 and 1,3,5,7
    lengths = [6 + 3 * i for i in range(N_SAMPLES)]
    assert [r.tokens for r in res] == [sum(lengths[0::2]), sum(lengths[1::2])]
    m1 = json.loads((tmp_path / "m1.json").read_text())
    assert m1["extract_shard1_tokens"] == sum(lengths[1::2]) and m1["extract_shard1_tok_s"] > 0
    assert m1["extract_shard1_capture_tok_s"] >= m1["extract_shard1_tok_s"]
    assert all(0 < r.capture_seconds <= r.seconds and r.load_seconds > 0 for r in res)

    # resume is per shard: shard 1 again finds all its files valid; a deleted file of shard 0 is redone alone
    again = extract.extract(tiny[0], tiny[1], tmp_path / "two", device="cpu", batch_tokens=1, keep_free_gb=0,
                            echo=False, shard=(1, 2))
    assert (again.extracted, again.skipped, again.new_tokens) == (0, 4, 0)
    hidden_io.hs_path(tmp_path / "two", 4).unlink()
    redo = extract.extract(tiny[0], tiny[1], tmp_path / "two", device="cpu", batch_tokens=1, keep_free_gb=0,
                           echo=False, shard=(0, 2))
    assert (redo.extracted, redo.skipped, redo.new_tokens) == (1, 4, lengths[4])


@pytest.mark.slow
def test_torchrun_two_ranks_report_the_whole_run(tiny, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    metrics = tmp_path / "m.json"
    out = _wait(_run([str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "eagle.cli",
                      *_args(tiny, tmp_path / "tr"), "--json"], metrics))
    merged = extract.ExtractResult.model_validate_json(out)  # only rank 0 prints
    lengths = [6 + 3 * i for i in range(N_SAMPLES)]
    assert (merged.shard, merged.samples, merged.extracted, merged.tokens) == ("all/2", N_SAMPLES, N_SAMPLES,
                                                                               sum(lengths))
    assert merged.shard_tokens == [sum(lengths[0::2]), sum(lengths[1::2])]
    m = json.loads(metrics.read_text())
    assert m["extract_tokens"] == sum(lengths) and m["extract_rank1_tokens"] == sum(lengths[1::2])
    assert m["extract_tok_s"] > 0 and m["extract_rank0_tok_s"] > 0
    # the whole run's capture rate: all tokens over the slowest rank's capture loop (model load excluded)
    assert 0 < merged.capture_seconds <= merged.seconds
    assert merged.capture_tok_s == round(sum(lengths) / merged.capture_seconds, 1)
    assert m["extract_capture_tok_s"] == merged.capture_tok_s >= m["extract_tok_s"]
    assert [m["extract_rank0_capture_tok_s"], m["extract_rank1_capture_tok_s"]] == merged.shard_capture_tok_s
    assert all(m[f"extract_rank{k}_capture_tok_s"] >= m[f"extract_rank{k}_tok_s"] for k in range(2))
    assert m["extract_capture_tok_s"] <= sum(merged.shard_capture_tok_s)  # the slowest rank bounds the whole
    assert sorted(hidden_io.list_samples(tmp_path / "tr")) == list(range(N_SAMPLES))


def test_shard_refuses_to_replace_another_layout(tiny, tmp_path):
    target, data = tiny
    out = tmp_path / "o"
    out.mkdir()
    hidden_io.write_data_meta(out, hidden_io.DataMeta(target="other", layer_ids=[1, 2, 3], hidden_size=32,
                                                      vocab_size=td.VOCAB, num_layers=8, num_samples=N_SAMPLES))
    with pytest.raises(EagleError, match="--shard cannot replace them safely"):
        extract.extract(target, data, out, device="cpu", keep_free_gb=0, echo=False, shard=(1, 2))
    assert not hidden_io.hs_dir(out).exists()  # nothing written
