# The two commands a newcomer types: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-fast lint demo bench clean

setup:
	@bash scripts/setup.sh

# The whole suite, slow end-to-end tests included (CI runs exactly this).
test: setup
	$(PY) -m ruff check runbook eagle tests bench
	$(PY) -m pytest -q

# Unit tests only, for a quick loop while editing.
test-fast: setup
	$(PY) -m pytest -q -m "not slow"

lint: setup
	$(PY) -m ruff check runbook eagle tests bench

demo: setup
	@bash scripts/demo.sh

bench: setup
	$(PY) bench/parse_bench.py

clean:
	rm -rf $(VENV) demo .pytest_cache
