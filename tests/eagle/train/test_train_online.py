"""`eagle train --online`: hidden states computed in the loop give the offline path's batches and results."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import _train_data as td
import pytest
import torch
from click.testing import CliRunner


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(target, offline data dir, the same rows prepared only: no hidden states, no eagle_data.json)."""
    root = tmp_path_factory.mktemp("online")
    target = td.make_target(root / "target")
    data = td.make_data(target, root / "data", n=16, length=32)
    bare = root / "bare"
    shutil.copytree(data, bare, ignore=shutil.ignore_patterns("hidden_states", "eagle_data.json"))
    return target, data, bare


def test_online_batches_equal_offline_batches(small: tuple[Path, Path, Path]) -> None:
    from eagle.target import load_model
    from eagle.train.dataset import HiddenStates
    from eagle.train.online import OnlineStates

    target, data, bare = small
    cpu = torch.device("cpu")
    for budget in (128, 20):  # 20 < 31 shifted tokens: samples are cut, and only what is kept is computed
        online = OnlineStates(bare, load_model(target, "cpu"), td.LAYER_IDS, budget)
        offline = HiddenStates(data, budget)
        assert (len(online), online.lengths, online.num_aux, online.hidden_size) == \
               (len(offline), offline.lengths, offline.num_aux, offline.hidden_size)
        for idx in ([0], [3, 1, 7], list(range(16))):
            got, want = online.batch(idx, cpu, layout=True), offline.batch(idx, cpu, layout=True)
            assert set(got) == set(want)
            for key in want:
                assert got[key].shape == want[key].shape, key
                if key in ("hidden_states", "verifier_last_hidden_states"):
                    # both are bf16-rounded fp32 states; batching may flip a rounding in the last bit
                    assert torch.allclose(got[key], want[key], rtol=1e-2, atol=1e-5), key
                    assert (got[key] != want[key]).float().mean() < 0.01, key
                else:
                    assert torch.equal(got[key], want[key]), key
            assert got["input_ids"].shape[1] == offline.tokens(idx) == online.tokens(idx)
        online.close()


@pytest.mark.slow
def test_online_training_equals_offline_on_the_toy_target(toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    """Same data, same seed: the online run's losses and accuracies are the offline run's."""
    from eagle.train.config import TrainConfig, summary_metrics
    from eagle.train.trainer import train

    base = dict(model=str(toy_target), data=str(toy_data), epochs=3, batch_tokens=256, val_fraction=0.1,
                lr=3e-3, device="cpu")
    offline = train(TrainConfig(out=str(tmp_path / "offline"), **base), echo=False)
    online = train(TrainConfig(out=str(tmp_path / "online"), online=True, **base), echo=False)
    assert online.args.layer_ids == json.loads((toy_data / "eagle_data.json").read_text())["layer_ids"]
    for a, b in zip(offline.epochs, online.epochs, strict=True):
        assert b.train_loss == pytest.approx(a.train_loss, rel=1e-3)
        assert b.val_loss == pytest.approx(a.val_loss, rel=1e-3)
        assert b.val_acc == pytest.approx(a.val_acc, abs=0.01)
    m_off, m_on = summary_metrics(offline), summary_metrics(online)
    print({"offline": {k: round(v, 4) for k, v in m_off.items()}, "online": {k: round(v, 4) for k, v in m_on.items()}})
    assert online.epochs[-1].train_loss < online.epochs[0].train_loss
    assert m_on["val_accept_len"] == pytest.approx(m_off["val_accept_len"], abs=0.02)


@pytest.mark.slow
def test_online_cli_trains_without_extraction_and_resumes(small: tuple[Path, Path, Path], tmp_path: Path) -> None:
    from eagle.commands.train import command

    target, _, bare = small
    out, metrics = tmp_path / "draft", tmp_path / "metrics.json"
    base = ["--model", str(target), "--data", str(bare), "--out", str(out), "--batch-tokens", "128",
            "--val-fraction", "0.2", "--device", "cpu", "--online", "--layer-ids", "2,4,5"]
    runner = CliRunner()
    res = runner.invoke(command, [*base, "--epochs", "1"], env={"RUNBOOK_METRICS": str(metrics)})
    assert res.exit_code == 0, res.output
    assert {"train_loss", "val_loss", "val_acc_0", "val_accept_len", "train_tok_s"} <= set(json.loads(metrics.read_text()))
    assert not (bare / "hidden_states").exists()  # nothing extracted, nothing written to the data dir
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]

    res = runner.invoke(command, [*base, "--epochs", "2", "--resume"])
    assert res.exit_code == 0, res.output
    log = json.loads((out / "train_log.json").read_text())
    assert [e["epoch"] for e in log["epochs"]] == [1, 2] and log["args"]["online"] is True

    # resuming with other layers is refused: the saved drafter reads other hidden states
    moved = [a if a != "2,4,5" else "1,4,5" for a in base]
    res = runner.invoke(command, [*moved, "--epochs", "3", "--resume"])
    assert res.exit_code == 1 and "layer_ids" in res.output, res.output


def test_online_bad_input_is_named_and_writes_nothing(small: tuple[Path, Path, Path], tmp_path: Path) -> None:
    from eagle.commands.train import command

    target, data, bare = small
    runner = CliRunner()
    out = tmp_path / "draft"

    def run(*extra: str, data_dir: Path = bare, code: int = 1) -> str:
        res = runner.invoke(command, ["--model", str(target), "--data", str(data_dir), "--out", str(out),
                                      "--device", "cpu", "--epochs", "1", *extra])
        assert res.exit_code == code, res.output
        assert "Traceback" not in res.output and not out.exists()
        return res.output

    assert "--layer-ids goes with --online" in run("--layer-ids", "2,4,5", data_dir=data)
    assert "out of range" in run("--online", "--layer-ids", "2,4,9", code=2)  # a bad argument: exit 2
    assert "comma-separated integers" in run("--online", "--layer-ids", "two", code=2)
    assert "--layout-multiple must be >= 1" in run("--online", "--layout-multiple", "0")
    no_vocab = tmp_path / "no-vocab"
    shutil.copytree(bare, no_vocab, ignore=shutil.ignore_patterns("vocab.safetensors"))
    assert "vocab.safetensors" in run("--online", data_dir=no_vocab)
    assert "not a prepared dataset" in run("--online", data_dir=tmp_path)
