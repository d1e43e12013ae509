"""eagle on bad inputs: a clear `error: ...` naming the file, exit != 0, never a traceback.

The real `eagle` CLI (its `main`, in this process: helpers.eagle_inproc) runs on damaged copies of the session's toy data
(`toy_data`, `toy_target` from tests/conftest.py): truncated and NaN hidden-state files, a vocab
mapping for another vocabulary size, empty and junk datasets, a drafter checked against another
target, and a corrupted drafter checkpoint; round two: a data file with a non-UTF-8 line,
truncated and random-bytes weights under evaluate / extract / train --init-from, a damaged
state.pt under train --resume, and toy-target --out naming a file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import helpers as H
import pytest

pytestmark = pytest.mark.slow


def eagle(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The eagle CLI's `main` with these arguments, in this process (helpers.eagle_inproc: a child's argv,
    environment, stdin and fds 1 and 2; an exception escaping `main` fails the test as a traceback would)."""
    return H.eagle_inproc(*args, timeout=timeout, env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})


def assert_clear_failure(result: subprocess.CompletedProcess, *names: str) -> None:
    H.assert_no_traceback(result, "eagle")
    assert result.returncode != 0, result.stdout[-1500:]
    for name in names:
        assert name in result.stderr, f"{name!r} not named in:\n{result.stderr[-2000:]}"
    assert "error" in result.stderr.lower()


@pytest.fixture
def data_copy(toy_data: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(toy_data, copy)
    return copy


@pytest.fixture(scope="module")
def drafter(toy_target: Path, toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bad-inputs") / "draft"
    result = eagle("train", "--model", str(toy_target), "--data", str(toy_data), "--out", str(out),
                   "--epochs", "1", "--device", "cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _train(model: Path, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return eagle("train", "--model", str(model), "--data", str(data), "--out", str(out), "--epochs", "1",
                 "--device", "cpu", *extra)


def _hs(data: Path, i: int) -> Path:
    return data / "hidden_states" / f"hs_{i}.safetensors"


def test_truncated_hidden_state_file(toy_target: Path, data_copy: Path, tmp_path: Path, counts) -> None:
    path = _hs(data_copy, 0)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    result = _train(toy_target, data_copy, tmp_path / "out")
    assert_clear_failure(result, "hs_0.safetensors")
    counts.add("eagle_bad_inputs")


def test_nan_hidden_states(toy_target: Path, data_copy: Path, tmp_path: Path, counts) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    path = _hs(data_copy, 1)
    tensors = load_file(str(path))
    hs = tensors["hidden_states"].clone()
    hs.view(-1)[::7] = float("nan")
    tensors["hidden_states"] = hs
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    assert torch.isnan(load_file(str(path))["hidden_states"].float()).any()
    result = _train(toy_target, data_copy, tmp_path / "out")
    assert_clear_failure(result, "hs_1.safetensors")
    assert "nan" in result.stderr.lower()
    counts.add("eagle_bad_inputs")


def test_vocab_for_another_vocab_size(toy_target: Path, data_copy: Path, tmp_path: Path, counts) -> None:
    import torch
    from safetensors.torch import save_file

    dv, v = 64, 1000  # the toy target has a vocabulary of 2048
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[:dv] = True
    save_file({"d2t": torch.zeros(dv, dtype=torch.int64), "t2d": t2d}, str(data_copy / "vocab.safetensors"))
    result = _train(toy_target, data_copy, tmp_path / "out")
    assert_clear_failure(result, "vocab.safetensors")
    counts.add("eagle_bad_inputs")


@pytest.mark.parametrize("content", ["", "not json\n{\"messages\": 3}\n[1, 2]\n"])
def test_empty_or_junk_dataset(toy_target: Path, tmp_path: Path, counts, content: str) -> None:
    src = tmp_path / "prompts.jsonl"
    src.write_text(content)
    result = eagle("prepare", "--model", str(toy_target), "--data", str(src), "--out", str(tmp_path / "out"),
                   "--regenerate", "--max-new-tokens", "4", "--device", "cpu")
    assert_clear_failure(result, "prompts.jsonl")
    counts.add("eagle_bad_inputs")


def test_train_on_a_dataset_without_hidden_states(toy_target: Path, data_copy: Path, tmp_path: Path, counts) -> None:
    shutil.rmtree(data_copy / "hidden_states")
    result = _train(toy_target, data_copy, tmp_path / "out")
    assert_clear_failure(result, "hidden_states")
    counts.add("eagle_bad_inputs")


def _other_target(toy_target: Path, tmp_path: Path, **changes: int) -> Path:
    other = tmp_path / "other-target"
    shutil.copytree(toy_target, other)
    config = json.loads((other / "config.json").read_text())
    config.update(changes)
    (other / "config.json").write_text(json.dumps(config, indent=2))
    return other


@pytest.mark.parametrize("changes", [{"hidden_size": 256}, {"vocab_size": 4096}])
def test_drafter_checked_against_another_target(toy_target: Path, drafter: Path, tmp_path: Path, counts,
                                                changes: dict) -> None:
    other = _other_target(toy_target, tmp_path, **changes)
    result = eagle("check-checkpoint", str(drafter), "--model", str(other))
    H.assert_no_traceback(result)
    assert result.returncode == 1, result.stdout + result.stderr
    report = result.stdout + result.stderr
    assert "config.json" in report and next(iter(changes)).split("_")[0] in report, report[-2000:]
    counts.add("eagle_bad_inputs")


@pytest.mark.parametrize("damage", ["truncate", "missing-config"])
def test_corrupted_drafter_checkpoint(toy_target: Path, toy_data: Path, drafter: Path, tmp_path: Path, counts,
                                      damage: str) -> None:
    broken = tmp_path / "broken-draft"
    shutil.copytree(drafter, broken, ignore=shutil.ignore_patterns("checkpoints"))
    weights = broken / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:1000])
        named = "model.safetensors"
    else:
        (broken / "config.json").unlink()
        named = "config.json"
    if damage == "truncate":
        result = eagle("check-checkpoint", str(broken), "--model", str(toy_target))
    else:
        result = _train(toy_target, toy_data, tmp_path / "out", "--init-from", str(broken))
    assert_clear_failure(result, named)
    counts.add("eagle_bad_inputs")


