"""Benchmark the Triton chunked GLA kernel against the PyTorch chunked form (kernels/gla_reference.py).

    python scripts/bench_gla.py --out bench_gla.md [--json bench_gla.json] [--interpret]

Times, as medians (triton.testing.do_bench), the training forward (inputs require grad) and
forward + backward of kernels.gla.chunk_gla and kernels.gla_reference.chunk_gla at B=4, H=16, bf16
q/k/v, fp32 g = logsigmoid(.)/16 (the layer's decay), chunk 64, D in {64, 128},
T in {1024, ..., 16384}; also reports the max difference of the two outputs relative to their
scale (a sanity check of the kernel on the GPU). A markdown table goes to --out and stdout,
the rows to --json. Configs past --budget_s are skipped (and listed); a config that fails is
reported and the run goes on.
Needs CUDA; --interpret runs tiny fp32 shapes under the Triton interpreter on CPU (a smoke
test of this script).
"""
import argparse
import json
import os
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench_flash import timer  # noqa: E402 (same timing as the attention benchmark)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_gla.md", help="markdown table output")
    p.add_argument("--json", default=None, help="also write the results as JSON")
    p.add_argument("--interpret", action="store_true", help="tiny shapes on CPU under the Triton interpreter")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seqlens", type=str, default="1024,2048,4096,8192,16384")
    p.add_argument("--head_dims", type=str, default="64,128")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--budget_s", type=float, default=90.0, help="skip remaining configs after this")
    return p.parse_args()


def bench_one(fn, q, k, v, g, do, device):
    """(fwd_ms, fwd_bwd_ms, o) of one implementation on leaves q, k, v, g."""
    def fwd():
        return fn(q, k, v, g)[0]

    def fwd_bwd():
        q.grad = k.grad = v.grad = g.grad = None
        fwd().backward(do)
    fwd_ms = timer(fwd, device)
    fwd_bwd_ms = timer(fwd_bwd, device)
    return fwd_ms, fwd_bwd_ms, fwd().detach()


def make_inputs(B, H, T, d, dtype, device):
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(B, H, T, d, generator=gen).to(device, dtype) for _ in range(4))
    g = torch.nn.functional.logsigmoid(torch.randn(B, H, T, d, generator=gen)) / 16
    leaves = [x.requires_grad_() for x in (q, k, v, g.to(device))]
    return (*leaves, do)


def main():
    args = parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.interpret:
        print("bench_gla.py: no CUDA device; use --interpret for a CPU smoke test", file=sys.stderr)
        sys.exit(2)
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before kernels.gla is imported
    from kernels.gla import chunk_gla as triton_chunk_gla
    from kernels.gla_reference import chunk_gla as torch_chunk_gla

    if args.interpret:
        B, H, seqlens, dims, dtype = 1, 2, [40, 80], [16], torch.float32
    else:
        B, H, dtype = args.batch, args.heads, torch.bfloat16
        seqlens = [int(x) for x in args.seqlens.split(",")]
        dims = [int(x) for x in args.head_dims.split(",")]
    impls = {"triton": lambda *a: triton_chunk_gla(*a, chunk_size=args.chunk),
             "torch": lambda *a: torch_chunk_gla(*a, chunk_size=args.chunk)}
    dev_name = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    t_start = time.time()
    rows, skipped = [], []
    for d in dims:
        for T in seqlens:
            if time.time() - t_start > args.budget_s:
                skipped.append(f"T={T} d={d}")
                continue
            row = dict(B=B, H=H, T=T, d=d, chunk=args.chunk, dtype=str(dtype).replace("torch.", ""))
            outs = {}
            for name, fn in impls.items():
                try:
                    fwd_ms, fwd_bwd_ms, outs[name] = bench_one(fn, *make_inputs(B, H, T, d, dtype, device), device)
                    row[name] = dict(fwd_ms=fwd_ms, fwd_bwd_ms=fwd_bwd_ms)
                except Exception as e:  # report and go on: one bad config must not end the run
                    traceback.print_exc()
                    row[name] = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
                if device == "cuda":
                    torch.cuda.empty_cache()
            if len(outs) == 2:
                ref = outs["torch"].float()
                row["max_rel_diff"] = ((outs["triton"].float() - ref).abs().max() / ref.abs().max()).item()
            rows.append(row)
            print(format_row(row), flush=True)

    table = format_table(rows, dev_name, skipped, time.time() - t_start)
    print(table)
    with open(args.out, "w") as f:
        f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev_name, torch=torch.__version__, rows=rows, skipped=skipped), f, indent=1)


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
    b = rows[0] if rows else dict(B="-", H="-", dtype="-", chunk="-")
    lines = [f"GLA, Triton kernel vs PyTorch chunked form on {dev_name}: B={b['B']}, H={b['H']}, {b['dtype']} "
             f"q/k/v, fp32 g, chunk {b['chunk']}; median ms ({wall_s:.0f} s in all)", "",
             "| T | d | fwd triton | fwd torch | speedup | fwd+bwd triton | fwd+bwd torch | speedup | max rel diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [format_row(r) for r in rows]
    if skipped:
        lines += ["", f"skipped (past the time budget): {', '.join(skipped)}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
