"""Benchmark the Triton chunked GLA kernel against the PyTorch chunked form (attn_kernels/gla_chunked.py).

    python -m tools.bench --suite=kernel_gla --out bench_gla.md [--json bench_gla.json] [--quick]

Times, as medians (triton.testing.do_bench), the training forward (inputs require grad) and
forward + backward of attn_kernels.gla.chunk_gla and attn_kernels.gla_chunked.chunk_gla at B=4, H=16, bf16
q/k/v, fp32 g = logsigmoid(.)/16 (the layer's decay), chunk 64, D in {64, 128},
T in {1024, ..., 16384}; also reports the max difference of the two outputs relative to their
scale (a sanity check of the kernel on the GPU). A markdown table goes to --out and stdout,
the rows to --json. Configs past --budget_s are skipped (and listed); a config that fails is
reported and the run goes on.
Needs CUDA; --quick runs tiny fp32 shapes under the Triton interpreter on CPU (a smoke
test of this script).
"""
import os
import sys

import torch

from tools.benchmarks.harness import (
    Budget,
    add_kernel_shape_args,
    at_least,
    attempt,
    device_name,
    emit,
    int_list,
    median_ms,
    parser,
)


def parse_args(argv):
    p = parser(__doc__, out="bench_gla.md", quick="tiny fp32 shapes on CPU under the Triton interpreter")
    add_kernel_shape_args(p, heads=16, budget_s=90.0)
    p.add_argument("--chunk", type=at_least(1), default=64)
    return p.parse_args(argv)


def bench_one(fn, q, k, v, g, do, device):
    """({fwd_ms, fwd_bwd_ms}, o) of one implementation on leaves q, k, v, g."""
    def fwd():
        return fn(q, k, v, g)[0]

    def fwd_bwd():
        q.grad = k.grad = v.grad = g.grad = None
        fwd().backward(do)
    times = {"fwd_ms": median_ms(fwd, device=device), "fwd_bwd_ms": median_ms(fwd_bwd, device=device)}
    return times, fwd().detach()


def make_inputs(B, H, T, d, dtype, device):
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(B, H, T, d, generator=gen).to(device, dtype) for _ in range(4))
    g = torch.nn.functional.logsigmoid(torch.randn(B, H, T, d, generator=gen)) / 16
    leaves = [x.requires_grad_() for x in (q, k, v, g.to(device))]
    return (*leaves, do)


def bench_shape(impls, B, H, T, d, dtype, device, chunk):
    row = {"B": B, "H": H, "T": T, "d": d, "chunk": chunk, "dtype": str(dtype).replace("torch.", "")}
    outs = {}
    for name, fn in impls.items():
        def run(name=name, fn=fn):
            times, outs[name] = bench_one(fn, *make_inputs(B, H, T, d, dtype, device), device)
            return times
        row[name] = attempt(run)
        if device == "cuda":
            torch.cuda.empty_cache()
    if len(outs) == 2:
        ref = outs["torch"].float()
        row["max_rel_diff"] = ((outs["triton"].float() - ref).abs().max() / ref.abs().max()).item()
    return row


def main(argv=None):
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.quick:
        print("error: kernel_gla needs a CUDA device; use --quick for a CPU smoke test", file=sys.stderr)
        sys.exit(2)
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before attn_kernels.gla is imported
    from attn_kernels.gla import chunk_gla as triton_chunk_gla
    from attn_kernels.gla_chunked import chunk_gla as torch_chunk_gla

    if args.quick:
        B, H, seqlens, dims, dtype = 1, 2, [40, 80], [16], torch.float32
    else:
        B, H, dtype = args.batch, args.heads, torch.bfloat16
        seqlens, dims = int_list(args.seqlens), int_list(args.head_dims)
    impls = {"triton": lambda *a: triton_chunk_gla(*a, chunk_size=args.chunk),
             "torch": lambda *a: torch_chunk_gla(*a, chunk_size=args.chunk)}
    dev_name = device_name() if device == "cuda" else "cpu (Triton interpreter)"
    budget, rows = Budget(args.budget_s), []
    for d in dims:
        for T in seqlens:
            if budget.allows(f"T={T} d={d}"):
                rows.append(bench_shape(impls, B, H, T, d, dtype, device, args.chunk))
                print(format_row(rows[-1]), flush=True)
    table = format_table(rows, dev_name, budget.skipped, budget.elapsed())
    emit(table, {"device": dev_name, "torch": torch.__version__, "rows": rows, "skipped": budget.skipped}, args)


def _ms(r, key):
    return "error" if "error" in r else f"{r[key]:.3f}"


def _speedup(row, key):
    t, p = row["triton"], row["torch"]
    return "-" if "error" in t or "error" in p else f"{p[key] / t[key]:.1f}x"


def format_row(row):
    t, p = row["triton"], row["torch"]
    diff = f"{row['max_rel_diff']:.1e}" if "max_rel_diff" in row else "-"
    return (f"| {row['T']} | {row['d']} | {_ms(t, 'fwd_ms')} | {_ms(p, 'fwd_ms')} | {_speedup(row, 'fwd_ms')} "
            f"| {_ms(t, 'fwd_bwd_ms')} | {_ms(p, 'fwd_bwd_ms')} | {_speedup(row, 'fwd_bwd_ms')} | {diff} |")


def format_table(rows, dev_name, skipped, wall_s):
    b = rows[0] if rows else {"B": "-", "H": "-", "dtype": "-", "chunk": "-"}
    lines = [(f"GLA, Triton kernel vs PyTorch chunked form on {dev_name}: B={b['B']}, H={b['H']}, {b['dtype']} "
             f"q/k/v, fp32 g, chunk {b['chunk']}; median ms ({wall_s:.0f} s in all)"), "",
             "| T | d | fwd triton | fwd torch | speedup | fwd+bwd triton | fwd+bwd torch | speedup | max rel diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [format_row(r) for r in rows]
    if skipped:
        lines += ["", f"skipped (past the time budget): {', '.join(skipped)}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