# ---- round two: undecodable data, damaged weights, a damaged training state, --out a file ------------


def test_prepare_with_a_non_utf8_line(toy_target: Path, tmp_path: Path, counts) -> None:
    src = tmp_path / "prompts.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "hello there"}]})
    src.write_bytes(good.encode() + b"\n" + b'{"messages": [{"role": "user", "content": "caf\xe9"}]}\n')
    common = ("prepare", "--model", str(toy_target), "--data", str(src), "--regenerate", "--max-new-tokens", "4",
              "--device", "cpu")
    strict = eagle(*common, "--out", str(tmp_path / "strict"), "--on-bad-record", "fail")
    assert_clear_failure(strict, "prompts.jsonl:2", "not UTF-8")
    lenient = eagle(*common, "--out", str(tmp_path / "lenient"))
    H.assert_no_traceback(lenient)
    assert lenient.returncode == 0 and "prompts.jsonl:2: not UTF-8" in lenient.stderr, lenient.stderr[-2000:]
    counts.add("eagle_bad_inputs", 2)


def test_prepare_reads_a_pipe_and_refuses_a_fifo_without_a_writer(toy_target: Path, tmp_path: Path, counts) -> None:
    """`--data <(zcat ...)` (a pipe with a writer) prepares what the file itself gives; a FIFO nobody
    writes is refused at once, naming it, with nothing written (a pipe was refused as "no such file")."""
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                                    {"role": "assistant", "content": f"answer {i}"}]}) + "\n"
                           for i in range(3)))
    common = ("prepare", "--model", str(toy_target))
    fifo = tmp_path / "nobody-writes"
    os.mkfifo(fifo)
    lonely = eagle(*common, "--data", str(fifo), "--out", str(tmp_path / "lonely"))
    assert_clear_failure(lonely, "nobody-writes", "no writer")
    assert not (tmp_path / "lonely").exists()
    regular = eagle(*common, "--data", str(src), "--out", str(tmp_path / "regular"))
    assert regular.returncode == 0, regular.stderr[-2000:]
    piped = subprocess.run(["bash", "-c", 'exec "$@" --data <(cat "$SRC") --out "$OUT"', "bash", *H.EAGLE, *common],
                           env=H.cli_env({"SRC": str(src), "OUT": str(tmp_path / "piped"), "HF_HUB_OFFLINE": "1"}),
                           capture_output=True, text=True, timeout=600)
    H.assert_no_traceback(piped, "eagle")
    assert piped.returncode == 0, piped.stderr[-2000:]
    made = sorted(p.relative_to(tmp_path / "regular") for p in (tmp_path / "regular").rglob("*") if p.is_file())
    assert made and made == sorted(p.relative_to(tmp_path / "piped") for p in (tmp_path / "piped").rglob("*")
                                   if p.is_file())
    for name in made:
        if name.suffix != ".json":  # the JSON summaries name their source (the file, or /dev/fd/N)
            assert (tmp_path / "piped" / name).read_bytes() == (tmp_path / "regular" / name).read_bytes(), name
    counts.add("eagle_bad_inputs", 2)


