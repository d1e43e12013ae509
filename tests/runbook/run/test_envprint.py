"""The environment fingerprint: secrets never recorded; torch probed in a subprocess."""

from __future__ import annotations

import pytest

from runbook.run.envprint import fingerprint, is_secret_name, probe_torch, selected_env


def test_secret_names_are_never_kept():
    env = {
        "CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "hf_x", "HF_HOME": "/h", "NCCL_SOCKET_IFNAME": "eth0",
        "WANDB_API_KEY": "k", "VLLM_SECRET": "s", "TORCH_PASSWORD": "p", "HOME": "/root", "OMP_NUM_THREADS": "4",
    }
    kept = selected_env(env)
    assert kept == {"CUDA_VISIBLE_DEVICES": "0,1", "HF_HOME": "/h", "NCCL_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "4"}
    assert all(is_secret_name(n) for n in ("HF_TOKEN", "my_api_key", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY"))


def test_fingerprint_without_probe_is_fast_and_clean():
    fp = fingerprint({"HF_TOKEN": "hf_sekrit_value", "CUDA_VISIBLE_DEVICES": "0"}, probe=False)
    assert fp.python and fp.host and fp.torch is None and fp.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert "sekrit" not in fp.model_dump_json()


def test_variables_that_are_not_utf8_are_recorded_with_their_bytes_written_out():
    """`OMP_NUM_THREADS=$'4\\xff'` (Python keeps 0xff as the lone surrogate \\udcff) made `runbook next` fail
    with an internal error writing the run record; the record now holds the bytes written \\xff."""
    fp = fingerprint({"OMP_NUM_THREADS": "4\udcff", "NCCL_\udcfe": "1", "HF_HOME": "/h\ud83d"}, probe=False)
    assert fp.env == {"OMP_NUM_THREADS": "4\\xff", "NCCL_\\xfe": "1", "HF_HOME": "/h\\ud83d"}
    assert type(fp).model_validate_json(fp.model_dump_json()) == fp  # what the run record writes and reads


@pytest.mark.slow
def test_probe_finds_torch_in_a_subprocess():
    found = probe_torch(timeout_s=120)
    assert found.get("torch", "").startswith("2.")
    assert probe_torch(timeout_s=0.001) == {}  # a probe that does not answer in time is dropped
