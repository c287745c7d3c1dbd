"""Benchmarks (`make bench`): each writes `bench/results/<name>.json` and a row to the table of
its section in `docs/benchmarks.md`. Ratios are measured side by side in one run."""
