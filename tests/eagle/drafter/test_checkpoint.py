"""The servable drafter checkpoint: golden config keys and tensor names/shapes, validation, errors."""

from __future__ import annotations

import json
from pathlib import Path

import _train_data as td
import pytest
import torch

from eagle.common import EagleError
from eagle.drafter import checkpoint

H, V, DV, INTER = td.HIDDEN, td.VOCAB, td.DRAFT_VOCAB, 64
GOLDEN_TENSORS = {  # what `eagle train` writes: no frozen embedding (the target's rows), as published drafters
    "d2t": [DV],
    "t2d": [V],
    "fc.weight": [H, 3 * H],
    "layers.0.hidden_norm.weight": [H],
    "layers.0.input_layernorm.weight": [H],
    "layers.0.post_attention_layernorm.weight": [H],
    "layers.0.mlp.gate_proj.weight": [INTER, H],
    "layers.0.mlp.up_proj.weight": [INTER, H],
    "layers.0.mlp.down_proj.weight": [H, INTER],
    "layers.0.self_attn.q_proj.weight": [4 * 8, 2 * H],
    "layers.0.self_attn.k_proj.weight": [2 * 8, 2 * H],
    "layers.0.self_attn.v_proj.weight": [2 * 8, 2 * H],
    "layers.0.self_attn.o_proj.weight": [H, 4 * 8],
    "lm_head.weight": [DV, H],
    "norm.weight": [H],
}


@pytest.fixture(scope="module")
def saved_drafter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from eagle.drafter import model as drafter

    root = tmp_path_factory.mktemp("ckpt").resolve()
    target = td.make_target(root / "target")
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[::2] = True
    d2t = torch.nonzero(t2d).squeeze(1) - torch.arange(DV)
    model = drafter.build_drafter(target, layer_ids=td.LAYER_IDS, d2t=d2t, t2d=t2d, ttt_steps=3)
    drafter.save(model, root / "draft")
    return target, root / "draft"


def test_golden_config_keys_and_tensors(saved_drafter: tuple[Path, Path]) -> None:
    from safetensors import safe_open

    target, out = saved_drafter
    assert target.is_absolute()
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((out / "config.json").read_text())
    assert "model_type" not in cfg
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["norm_before_residual"] is False  # written explicitly: vLLM's default is True
    assert cfg["norm_before_fc"] is False and cfg["norm_output"] is False and cfg["fc_norm"] is False
    assert tl_dtype(cfg) == "bfloat16"
    assert cfg["draft_vocab_size"] == DV
    assert cfg["eagle_aux_hidden_state_layer_ids"] == td.LAYER_IDS
    tl = cfg["transformer_layer_config"]
    assert tl["model_type"] == "llama" and tl["num_hidden_layers"] == 1 and tl["vocab_size"] == V
    assert (tl["hidden_size"], tl["intermediate_size"], tl["num_attention_heads"], tl["num_key_value_heads"]) == (H, INTER, 4, 2)
    assert "_attn_implementation" not in tl
    spec = cfg["speculators_config"]
    assert spec["proposal_methods"][0]["speculative_tokens"] == 3
    assert spec["verifier"]["name_or_path"] == str(target)
    assert "auto_map" not in cfg
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        assert f.get_slice("d2t").get_dtype() == "I64" and f.get_slice("t2d").get_dtype() == "BOOL"
        floats = {f.get_slice(k).get_dtype() for k in f.keys() if k not in ("d2t", "t2d")}
    assert shapes == GOLDEN_TENSORS
    assert floats == {"BF16"}  # bf16 by default, as published drafters are


def tl_dtype(cfg: dict) -> str:
    return cfg["transformer_layer_config"]["dtype"]


