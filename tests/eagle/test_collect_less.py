"""eagle's processes collect cyclic garbage less often (eagle.common.collect_less): the command line and the
vLLM server eagle starts set the thresholds before importing torch, transformers or vLLM; cycles are still
collected; a process that chose to collect even less keeps its choice."""

from __future__ import annotations

import gc
import weakref

from helpers import python_snippet

from eagle.common import GC_THRESHOLDS, collect_less


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
    """eagle/serving/vllm_api_server.py: here runpy's run of vLLM's server only reports what it found."""
    done = python_snippet("""
        import gc, runpy, sys
        runpy.run_module = lambda *a, **k: print(gc.get_threshold(), "vllm.entrypoints.openai.api_server" in sys.modules)
        from eagle.serving import vllm_api_server
        vllm_api_server.main()
    """, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"{GC_THRESHOLDS} False"


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
