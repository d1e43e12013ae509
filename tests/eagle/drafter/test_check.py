"""`eagle check-checkpoint`: a good drafter passes; each kind of breakage is named, all at once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import _train_data as td
import helpers as H
import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eagle.commands.check_checkpoint import command
from eagle.drafter.check import check_checkpoint, config_problems


@pytest.fixture(scope="module")
def drafter_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, drafter): a tiny target and an untrained drafter saved by eagle.drafter.model (read-only)."""
    return td.make_drafter(tmp_path_factory.mktemp("check"))


def _copy(src: Path, dst: Path, config_edit=None, tensor_edit=None) -> Path:
    shutil.copytree(src, dst)
    if config_edit:
        cfg = json.loads((dst / "config.json").read_text())
        config_edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensor_edit:
        tensors = load_file(str(dst / "model.safetensors"))
        tensor_edit(tensors)
        save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.mark.slow  # builds a drafter with speculators (~15 s)
def test_good_drafter_passes(drafter_pair: tuple[Path, Path]) -> None:
    target, draft = drafter_pair
    report = check_checkpoint(draft, target)
    assert report.ok, report.problems
    assert report.summary["layer_ids"] == td.LAYER_IDS and report.summary["target_layers"] == td.LAYERS
    res = CliRunner().invoke(command, [str(draft), "--model", str(target)])
    assert res.exit_code == 0 and res.output.startswith("ok:")


@pytest.mark.slow  # builds a drafter with speculators (~15 s)
def test_missing_d2t_is_flagged_by_the_cli(drafter_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = drafter_pair
    bad = _copy(draft, tmp_path / "no-d2t", tensor_edit=lambda t: t.pop("d2t"))
    proc = H.eagle_inproc("check-checkpoint", str(bad), "--model", str(target))
    assert proc.returncode == 1
    assert "missing tensor d2t" in proc.stderr and "acceptance collapses" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # builds a drafter with speculators (~15 s)
def test_every_problem_is_named_at_once(drafter_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = drafter_pair

    def cfg_edit(cfg: dict) -> None:
        cfg["model_type"] = "llama"
        del cfg["norm_before_residual"]

    def tensor_edit(t: dict) -> None:
        t["fc.weight"][0, 0] = float("nan")
        t["d2t"][-1] = td.VOCAB  # maps the last draft id past the target vocab

    bad = _copy(draft, tmp_path / "bad", cfg_edit, tensor_edit)
    res = CliRunner().invoke(command, [str(bad), "--model", str(target), "--json"])
    assert res.exit_code == 1
    messages = "\n".join(f"{p['where']}: {p['message']}" for p in json.loads(res.output)["problems"])
    assert "[model_type]" in messages
    assert "[norm_before_residual]: missing" in messages
    assert "[fc.weight]: 1 non-finite" in messages
    assert "[d2t]: 1 draft ids map outside the target vocab" in messages


@pytest.mark.slow  # builds a drafter with speculators (~15 s)
def test_wrong_target_is_flagged(drafter_pair: tuple[Path, Path], tmp_path: Path) -> None:
    _, draft = drafter_pair
    other = td.make_target(tmp_path / "wide", hidden=48)
    problems = [str(p) for p in check_checkpoint(draft, other).problems]
    assert any("transformer_layer_config.hidden_size]: is 32, the target's is 48" in p for p in problems)


def test_layer_id_rules() -> None:
    base = {"speculators_model_type": "eagle3", "transformer_layer_config": {"hidden_size": 8, "vocab_size": 16},
            "speculators_config": {}, "draft_vocab_size": 8, "norm_before_residual": False}
    target = {"num_hidden_layers": 8, "hidden_size": 8, "vocab_size": 16}
    ok = config_problems(base | {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}, target, "c")
    assert ok == []
    rep = [p.message for p in config_problems(base | {"eagle_aux_hidden_state_layer_ids": [2, 2, 1]}, target, "c")]
    assert any("repeated" in m for m in rep) and any("not ascending" in m for m in rep)
    far = [p.message for p in config_problems(base | {"eagle_aux_hidden_state_layer_ids": [2, 4, 8]}, target, "c")]
    assert any("[8] outside 0..7" in m for m in far)
    big = config_problems(base | {"eagle_aux_hidden_state_layer_ids": [1], "draft_vocab_size": 17}, target, "c")
    assert [p.where for p in big] == ["c [draft_vocab_size]"]


def _nan_in_fc(t: dict) -> None:
    t["fc.weight"][1, 2] = float("nan")


def _float_d2t(t: dict) -> None:
    t["d2t"] = t["d2t"].float()


def _d2t_outside(t: dict) -> None:
    t["d2t"][-1] = td.VOCAB  # the last draft id past the target vocab


def _d2t_negative(t: dict) -> None:
    t["d2t"][0] = -1


@pytest.mark.slow  # builds a drafter with speculators (~15 s)
@pytest.mark.parametrize(("damage", "named"), [
    (_nan_in_fc, "[fc.weight]: 1 non-finite values"), (_float_d2t, "[d2t]: dtype torch.float32; expected an integer"),
    (_d2t_outside, "[d2t]: 1 draft ids map outside the target vocab"),
    (_d2t_negative, "[d2t]: 1 draft ids map outside the target vocab")])
def test_unusable_values_are_neither_imported_nor_loaded(drafter_pair: tuple[Path, Path], tmp_path: Path,
                                                         damage, named: str) -> None:
    """import-drafter writes nothing (exit 2, the weights file and the problem named) and the decoders' loader
    refuses the same drafter; on ccd61ee import-drafter wrote all four with exit 0 and evaluate ran the NaN one."""
    from eagle.decode.draft_infer import DraftCheckpointError, load_drafter

    target, draft = drafter_pair
    bad = _copy(draft, tmp_path / "bad", tensor_edit=damage)
    proc = H.eagle_inproc("import-drafter", str(bad), "--out", str(tmp_path / "out"), "--model", str(target))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: {bad}: not imported, its weights are unusable: ")
    assert f"{bad / 'model.safetensors'} {named}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(DraftCheckpointError) as exc:
        load_drafter(bad, target_vocab_size=td.VOCAB)
    assert named in str(exc.value) and f"eagle check-checkpoint {bad} --model TARGET" in str(exc.value)
    assert exc.value.code == 2
    assert not check_checkpoint(bad, target).ok  # and check-checkpoint names it (as before)
    good = H.eagle_inproc("import-drafter", str(draft), "--out", str(tmp_path / "good"), "--model", str(target))
    assert good.returncode == 0, good.stderr
