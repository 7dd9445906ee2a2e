"""Benchmark BigBird block-sparse attention (attention/bigbird.py) against dense causal attention.

    python -m tools.bench --suite=bigbird                      # attention op, T = 1024 .. 8192 (CPU: ~1-3 min)
    python -m tools.bench --suite=bigbird --train --out_root /tmp/bench_bigbird   # + Shakespeare runs
    python -m tools.bench --suite=bigbird --train_only --train_args --max_iters=200   # runs only
    python -m tools.bench --suite=bigbird --quick              # tiny sizes: smoke test of the script

1) The attention op alone, forward + backward, at B=1, H=4, d=64 (fp32; CUDA if present):
   - bigbird: the gathered training path `BlockSparseAttention.attend_sparse` with blocks of
     64 tokens, window 3, global 1, random 1, no positional encoding;
   - sdpa: `F.scaled_dot_product_attention(q, k, v, is_causal=True)`, same shapes.
   Time: median of --reps runs after one warm-up. Peak memory (CPU): every tensor an op
   returns is counted from its allocation until its storage is freed (harness.PeakMemory),
   and the table gives the largest total alive at once during forward + backward, inputs
   excluded (scratch a kernel frees inside itself is not seen: small for SDPA's flash CPU
   kernel, none in the gathered path). On CUDA: torch.cuda.max_memory_allocated. "largest" is the biggest
   single tensor. "keys/query" is the mean number of keys a query attends to.
   Allocator note (Linux/glibc): blocks above 32 MiB are mmap'd and page-faulted afresh on
   every allocation, which the gathered path's (T, S*blk) scores hit at T=8192 (40 MiB);
   MALLOC_MMAP_THRESHOLD_=4000000000 MALLOC_TRIM_THRESHOLD_=4000000000 in the environment
   times the arithmetic instead. OMP_NUM_THREADS=1 steadies the numbers on a busy machine.
2) --train: `python train.py config/bigbird.py` and `config/mha.py` one after the other
   (same width, depth, context), then final val loss and ms/iter from their summary.json.
Both print markdown tables on stdout.
"""
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from attention.bigbird import BlockSparseAttention
from model import GPTConfig
from tools.benchmarks.harness import at_least, counts, emit, int_list, median_ms, parser, peak_bytes, read_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root


def sparse_module(T, args):
    cfg = GPTConfig(block_size=T, vocab_size=1, n_layer=1, n_head=args.heads, n_embd=args.heads * args.head_dim,
                    attention="bigbird", pos_encoding="none", sparse_block=args.block, sparse_window=args.window,
                    sparse_global=args.n_global, sparse_random=args.n_random)
    return BlockSparseAttention(cfg, 0)


def bench_op(fn, q, k, v, reps):
    """Median ms of forward + backward, and (peak, largest) bytes during one of them."""
    def step():
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
        q.grad = k.grad = v.grad = None
    ms = median_ms(lambda: (step(), torch.cuda.synchronize() if q.is_cuda else None), repeats=reps)
    peak, largest = peak_bytes(step, q.device)
    return ms, peak, largest


def attention_table(args):
    """(markdown, rows): forward + backward time and memory of both ops at each T."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, H, D = 1, args.heads, args.head_dim
    lines, rows, results = [], [], {}
    for T in args.seqlens:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, T, D, generator=gen).to(device).requires_grad_() for _ in range(3))
        attn = sparse_module(T, args).to(device)
        # keys per query: selected blocks x block length, minus the masked half of the diagonal
        keys = (attn.block_count.float().mean().item() - 0.5) * args.block + 0.5
        for name, fn in (("bigbird", lambda q, k, v, attn=attn: attn.attend_sparse(q, k, v)),
                         ("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))):
            ms, peak, largest = bench_op(fn, q, k, v, args.reps)
            kq = keys if name == "bigbird" else (T + 1) / 2
            results[(name, T)] = ms
            rows.append({"attention": name, "T": T, "ms": ms, "peak_bytes": peak, "keys_per_query": kq})
            lines.append(f"| {name} | {T} | {ms:.1f} | {peak / 2**20:.1f} | {largest / 2**20:.1f} | {kq:.0f} |")
            print(f"  {name} T={T}: {ms:.1f} ms", file=sys.stderr)
    lo, hi = args.seqlens[0], args.seqlens[-1]
    text = (f"Attention op, forward + backward, B={B} H={H} d={D} fp32 on {device} "
            f"({torch.get_num_threads()} threads); bigbird: block {args.block}, window {args.window}, "
            f"global {args.n_global}, random {args.n_random}; median of {args.reps}\n\n"
            "| attention | T | fwd+bwd ms | peak MiB | largest MiB | keys/query |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: |\n" + "\n".join(lines) +
            f"\n\nTime ratio T={hi} / T={lo} (x{hi // lo} tokens): " + ", ".join(
                f"{name} {results[(name, hi)] / results[(name, lo)]:.1f}x" for name in ("bigbird", "sdpa")) + "\n")
    return text, rows


def train_table(args):
    """(markdown, rows): train config/bigbird.py and config/mha.py, then their run folders."""
    rows = []
    for config in ("config/bigbird.py", "config/mha.py"):
        out = os.path.join(args.out_root, os.path.basename(config)[:-3])
        cmd = [sys.executable, "train.py", config, f"--out_dir={out}", *args.train_args]
        print("running: " + " ".join(cmd[1:]), file=sys.stderr)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        rows.append(read_run(out))
    lines = [(f"Tiny Shakespeare (char), {' '.join(args.train_args) or 'config defaults'}, "
             f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}\n"),
             "| attention | pos | params | iters | final val loss | best val loss | ms/iter | tokens/s |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['attention']} | {r['pos_encoding']} | {r['params'] / 1e6:.2f}M | {r['iters']} | "
              f"{r['final_val_loss']:.4f} | {r['best_val_loss']:.4f} | {r['ms_per_iter']:.0f} | "
              f"{r['tokens_per_sec']:.0f} |" for r in rows]
    return "\n".join(lines) + "\n", rows


def main(argv=None):
    p = parser(__doc__, quick="tiny sizes, to check the script runs")
    p.add_argument("--seqlens", type=counts, default="1024,2048,4096,8192")
    p.add_argument("--heads", type=at_least(1), default=4)
    p.add_argument("--head_dim", type=at_least(1), default=64)
    p.add_argument("--block", type=at_least(1), default=64)
    p.add_argument("--window", type=at_least(1), default=3)
    p.add_argument("--n_global", type=at_least(0), default=1)
    p.add_argument("--n_random", type=at_least(0), default=1)
    p.add_argument("--reps", type=at_least(1), default=5)
    p.add_argument("--train", action="store_true", help="also train config/bigbird.py and config/mha.py")
    p.add_argument("--train_only", action="store_true", help="skip the attention-op table")
    p.add_argument("--out_root", default="/tmp/bench_bigbird", help="--train: run folders go here")
    p.add_argument("--train_args", nargs="*", default=[], help="--train: extra train.py overrides")
    args = p.parse_args(argv)
    args.seqlens = int_list(args.seqlens)
    if args.quick:
        args.seqlens, args.block, args.reps = [128, 256], 16, 1
    parts, results = [], {}
    if not args.train_only:
        text, results["op"] = attention_table(args)
        parts.append(text)
    if args.train or args.train_only:
        text, results["runs"] = train_table(args)
        parts.append(text)
    emit("\n".join(parts), results, args)


if __name__ == "__main__":
    main()