def _damage(path: Path, how: str) -> None:
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2] if how == "truncated" else os.urandom(size))


@pytest.mark.parametrize(
    "verb, what, how",
    [("evaluate", "draft", "truncated"), ("evaluate", "target", "random"), ("extract", "target", "truncated"),
     ("init-from", "draft", "random")],
)
def test_damaged_safetensors(toy_target: Path, toy_data: Path, drafter: Path, tmp_path: Path, counts,
                             verb: str, what: str, how: str) -> None:
    target, draft = toy_target, drafter
    if what == "target":
        target = tmp_path / "target"
        shutil.copytree(toy_target, target)
        _damage(target / "model.safetensors", how)
    else:
        draft = tmp_path / "draft"
        shutil.copytree(drafter, draft, ignore=shutil.ignore_patterns("checkpoints"))
        _damage(draft / "model.safetensors", how)
    if verb == "evaluate":
        result = eagle("evaluate", "--model", str(target), "--draft", str(draft), "--prompts", str(H.REPO / "plans" / "data" / "prompts.jsonl"),
                       "-k", "2", "--limit", "2", "--max-new-tokens", "8", "--device", "cpu")
    elif verb == "extract":
        result = eagle("extract", "--model", str(target), "--data", str(toy_data), "--out", str(tmp_path / "hs"))
    else:
        result = _train(toy_target, toy_data, tmp_path / "out", "--init-from", str(draft))
    named = str(target) if verb == "extract" else "model.safetensors"
    assert_clear_failure(result, named)
    counts.add("eagle_bad_inputs")


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_resume_from_a_damaged_training_state(toy_target: Path, toy_data: Path, drafter: Path, tmp_path: Path,
                                              counts, damage: str) -> None:
    import torch

    out = tmp_path / "draft"
    shutil.copytree(drafter, out)
    state = out / "checkpoints" / "epoch-1" / "state.pt"
    if damage == "truncated":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 3])
    else:
        torch.save({"something": "else"}, state)
    result = eagle("train", "--model", str(toy_target), "--data", str(toy_data), "--out", str(out), "--epochs", "2",
                   "--device", "cpu", "--resume")
    assert_clear_failure(result, "state.pt", "epoch-1")
    counts.add("eagle_bad_inputs")


def test_toy_target_out_naming_a_file(tmp_path: Path, counts) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep me\n")
    result = eagle("toy-target", "--out", str(target), "--steps", "1")
    assert_clear_failure(result, "a-file", "not a directory")
    assert target.read_text() == "keep me\n"
    counts.add("eagle_bad_inputs")


