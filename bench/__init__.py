"""Benchmark scripts (not installed with the package): run each from the repository root as
`python -m bench.NAME`. What the scripts share is in bench.harness (measuring, children, results)
and bench.shapes (shapes, targets, data); a script imports those two and never another script.
bench/README.md says what each measures, docs/benchmarks.md holds the current figures."""
