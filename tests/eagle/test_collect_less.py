"""eagle's processes collect cyclic garbage less often (eagle.common.collect_less): the command line and the
vLLM server eagle starts set the thresholds before importing torch, transformers or vLLM; cycles are still
collected; a process that chose to collect even less keeps its choice. The vLLM server also freezes what
its imports made before it starts (eagle.serving.vllm_api_server.import_and_freeze)."""

from __future__ import annotations

import gc
import weakref

from helpers import python_snippet

from eagle.common import GC_THRESHOLDS, collect_less
from eagle.serving.vllm_api_server import SERVER_MODULE


def test_the_command_line_sets_the_thresholds_before_a_verb_imports_anything_heavy() -> None:
    done = python_snippet("""
        import atexit, gc, sys
        atexit.register(lambda: print(gc.get_threshold(), "torch" in sys.modules, "transformers" in sys.modules))
        sys.argv = ["eagle", "serve-config", "--help"]
        from eagle.cli import main
        main()
    """, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"{GC_THRESHOLDS} False False"


def test_the_vllm_server_sets_them_before_vllm_is_imported() -> None:
    """eagle/serving/vllm_api_server.py: here its import-and-freeze step and runpy's run of vLLM's server only
    report what they found, in the order they were called."""
    done = python_snippet("""
        import gc, runpy, sys
        from eagle.serving import vllm_api_server
        calls = []
        vllm_api_server.import_and_freeze = lambda: calls.append(("freeze", gc.get_threshold(), "vllm" in sys.modules))
        runpy.run_module = lambda name, **kw: calls.append(("run", name, kw))
        vllm_api_server.main()
        print(calls)
    """, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str([("freeze", GC_THRESHOLDS, False),
                                                ("run", SERVER_MODULE, {"run_name": "__main__", "alter_sys": True})])


def test_the_server_module_is_imported_then_frozen_and_run_afresh_without_a_warning() -> None:
    """import_and_freeze on a small module of the standard library with a `__main__` part (json.tool):
    its imports stay, the module itself is dropped so that runpy runs it afresh with no RuntimeWarning
    (warnings are errors here), and what was alive is frozen; a module that is not there freezes nothing."""
    done = python_snippet("""
        import gc, runpy, sys, warnings
        from eagle.serving.vllm_api_server import import_and_freeze
        assert gc.get_freeze_count() == 0
        print(import_and_freeze("no_such_module_here"), gc.get_freeze_count())
        print(import_and_freeze("json.tool"), "json.tool" in sys.modules, "json" in sys.modules,
              gc.get_freeze_count() > 1000)
        warnings.simplefilter("error")
        runpy.run_module("json.tool", run_name="not_main")
        print("ran")
    """, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-3:] == ["False 0", "True False True True", "ran"]


def test_cycles_are_still_collected_and_a_rarer_choice_is_kept() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        collect_less()
        assert gc.get_threshold() == GC_THRESHOLDS and gc.isenabled()

        class Node:
            pass

        gc.collect()  # the young generation's count starts at zero
        node = Node()
        node.self = node  # type: ignore[attr-defined]  # a cycle: reference counting alone never frees it
        alive = weakref.ref(node)
        del node
        few = [[] for _ in range(5_000)]  # would have run a pass at (700, 10, 10)
        assert alive() is not None, "a collection ran before the threshold"
        many = [[] for _ in range(GC_THRESHOLDS[0])]  # past the threshold: a pass runs and frees the cycle
        assert alive() is None, "a young cycle outlived more allocations than the threshold"
        del few, many

        gc.set_threshold(100_000, 20, 20)
        collect_less()
        assert gc.get_threshold() == (100_000, 20, 20)
    finally:
        gc.set_threshold(*before)
