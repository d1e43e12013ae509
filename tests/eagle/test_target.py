"""eagle/target.py: the one reader of a target directory, and its rules.

Pure rules (layer ids, drafter shapes, placement) and readers over tiny untrained targets of every
architecture (tests/support/_arch_helpers.py): the text model found also under `text_config`, its
embedding / lm_head / norm read from safetensors whatever the prefix, custom code refused without
--trust-remote-code, and the CLI's bad-input cases (exit 2, one line naming the file and the fix,
nothing written).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import _arch_helpers as arch_helpers
import pytest
import torch
from click.testing import CliRunner

from eagle.common import EagleError
from eagle.target import (
    DraftShape,
    check_layer_ids,
    default_layer_ids,
    open_target,
    placement,
    read_draft_shape,
    resolve_layer_ids,
)

ARCHS = arch_helpers.ARCHS


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return arch_helpers.random_targets(tmp_path_factory.mktemp("targets"))


# ---------------------------------------------------------------- layer ids: one rule everywhere


def test_default_layer_ids():
    assert default_layer_ids(8) == [2, 4, 5]
    assert resolve_layer_ids(None, 8) == [2, 4, 5]
    assert resolve_layer_ids("", 32) == [2, 16, 29]
    assert resolve_layer_ids(None, 61) == [2, 30, 58]  # DeepSeek-V3 / Kimi-K2: 61 layers


@pytest.mark.parametrize("spec, n, why", [
    ("2,2,5", 8, "distinct"),
    ("2,4,8", 8, "out of range"),  # id == N: the last layer's output is not an aux layer (train once took it)
    ("-1,4,5", 8, "out of range"),
    ("5,4,2", 8, "ascending order"),
    ("2,x", 8, "comma-separated integers"),
    (None, 4, "collide"),  # [2, 2, 1] for a 4-layer target
])
def test_layer_id_rules(spec, n, why):
    with pytest.raises(EagleError, match=why) as err:
        resolve_layer_ids(spec, n)
    assert err.value.code == 2


def test_explicit_layer_ids_pass():
    assert resolve_layer_ids("0,3,7", 8) == [0, 3, 7]
    assert resolve_layer_ids([1, 2], 8) == [1, 2]
    assert check_layer_ids([2, 4, 5], 8) == [2, 4, 5]


# ---------------------------------------------------------------- reading targets


def test_every_architecture_is_read_from_config_json_alone(targets: dict[str, Path]) -> None:
    seen = {}
    for name, path in targets.items():
        t = open_target(path)
        seen[name] = (t.model_type, t.text_model_type, t.text_key, t.num_layers, t.hidden_size, t.vocab_size,
                      t.fast_decoder, t.custom_code)
    assert seen == {
        "llama": ("llama", "llama", None, 8, 128, 2048, True, False),
        "qwen3": ("qwen3", "qwen3", None, 8, 128, 2048, True, False),
        "deepseek_v3": ("deepseek_v3", "deepseek_v3", None, 8, 128, 2048, False, False),
        "kimi_k25": ("kimi_k25", "deepseek_v3", "text_config", 8, 128, 2048, False, False),
        "remote": ("toy_remote", "toy_remote", None, 8, 128, 2048, False, True),
    }
    assert open_target(targets["llama"]).eos_ids() == [5]  # <|end|>, from generation_config.json


@pytest.mark.parametrize("arch", ARCHS)
def test_embedding_head_and_norm_come_from_the_files(arch: str, targets: dict[str, Path]) -> None:
    """Whatever the wrapper's prefix (model., language_model.model.), the rows are the model's own."""
    t = open_target(targets[arch])
    got = t.read_weights(["embed_tokens.weight", "lm_head.weight", "norm.weight"])
    model = t.load_model("cpu", torch.float32)
    assert torch.equal(got["embed_tokens.weight"], model.get_input_embeddings().weight)
    assert torch.equal(got["lm_head.weight"], model.get_output_embeddings().weight)
    from eagle.data.capture import decoder_of

    assert torch.equal(got["norm.weight"], decoder_of(model).norm.weight)
    assert t.text_prefix == ("language_model.model." if arch == "kimi_k25" else "model.")
    assert 0 < t.weight_bytes() <= sum((t.dir / f).stat().st_size for f in set(t.weight_map.values()))


def test_a_multimodal_config_under_language_config_is_found(tmp_path: Path) -> None:
    text = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096, "vocab_size": 151936,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "some_vlm", "language_config": text,
                                                      "vision_config": {"hidden_size": 1024}}))
    t = open_target(tmp_path)
    assert (t.text_key, t.text_model_type, t.num_layers, t.default_layer_ids()) == \
        ("language_config", "qwen3", 36, [2, 18, 33])


def test_custom_code_needs_the_flag(targets: dict[str, Path]) -> None:
    t = open_target(targets["remote"])
    for load in (t.load_tokenizer, lambda: t.load_model("cpu", torch.float32)):
        with pytest.raises(EagleError, match="pass --trust-remote-code") as err:
            load()
        assert err.value.code == 2
    trusted = open_target(targets["remote"], trust_remote_code=True)
    assert type(trusted.load_tokenizer()).__name__ == "ToyRemoteTokenizer"
    assert type(trusted.load_model("cpu", torch.float32)).__name__ == "ToyRemoteForCausalLM"


@pytest.mark.parametrize("config, why", [
    ({"model_type": "vlm", "vision_config": {"hidden_size": 8}}, "no text model found"),
    ({"num_hidden_layers": 8, "hidden_size": "big", "vocab_size": 10}, "must be positive integers"),
    ("{not json", "invalid JSON"),
])
def test_bad_target_configs_are_named(tmp_path: Path, config, why) -> None:
    (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(EagleError, match=why) as err:
        open_target(tmp_path)
    assert err.value.code == 2 and str(tmp_path / "config.json") in str(err.value)
    with pytest.raises(EagleError, match="no such directory"):
        open_target(tmp_path / "absent")


# ---------------------------------------------------------------- the drafter's layer shape


def test_the_drafter_layer_takes_the_targets_shape_by_default(targets: dict[str, Path]) -> None:
    def shape(path: Path, s: DraftShape | None = None) -> tuple:
        c = open_target(path).draft_layer_config(s)
        return (c.model_type, c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
                c.num_key_value_heads, c.head_dim, c.vocab_size)

    assert shape(targets["llama"]) == ("llama", 1, 128, 256, 4, 2, 32, 2048)
    assert shape(targets["qwen3"]) == ("llama", 1, 128, 256, 4, 2, 32, 2048)
    # MLA heads are no Llama layer's: heads = the target's, kv heads = heads, head dim = hidden // heads
    assert shape(targets["deepseek_v3"]) == ("llama", 1, 128, 256, 4, 4, 32, 2048)
    assert shape(targets["kimi_k25"]) == shape(targets["deepseek_v3"])
    # set on its own, as published drafters do (Kimi-K2.5's: 64 heads of 128 at hidden 7168)
    own = DraftShape(intermediate_size=384, num_attention_heads=8, num_key_value_heads=2, head_dim=24)
    assert shape(targets["kimi_k25"], own) == ("llama", 1, 128, 384, 8, 2, 24, 2048)


@pytest.mark.parametrize("s, why", [
    (DraftShape(num_attention_heads=6, num_key_value_heads=4), "not a multiple of 4 kv heads"),
    (DraftShape(num_attention_heads=3, num_key_value_heads=1), "not divisible by 3 heads"),
    (DraftShape(head_dim=15), "is odd"),
])
def test_bad_drafter_shapes_are_refused(targets: dict[str, Path], s: DraftShape, why: str) -> None:
    with pytest.raises(EagleError, match=why) as err:
        open_target(targets["qwen3"]).draft_layer_config(s)
    assert err.value.code == 2 and "--draft-" in str(err.value)


def test_a_drafter_shape_file(tmp_path: Path) -> None:
    f = tmp_path / "shape.json"
    f.write_text(json.dumps({"transformer_layer_config": {"num_attention_heads": 64, "head_dim": 128,
                                                          "intermediate_size": 12288, "hidden_size": 7168}}))
    assert read_draft_shape(f) == DraftShape(num_attention_heads=64, head_dim=128, intermediate_size=12288)
    f.write_text('{"num_attention_heads": 0}')
    with pytest.raises(EagleError, match="positive integers"):
        read_draft_shape(f)
    f.write_text("[1]")
    with pytest.raises(EagleError, match="expected a JSON object"):
        read_draft_shape(f)


def test_placement_spreads_only_what_one_gpu_cannot_hold() -> None:
    gib = 1 << 30
    assert placement(16 * gib, []) == "cuda"  # no GPU visible: nothing to spread over
    assert placement(16 * gib, [140 * gib]) == "cuda"
    assert placement(2000 * gib, [140 * gib] * 8) == "cuda"  # 1T in bf16 does not fit 8 x 140 GiB: OOM named
    assert placement(600 * gib, [140 * gib] * 8) == "auto"  # 1T in fp8 / a 300B model: spread over the 8
    assert placement(130 * gib, [140 * gib]) == "cuda"  # one GPU: the load itself reports what does not fit


# ---------------------------------------------------------------- the CLI: exit 2, one line, nothing written


def test_bad_inputs_exit_2_naming_the_file_and_fix(targets: dict[str, Path], tmp_path: Path) -> None:
    from eagle.cli import cli

    runner = CliRunner()
    vlm = tmp_path / "vlm"
    vlm.mkdir()
    (vlm / "config.json").write_text(json.dumps({"model_type": "vlm", "vision_config": {}}))
    out = tmp_path / "out"
    cases = [
        (["train", "--model", str(vlm), "--data", str(tmp_path), "--out", str(out)], "no text model found"),
        (["extract", "--model", str(vlm), "--data", str(tmp_path), "--out", str(out)], "no text model found"),
        (["train", "--model", str(targets["qwen3"]), "--data", str(tmp_path), "--out", str(out), "--draft-heads", "3"],
         "not a multiple of 2 kv heads"),
        (["train", "--model", str(targets["qwen3"]), "--data", str(tmp_path), "--out", str(out), "--online",
          "--layer-ids", "2,4,8"], "out of range"),
    ]
    for args, why in cases:
        res = runner.invoke(cli, args)
        assert res.exit_code == 2, (args, res.output)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and why in lines[0], res.output
        assert not out.exists()
    remote = tmp_path / "remote-copy"
    shutil.copytree(targets["remote"], remote)
    res = runner.invoke(cli, ["prepare", "--model", str(remote), "--data", str(tmp_path / "none.jsonl"),
                              "--out", str(out)])
    assert res.exit_code == 1 and "no such file" in res.output  # the data is checked first
