"""Benchmark the Triton FlashAttention-2 kernel against PyTorch SDPA (flash backend).

    python -m tools.bench --suite=kernel_flash --out bench_flash.md [--json bench_flash.json] [--quick]

Times forward and backward separately (triton.testing.do_bench, median) at B=4, H=32, bf16,
T in {1024, ..., 16384}, d in {64, 128}, causal and not, and reports TFLOP/s with
FLOPs = 4*B*H*Tq*Tk*d forward (halved when causal) and 2.5x that for the backward.
Backward time = one o.backward(dO) on a retained graph (forward not included).
--quick runs tiny shapes (on CPU under TRITON_INTERPRET=1) to smoke-test the script itself.
A config that fails is reported in the table and the run goes on; configs past --budget_s
seconds are skipped (and listed), so the script always finishes with a table.
"""
import os
import sys

import torch

if not torch.cuda.is_available():  # CPU smoke test: the kernels only run under the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F

from attn_kernels.flash_attn import flash_attention, tuned_configs
from tools.benchmarks.harness import (
    Budget,
    add_kernel_shape_args,
    attempt,
    device_name,
    emit,
    int_list,
    median_ms,
    parser,
)


def parse_args(argv):
    p = parser(__doc__, out="bench_flash.md", quick="tiny sizes, smoke test (works on CPU)")
    add_kernel_shape_args(p, heads=32, budget_s=420.0)
    return p.parse_args(argv)


def sdpa_flash(q, k, v, causal):
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def bench_one(impl, B, H, T, d, causal, dtype, device):
    """{fwd_ms, bwd_ms} of one implementation at one shape."""
    fn = (lambda q, k, v: flash_attention(q, k, v, causal=causal)) if impl == "triton" else \
        (lambda q, k, v: sdpa_flash(q, k, v, causal))
    q, k, v = (torch.randn(B, H, T, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, T, d, device=device, dtype=dtype)
    fwd_ms = median_ms(lambda: fn(q, k, v), device=device)
    o = fn(q, k, v)

    def bwd():
        q.grad = k.grad = v.grad = None
        o.backward(do, retain_graph=True)
    bwd_ms = median_ms(bwd, device=device)
    return {"fwd_ms": fwd_ms, "bwd_ms": bwd_ms}


def bench_shape(B, H, T, d, causal, dtype, device):
    flops_fwd = 4 * B * H * T * T * d / (2 if causal else 1)
    row = {"B": B, "H": H, "T": T, "d": d, "causal": causal, "dtype": str(dtype).replace("torch.", "")}
    for impl in ("triton", "sdpa"):
        row[impl] = attempt(lambda impl=impl: bench_one(impl, B, H, T, d, causal, dtype, device))
        if "error" not in row[impl]:
            row[impl].update(fwd_tflops=flops_fwd / row[impl]["fwd_ms"] * 1e-9,
                             bwd_tflops=2.5 * flops_fwd / row[impl]["bwd_ms"] * 1e-9)
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def main(argv=None):
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        B, H, seqlens, dims, dtype = 1, 2, [64, 128], [64], torch.float32
    else:
        B, H, dtype = args.batch, args.heads, torch.bfloat16
        seqlens, dims = int_list(args.seqlens), int_list(args.head_dims)
    if device == "cpu" and not args.quick:
        print("error: kernel_flash needs a CUDA device; use --quick for a CPU smoke test", file=sys.stderr)
        sys.exit(2)
    dev_name = device_name() if device == "cuda" else "cpu (Triton interpreter)"
    budget, rows = Budget(args.budget_s), []
    for T in seqlens:
        for d in dims:
            for causal in (False, True):
                if budget.allows(f"T={T} d={d} causal={causal}"):
                    rows.append(bench_shape(B, H, T, d, causal, dtype, device))
                    print(format_row(rows[-1]), flush=True)
    tuned = tuned_configs()  # what _launch's timing chose: worth hard-coding per GPU
    table = format_table(rows, dev_name, budget.skipped, budget.elapsed())
    table += "\nTile configs chosen (BLOCK_M, BLOCK_N, warps, stages):\n" + "".join(
        f"- {case}: {cfg}\n" for case, cfg in tuned.items())
    emit(table, {"device": dev_name, "torch": torch.__version__, "rows": rows, "skipped": budget.skipped,
                     "tuned_configs": {c: list(v) for c, v in tuned.items()}}, args)


def _cell(r, key, fmt):
    return "error" if "error" in r else fmt.format(r[key])


def format_row(row):
    t, s = row["triton"], row["sdpa"]
    return (f"| {row['B']} | {row['T']} | {row['d']} | {'yes' if row['causal'] else 'no'} "
            f"| {_cell(t, 'fwd_tflops', '{:.1f}')} | {_cell(s, 'fwd_tflops', '{:.1f}')} "
            f"| {_cell(t, 'bwd_tflops', '{:.1f}')} | {_cell(s, 'bwd_tflops', '{:.1f}')} "
            f"| {_cell(t, 'fwd_ms', '{:.3f}')} / {_cell(s, 'fwd_ms', '{:.3f}')} "
            f"| {_cell(t, 'bwd_ms', '{:.3f}')} / {_cell(s, 'bwd_ms', '{:.3f}')} |")


def format_table(rows, dev_name, skipped, wall_s):
    lines = [f"# FlashAttention-2 (Triton) vs SDPA flash backend on {dev_name}", "",
             (f"H={rows[0]['H'] if rows else '-'}, dtype {rows[0]['dtype'] if rows else '-'}; TFLOP/s with "
             "FLOPs = 4*B*H*T^2*d forward (halved when causal), 2.5x for backward. Median of "
             f"triton.testing.do_bench. Wall time {wall_s:.0f} s."), "",
             ("| B | T | d | causal | fwd TFLOP/s triton | fwd TFLOP/s sdpa | bwd TFLOP/s triton "
             "| bwd TFLOP/s sdpa | fwd ms triton / sdpa | bwd ms triton / sdpa |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [format_row(r) for r in rows]
    for r in rows:
        for impl in ("triton", "sdpa"):
            if "error" in r[impl]:
                lines.append(f"\n{impl} T={r['T']} d={r['d']} causal={r['causal']}: {r[impl]['error']}")
    if skipped:
        lines.append(f"\nSkipped past the time budget: {', '.join(skipped)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
