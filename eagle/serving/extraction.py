"""Hidden-state extraction through vLLM (`eagle extract --backend vllm`): the engine flags of its
extract_hidden_states method, the server that runs it, one prefill request per sample and the
file the kv connector writes for it (serving.connector on a CPU host, vLLM's own on CUDA).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from eagle.common import EagleError
from eagle.serving.client import in_flight
from eagle.serving.flags import SERVED_NAME, ServerSpec, VllmFlags, host_has_cuda, server_spec
from eagle.serving.server import ServerFailed, VllmServer, running_server


def extraction_args(layer_ids: Sequence[int], num_layers: int, storage: Path, cpu: bool) -> list[str]:
    """vLLM flags for hidden-state extraction (pure).

    vLLM's `extract_hidden_states` method captures, for each id in its layer list, the residual
    stream entering that decoder layer (id N = after the last layer, before the final norm); a
    kv connector writes them per request to `storage` as `hidden_states [T, L+1, H]` + `token_ids`.
    On CPU hosts the stock ExampleHiddenStatesConnector cannot run (it uses CUDA streams), so
    the CPU twin in eagle/serving/connector.py is used instead.
    """
    ids = sorted(int(i) for i in layer_ids) + [num_layers]
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}}}
    kv: dict[str, Any] = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                          "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    if cpu:
        kv |= {"kv_connector": "CpuHiddenStatesConnector", "kv_connector_module_path": "eagle.serving.connector"}
    return ["--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv),
            "--no-enable-prefix-caching"]


def _read_hidden_file(path: str, timeout: float = 60.0) -> dict[str, Any]:
    """Load one connector output, waiting on its `.lock` (held while the writer is busy)."""
    import fcntl

    from safetensors.torch import load_file

    lock = path + ".lock"
    if os.path.exists(lock):
        fd = os.open(lock, os.O_RDONLY)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise EagleError(f"timed out waiting for vLLM to write {path}") from None
                    time.sleep(0.05)
        finally:
            os.close(fd)
    data = load_file(path)
    for p in (path, lock):
        with contextlib.suppress(FileNotFoundError):
            os.remove(p)
    return data


def extract_one(url: str, ids: list[int], timeout: float = 3600.0) -> dict[str, Any]:
    """Prefill `ids` (max_tokens=1) and return the connector's {hidden_states, token_ids}."""
    import httpx

    body = {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=timeout)
    if r.status_code != 200:
        raise EagleError(f"vLLM refused an extraction request ({r.status_code}): {r.text[:500]}")
    params = r.json().get("kv_transfer_params") or {}
    path = params.get("hidden_states_path")
    if not path:
        raise EagleError(f"vLLM's response carries no hidden_states_path (kv_transfer_params={params})")
    data = _read_hidden_file(path)
    got = data["token_ids"].tolist()
    if got != list(ids):
        raise EagleError(f"vLLM returned hidden states for other tokens ({len(got)} ids, expected {len(ids)})")
    return data


def extraction_spec(model_dir: str | os.PathLike[str], samples: Sequence[Sequence[int]], layer_ids: Sequence[int],
                    storage: Path, flags: VllmFlags, cuda: bool, concurrency: int,
                    dtype: str | None = None) -> ServerSpec:
    """The server that extracts: the target with vLLM's extract_hidden_states method (pure)."""
    from eagle.target import open_target

    target = open_target(model_dir, flags.trusts_remote_code)
    n_layers = target.num_layers
    layer_ids = target.layer_ids(layer_ids)
    return server_spec(model_dir, flags, cuda, dtype=dtype, max_model_len=max(len(s) for s in samples) + 8,
                       max_num_seqs=max(1, concurrency),
                       task_args=extraction_args(layer_ids, n_layers, storage, cpu=not cuda))


def extract_vllm(model_dir: str | os.PathLike[str], samples: Sequence[Sequence[int]], layer_ids: Sequence[int],
                 flags: VllmFlags | None = None, *, concurrency: int = 8, dtype: str | None = None,
                 startup_timeout: float = 300.0, echo: bool = True) -> Iterator[tuple[int, Any]]:
    """Yield (position in `samples`, `hidden_states [T, L+1, H]`) as vLLM finishes each sample,
    with `concurrency` requests in flight.

    Same layout as the hf backend: the aux layers (decoder-layer inputs) in ascending order, then
    the last layer before the final norm; dtype as served (bf16 on GPU, float32 on CPU by default).
    The server runs while the generator is consumed and is stopped when it finishes or is closed.
    """
    rows = [list(map(int, s)) for s in samples]
    if not rows:
        return
    storage_root = Path(tempfile.mkdtemp(prefix="eagle-vllm-hidden-"))
    try:
        spec = extraction_spec(model_dir, rows, layer_ids, storage_root, flags or VllmFlags(), host_has_cuda(),
                               concurrency, dtype)
        with running_server(spec, startup_timeout, echo, prefix="eagle-vllm-extract-") as server:
            yield from hidden_states_from(server, rows, len(layer_ids), concurrency)
    finally:
        shutil.rmtree(storage_root, ignore_errors=True)


def hidden_states_from(server: VllmServer, samples: Sequence[list[int]], num_aux: int,
                       concurrency: int) -> Iterator[tuple[int, Any]]:
    """Extract `samples` through a running extraction server; (position, hidden_states) as they finish."""
    try:
        for pos, data in in_flight(lambda ids: extract_one(server.url, ids), list(samples), concurrency):
            hs = data["hidden_states"]
            n = len(samples[pos])
            if hs.dim() != 3 or hs.shape[0] != n or hs.shape[1] != num_aux + 1:
                raise EagleError(f"vLLM hidden states have shape {list(hs.shape)}, expected [{n}, {num_aux + 1}, H]")
            yield pos, hs
    except EagleError as exc:
        if isinstance(exc, ServerFailed):
            raise
        raise server.failed(exc) from None
    except Exception as exc:  # noqa: BLE001 - a dead server shows up as connection errors: show its log
        raise server.failed(exc) from None
