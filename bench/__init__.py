"""Benchmark scripts (not installed with the package): run each from the repository root as
`python -m bench.NAME`; bench/README.md says what each measures, docs/benchmarks.md holds the results."""