def test_evaluate_refuses_a_drafter_with_nan_weights(toy_target: Path, drafter: Path, tmp_path: Path,
                                                      counts) -> None:
    """A NaN in one weight: evaluate names the weights file, the tensor and check-checkpoint instead of
    reporting an acceptance (on ccd61ee it ran and printed a result, exit 0)."""
    from safetensors.torch import load_file, save_file

    draft = tmp_path / "draft"
    shutil.copytree(drafter, draft, ignore=shutil.ignore_patterns("checkpoints"))
    tensors = load_file(str(draft / "model.safetensors"))
    name = next(n for n, t in sorted(tensors.items()) if t.is_floating_point() and t.dim() == 2)
    tensors[name][0, 0] = float("nan")
    save_file(tensors, str(draft / "model.safetensors"))
    result = eagle("evaluate", "--model", str(toy_target), "--draft", str(draft), "--prompts",
                   str(H.REPO / "plans" / "data" / "prompts.jsonl"), "-k", "2", "--limit", "1", "--max-new-tokens",
                   "4", "--device", "cpu")
    assert_clear_failure(result, f"{draft / 'model.safetensors'} [{name}]: 1 non-finite values",
                         "eagle check-checkpoint")
    assert result.returncode == 2 and result.stdout == ""
    counts.add("eagle_bad_inputs")


def test_train_refuses_an_unfinished_extraction_and_names_the_rows(toy_target: Path, data_copy: Path,
                                                                   tmp_path: Path, counts) -> None:
    """Hidden-state files missing for some rows (an `eagle extract` killed half way, files deleted): train
    names the rows and the two ways on; --partial-data trains on the rest and says on how many. On ccd61ee it
    trained silently on what was there."""
    from eagle.data import hidden_io

    total = hidden_io.read_data_meta(data_copy).num_samples
    for i in (5, 6, 7, 8, 9, 20):
        _hs(data_copy, i).unlink()
    refused = _train(toy_target, data_copy, tmp_path / "out")
    assert_clear_failure(refused, f"{data_copy}: hidden states for {total - 6} of its {total} samples (rows 5-9, 20 "
                         "have none)", f"eagle extract --model TARGET --data {data_copy}", "--partial-data")
    assert refused.returncode == 1 and not (tmp_path / "out" / "model.safetensors").exists()
    partial = _train(toy_target, data_copy, tmp_path / "out", "--partial-data")
    assert partial.returncode == 0, partial.stderr[-3000:]
    assert (f"--partial-data: training on {total - 6} of the {total} samples of {data_copy}; rows without hidden "
            "states: 5-9, 20") in partial.stderr
    assert (tmp_path / "out" / "model.safetensors").exists()
    counts.add("eagle_bad_inputs", 2)


def test_sample_spans_are_ranges() -> None:
    from eagle.train.dataset import spans

    assert spans([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert spans([]) == "" and spans([3]) == "3"
    assert spans(range(0, 20, 2), most=3) == "0, 2, 4, and 7 more ranges"


def test_extract_removes_what_a_killed_extract_left(toy_target: Path, data_copy: Path, counts) -> None:
    """A `.tmp-hs_*` file of an extract killed mid-write (its process gone) is removed by the next extract,
    which says so; a live writer's stays (on ccd61ee both stayed forever)."""
    from eagle.fsutil import _host, temp_name

    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = data_copy / "hidden_states" / f".tmp-hs_3.safetensors-{_host()}-{gone.pid}-1401"
    dead.write_bytes(b"half a file")
    live = temp_name(data_copy / "hidden_states" / "hs_4.safetensors")
    live.write_bytes(b"being written")
    result = eagle("extract", "--model", str(toy_target), "--data", str(data_copy), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "removed 1 temporary file(s) an earlier extract left" in result.stderr
    assert not dead.exists() and live.exists()
    assert json.loads(result.stdout)["extracted"] == 0  # every real file was valid: nothing redone
    counts.add("eagle_bad_inputs")
