#!/usr/bin/env bash
# One-command check of the Triton kernels (FlashAttention, chunked GLA) on a CUDA machine:
#   1. python -m pytest tests/attn_kernels  (the CUDA bf16/fp16 tests run there, fp32 ones natively)
#   2. python -m tools.bench --suite=kernel_flash   (fwd/bwd TFLOP/s vs SDPA flash backend, markdown + JSON; <= 270 s)
#   3. python -m tools.bench --suite=kernel_gla     (GLA kernel vs PyTorch chunked form, ms; under ~2 minutes)
# Usage: tools/gpu_check.sh [OUT_DIR]    (default: $OUT when set, else ./out_gpu_check)
# All steps always run; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-out_gpu_check}}"
mkdir -p "$OUT_DIR"
unset TRITON_INTERPRET  # compiled kernels, not the interpreter

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT_DIR/env.txt"

echo "== pytest tests/attn_kernels"
python -m pytest tests/attn_kernels -q -rs 2>&1 | tee "$OUT_DIR/pytest_kernels.txt"
tests_rc=${PIPESTATUS[0]}

echo "== bench.py --suite=kernel_flash"
python -m tools.bench --suite=kernel_flash --budget_s 270 --out "$OUT_DIR/bench_flash.md" --json "$OUT_DIR/bench_flash.json" \
    2>&1 | tee "$OUT_DIR/bench_flash.log"
bench_rc=${PIPESTATUS[0]}

echo "== bench.py --suite=kernel_gla"
python -m tools.bench --suite=kernel_gla --out "$OUT_DIR/bench_gla.md" --json "$OUT_DIR/bench_gla.json" \
    2>&1 | tee "$OUT_DIR/bench_gla.log"
gla_rc=${PIPESTATUS[0]}

echo "pytest exit $tests_rc, bench exit $bench_rc, bench_gla exit $gla_rc; results in $OUT_DIR"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$gla_rc" -eq 0 ]
