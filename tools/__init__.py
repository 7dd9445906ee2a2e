"""The studies, run from the repo root as `python -m tools.NAME`: sweep, compare, eval, analyze,
plan, bench (+ benchmarks/), compile_check, compare_positions; gpu_check.sh for a lent GPU."""
