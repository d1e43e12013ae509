# The two commands a newcomer types: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
# Test processes (pytest-xdist): three on the 2-core machines we test on (about a third of a lane's wall
# time is waiting: vLLM and Slurm starting, subprocesses; a third lane fills it: docs/benchmarks.md,
# 2026-12-04 third session); `make test WORKERS=0` runs
# them all in one process. --dist loadscope runs each module's tests in one worker, so a module's
# fixtures (a vLLM server, the Slurm cluster) start once; artefacts shared between modules are built
# once per session by whichever worker asks first (tests/conftest.py built_once).
# --no-loadscope-reorder keeps conftest's order (the longest modules first) instead of xdist's
# most-tests-first, which started the one-test demo last.
WORKERS ?= 3
XDIST := -n $(WORKERS) --dist loadscope --no-loadscope-reorder
# pytest's environment: see `bytecode` below.
TESTENV := PYTHONDONTWRITEBYTECODE=
# mypy's cache, kept per machine beside the toy models ($EAGLE_CACHE, else ~/.cache/runbook-eagle): a fresh
# clone's check then reads what this machine checked before instead of starting cold (43.5 -> 2.8 s on the
# 2-core machine; docs/benchmarks.md, 2026-12-05); mypy re-checks each module whose source or options differ.
# `make test MYPY_CACHE=.mypy_cache` keeps it in the clone (pyproject.toml's cache_dir, for a bare `mypy`).
MYPY_CACHE ?= $(or $(EAGLE_CACHE),$(HOME)/.cache/runbook-eagle)/mypy

.PHONY: setup bytecode test test-fast test-gpu lint typecheck demo bench clean

setup:
	@bash scripts/setup.sh

# The repository's own bytecode, written before the tests: the suite starts runbook and eagle as
# subprocesses hundreds of times, and where the environment sets PYTHONDONTWRITEBYTECODE (it is set
# on the machines we test on) each of them compiled the modules it imports from source again (tests/runbook
# with three workers: 298 -> 273 s of CPU; docs/benchmarks.md, 2026-12-04 sixth session). Under a second
# when nothing changed; Python still checks each cached file against its source. pytest runs with the
# variable cleared (TESTENV) so that it keeps its rewritten test modules too: each worker collected the
# whole suite again from source (9.4 -> 4.2 s of CPU a worker).
bytecode: setup
	@$(PY) -m compileall -q runbook eagle bench tests

# The whole suite, slow end-to-end tests included (CI runs exactly this).
test: setup bytecode
	$(PY) -m ruff check runbook eagle tests bench
	$(PY) -m mypy --cache-dir "$(MYPY_CACHE)"
	$(TESTENV) $(PY) -m pytest -q $(XDIST) --durations=30

# Unit tests only, for a quick loop while editing.
test-fast: setup bytecode
	$(TESTENV) $(PY) -m pytest -q $(XDIST) -m "not slow"

# The GPU suite (tests/gpu/test_gpu.py) on a CUDA host; `make test-gpu PY=python3` uses another interpreter,
# `make test-gpu GPU_K='cuda_graphs or train'` a part of it (the whole no longer fits one 10-minute call on one H200;
# three calls do: GPU_K='not (cuda_graphs or compiles_once or copy_stream or ddp or sampled or resumes or mla)',
# GPU_K='cuda_graphs or compiles_once or copy_stream or ddp', GPU_K='sampled or resumes or mla').
GPU_K ?=
test-gpu:
	$(PY) -m pytest -q -m gpu -p no:cacheprovider --durations=0 -rA $(if $(GPU_K),-k "$(GPU_K)") tests/gpu/test_gpu.py

lint: setup
	$(PY) -m ruff check runbook eagle tests bench

# mypy as configured in pyproject.toml: runbook/ strict, eagle/ at mypy's default level.
typecheck: setup
	$(PY) -m mypy --cache-dir "$(MYPY_CACHE)"

demo: setup
	@bash scripts/demo.sh

bench: setup
	$(PY) -m bench.parse_bench

clean:
	rm -rf $(VENV) demo .pytest_cache .mypy_cache
