"""eagle/serving/flags.py: the CPU rope workaround goes to MLA targets on CPU hosts only."""

from __future__ import annotations

import json
from pathlib import Path

from eagle.serving.flags import CPU_ROPE_FLAG, VllmFlags, is_mla, server_command, server_spec, vllm_flags


def target(tmp_path: Path, name: str, **extra: object) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "x", "num_hidden_layers": 8, "hidden_size": 64,
                                               "vocab_size": 100, **extra}))
    return d


def test_mla_targets_on_a_cpu_host_get_vllms_pytorch_rope(tmp_path: Path) -> None:
    mla = target(tmp_path, "mla", kv_lora_rank=512)
    nested = tmp_path / "wrapped"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": {
        "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 100, "kv_lora_rank": 512}}))
    llama = target(tmp_path, "llama")
    assert is_mla(mla) and is_mla(nested) and not is_mla(llama) and not is_mla(tmp_path / "absent")
    flag = ["--" + CPU_ROPE_FLAG[0], str(CPU_ROPE_FLAG[1])]

    def has_flag(cmd: list[str]) -> bool:
        return any(cmd[i:i + 2] == flag for i in range(len(cmd)))

    assert has_flag(server_command(server_spec(mla, VllmFlags(), cuda=False)))
    assert has_flag(server_command(server_spec(nested, VllmFlags(), cuda=False)))
    assert not has_flag(server_command(server_spec(mla, VllmFlags(), cuda=True)))  # CUDA's kernel takes strides
    assert not has_flag(server_command(server_spec(llama, VllmFlags(), cuda=False)))
    own = server_command(server_spec(mla, vllm_flags(['compilation-config={"custom_ops":["all"]}']), cuda=False))
    assert not has_flag(own) and own.count("--compilation-config") == 1  # the user's own replaces it
