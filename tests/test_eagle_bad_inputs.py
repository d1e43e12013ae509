"""eagle on bad inputs: a clear `error: ...` naming the file, exit != 0, never a traceback.

The real `eagle` CLI runs in a subprocess on damaged copies of the session's toy data
(`toy_data`, `toy_target` from tests/conftest.py): truncated and NaN hidden-state files, a vocab
mapping for another vocabulary size, empty and junk datasets, a drafter checked against another
target, and a corrupted drafter checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("reliability_helpers", Path(__file__).with_name("reliability_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)
counts = H.counts

pytestmark = pytest.mark.slow


def eagle(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = H.cli_env({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    return subprocess.run([*H.EAGLE, *args], capture_output=True, text=True, env=env, timeout=timeout,
                          stdin=subprocess.DEVNULL)


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
