"""The benchmark suites, run as `python -m tools.bench --suite=NAME` (or `python -m tools.benchmarks.NAME`).

Naming: kernel_<name> times a Triton kernel against its PyTorch counterpart; a variant's name
(mla, bigbird, gla) times that attention variant's model against MHA; longctx times every
variant at long context; data times the tokenizing pipeline. harness.py holds what they
share (flags, timing, budget, peak memory, output, the run-folder reader).
"""
