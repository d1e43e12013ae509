"""The CPU hidden-states connector: vLLM's ExampleHiddenStatesConnector without CUDA streams.

On a CPU host the stock connector cannot run (it uses CUDA streams; docs/eagle.md's vLLM section
tells how it fails there). serving.extraction.extraction_args then
names this module as `kv_connector_module_path` ("eagle.serving.connector"); vLLM imports it
inside the engine and asks it for `CpuHiddenStatesConnector` by name. The class is built on that
first request, so importing this module does not import vllm.
"""

from __future__ import annotations

import functools
import os
from typing import Any


@functools.cache
def _cpu_connector_class() -> type:
    """ExampleHiddenStatesConnector without CUDA streams: a synchronous copy and write on CPU."""
    from safetensors.torch import save_file
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
        extract_from_kv_cache,
    )

    class _Done:
        @staticmethod
        def query() -> bool:
            return True

    class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
        def _submit_async_write(self, pending: Any) -> None:
            import torch

            if not self._is_tp_rank_zero:
                return
            blocks = torch.tensor(pending.block_ids, dtype=torch.long)
            slots = (torch.arange(self._block_size).reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
            assert self._kv_cache is not None  # registered before any request
            hs = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            try:
                save_file({"hidden_states": hs, "token_ids": pending.token_ids.clone()}, pending.filename)
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)
            self._req_copy_events[pending.req_id] = _Done()  # type: ignore[assignment]  # vLLM only calls .query() on these

    return CpuHiddenStatesConnector


def __getattr__(name: str) -> Any:
    # vLLM's kv_connector_module_path imports this module inside the engine and asks for the
    # class by name; building it lazily keeps `import eagle.serving.server` free of vllm.
    if name == "CpuHiddenStatesConnector":
        return _cpu_connector_class()
    raise AttributeError(name)