def test_keep_float32_and_a_relative_verifier_made_absolute(saved_drafter: tuple[Path, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """--keep-float32 keeps the masters' dtype; a verifier given relative to the cwd is stored absolute,
    a name that is no local path (a hub id) as given."""
    from safetensors import safe_open

    from eagle.drafter import model as drafter

    target, out = saved_drafter
    model = drafter.load_drafter(out, target_dir=target)
    monkeypatch.chdir(target.parent)
    model.config.speculators_config.verifier.name_or_path = target.name  # relative to the cwd
    drafter.save(model, tmp_path / "f32", keep_float32=True)
    cfg = json.loads((tmp_path / "f32" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(target)
    assert tl_dtype(cfg) == "float32"
    with safe_open(str(tmp_path / "f32" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys() if k not in ("d2t", "t2d")} == {"F32"}
        assert "embed_tokens.weight" not in set(f.keys())
    model.config.speculators_config.verifier.name_or_path = "some-org/some-model"
    drafter.save(model, tmp_path / "hub")
    cfg = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "some-org/some-model"


def test_read_config_and_state_roundtrip(saved_drafter: tuple[Path, Path]) -> None:
    _, out = saved_drafter
    cfg = checkpoint.read_draft_config(out)
    assert (cfg.hidden_size, cfg.draft_vocab_size, cfg.vocab_size, cfg.layer_ids) == (H, DV, V, td.LAYER_IDS)
    assert cfg.speculative_tokens == 3 and cfg.norm_before_residual is False and cfg.head_dim == 8
    state = checkpoint.load_draft_state(out)
    assert set(state) == set(GOLDEN_TENSORS)
    # d2t maps draft ids to target ids: every mapped id is a token t2d marks
    assert bool(state["t2d"][torch.arange(DV) + state["d2t"]].all())


def _tensors(cfg: checkpoint.DraftConfig) -> dict[str, torch.Tensor]:
    return {k: torch.zeros(s, dtype=torch.long if k == "d2t" else torch.float32)
            for k, s in checkpoint.expected_shapes(cfg).items()}


def _config_dict(saved: Path) -> dict:
    return json.loads((saved / "config.json").read_text())


def test_write_refuses_malformed_and_writes_nothing(saved_drafter: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = saved_drafter
    cfg = checkpoint.read_draft_config(out)
    tensors = _tensors(cfg)
    del tensors["norm.weight"]
    tensors["fc.weight"] = torch.zeros(H, 2 * H)
    with pytest.raises(EagleError) as err:
        checkpoint.write_checkpoint(tmp_path / "bad", _config_dict(out), tensors)
    assert "missing tensor norm.weight" in str(err.value) and "fc.weight has shape [32, 64]" in str(err.value)
    assert not (tmp_path / "bad").exists()


def test_write_minimal_checkpoint_without_optional_tensors(saved_drafter: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = saved_drafter
    data = _config_dict(out)
    data["model_type"] = "llama"  # normalize_config drops it
    cfg = checkpoint.write_checkpoint(tmp_path / "min", data, _tensors(checkpoint.read_draft_config(out)))
    assert "model_type" not in json.loads((tmp_path / "min" / "config.json").read_text())
    assert set(checkpoint.load_draft_state(tmp_path / "min")) == set(checkpoint.expected_shapes(cfg))


def test_read_errors_name_the_problem(saved_drafter: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = saved_drafter
    with pytest.raises(EagleError, match="not found"):
        checkpoint.read_draft_config(tmp_path)
    bad = _config_dict(out)
    bad["model_type"] = "llama"
    del bad["norm_before_residual"]
    # the strict parser of our format names both; the reader of every layout normalises them, as
    # vLLM would read them, and says so (check-checkpoint reports both as problems)
    with pytest.raises(EagleError) as err:
        checkpoint.DraftConfig.from_config_json(bad, source=str(tmp_path / "config.json"))
    assert "norm_before_residual" in str(err.value) and "model_type" in str(err.value)
    (tmp_path / "config.json").write_text(json.dumps(bad))
    (tmp_path / "model.safetensors").symlink_to(out / "model.safetensors")
    ck = checkpoint.read_drafter(tmp_path)
    assert ck.cfg.norm_before_residual is True and "model_type" not in ck.config
    assert any("norm_before_residual" in n for n in ck.notes) and any("model_type" in n for n in ck.notes)
    (tmp_path / "config.json").write_text("{\n  oops")
    with pytest.raises(EagleError, match=r"config.json:2:\d+: invalid JSON"):
        checkpoint.read_draft_config(tmp_path)


def test_fit_problems_name_every_field(saved_drafter: tuple[Path, Path]) -> None:
    _, out = saved_drafter
    have = checkpoint.read_draft_config(out)
    assert checkpoint.fit_problems(have, have) == []
    want = have.model_copy(update={"hidden_size": 64, "draft_vocab_size": 32, "layer_ids": [1, 4, 5]})
    problems = checkpoint.fit_problems(have, want)
    assert [p.split(":")[0] for p in problems] == ["hidden_size", "draft_vocab_size", "layer_ids"]
    assert "drafter has 32, target/data need 64" in problems[0]


def test_reader_takes_sharded_safetensors_and_pytorch_bin(saved_drafter: tuple[Path, Path], tmp_path: Path) -> None:
    """The same weights as model.safetensors, two shards + index, or pytorch_model.bin: the same tensors."""
    from safetensors.torch import save_file

    _, out = saved_drafter
    want = checkpoint.read_drafter(out).tensors()
    names = sorted(want)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((out / "config.json").read_text())
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, part in halves.items():
        save_file({n: want[n] for n in part}, str(sharded / file))
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: file for file, part in halves.items() for n in part}}))
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text((out / "config.json").read_text())
    torch.save(dict(want), binary / "pytorch_model.bin")
    for src in (sharded, binary):
        got = checkpoint.read_drafter(src).tensors()
        assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want), src
    (sharded / sorted(halves)[-1]).unlink()  # a shard the index names is missing
    with pytest.raises(EagleError, match="not found .named in model.safetensors.index.json"):
        checkpoint.read_drafter(sharded)
