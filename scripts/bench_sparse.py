"""Benchmark BigBird block-sparse attention (attention/sparse.py) against dense causal attention.

    python scripts/bench_sparse.py                      # attention op, T = 1024 .. 8192 (CPU: ~1-3 min)
    python scripts/bench_sparse.py --train --out_root /tmp/bench_sparse   # + Shakespeare runs
    python scripts/bench_sparse.py --train_only --train_args --max_iters=200   # runs only
    python scripts/bench_sparse.py --quick              # tiny sizes: smoke test of the script

1) The attention op alone, forward + backward, at B=1, H=4, d=64 (fp32; CUDA if present):
   - bigbird: the gathered training path `BlockSparseAttention.attend_sparse` with blocks of
     64 tokens, window 3, global 1, random 1, no positional encoding;
   - sdpa: `F.scaled_dot_product_attention(q, k, v, is_causal=True)`, same shapes.
   Time: median of --reps runs after one warm-up. Peak memory (CPU): every tensor an op
   returns is counted from its allocation until its storage is freed (a TorchDispatchMode
   with weakref finalizers on the storages), and the table gives the largest total alive
   at once during forward + backward, inputs excluded: the CPU counterpart of
   torch.cuda.max_memory_allocated, except scratch buffers a kernel allocates and frees
   inside itself (small for SDPA's flash CPU kernel, none in the gathered path). On CUDA
   the script reads torch.cuda.max_memory_allocated instead. "largest" is the biggest
   single tensor. "keys/query" is the mean number of keys a query attends to.
   Allocator note (Linux/glibc): blocks above 32 MiB are mmap'd and page-faulted afresh on
   every allocation, which the gathered path's (T, S*blk) scores hit at T=8192 (40 MiB);
   MALLOC_MMAP_THRESHOLD_=4000000000 MALLOC_TRIM_THRESHOLD_=4000000000 in the environment
   times the arithmetic instead. OMP_NUM_THREADS=1 steadies the numbers on a busy machine.
2) --train: `python train.py config/bigbird.py` and `config/mha.py` one after the other
   (same width, depth, context), then final val loss and ms/iter from their summary.json.
Both print markdown tables on stdout.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import weakref

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from attention.sparse import BlockSparseAttention  # noqa: E402
from model import GPTConfig  # noqa: E402


class PeakMemory(TorchDispatchMode):
    """Bytes of op outputs alive at once: +nbytes when an op returns a new storage,
    -nbytes when that storage is freed (views share a storage and count once)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = self.largest = 0
        self.tracked = set()

    def _freed(self, ptr, nbytes):
        self.live -= nbytes
        self.tracked.discard(ptr)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or ptr in self.tracked:
                continue
            self.tracked.add(ptr)
            self.live += nbytes
            self.peak, self.largest = max(self.peak, self.live), max(self.largest, nbytes)
            weakref.finalize(storage, self._freed, ptr, nbytes)
        return out


def sparse_module(T, args):
    cfg = GPTConfig(block_size=T, vocab_size=1, n_layer=1, n_head=args.heads, n_embd=args.heads * args.head_dim,
                    attention="bigbird", pos_encoding="none", sparse_block=args.block, sparse_window=args.window,
                    sparse_global=args.n_global, sparse_random=args.n_random)
    return BlockSparseAttention(cfg, 0)


def bench_op(name, fn, q, k, v, reps):
    """Median ms of forward + backward, and (peak, largest) bytes during one of them."""
    def step():
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
        q.grad = k.grad = v.grad = None

    step()  # warm-up
    times = []
    for _ in range(reps):
        if q.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if q.is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    if q.is_cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        peak, largest = torch.cuda.max_memory_allocated() - base, float("nan")
    else:
        with PeakMemory() as meter:
            step()
        peak, largest = meter.peak, meter.largest
    return statistics.median(times), peak, largest


def attention_table(args):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, H, D = 1, args.heads, args.head_dim
    rows, results = [], {}
    for T in args.seqlens:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, T, D, generator=gen).to(device).requires_grad_() for _ in range(3))
        attn = sparse_module(T, args).to(device)
        blocks = attn.block_count.float()
        # keys per query: selected blocks x block length, minus the masked half of the diagonal
        keys = (blocks.mean().item() - 0.5) * args.block + 0.5
        for name, fn in (("bigbird", lambda q, k, v: attn.attend_sparse(q, k, v)),
                         ("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))):
            ms, peak, largest = bench_op(name, fn, q, k, v, args.reps)
            kq = keys if name == "bigbird" else (T + 1) / 2
            results[(name, T)] = ms
            rows.append(f"| {name} | {T} | {ms:.1f} | {peak / 2**20:.1f} | {largest / 2**20:.1f} | {kq:.0f} |")
            print(f"  {name} T={T}: {ms:.1f} ms", file=sys.stderr)
    print(f"\nAttention op, forward + backward, B={B} H={H} d={D} fp32 on {device} "
          f"({torch.get_num_threads()} threads); bigbird: block {args.block}, window {args.window}, "
          f"global {args.n_global}, random {args.n_random}; median of {args.reps}\n")
    print("| attention | T | fwd+bwd ms | peak MiB | largest MiB | keys/query |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    lo, hi = args.seqlens[0], args.seqlens[-1]
    print(f"\nTime ratio T={hi} / T={lo} (x{hi // lo} tokens): " + ", ".join(
        f"{name} {results[(name, hi)] / results[(name, lo)]:.1f}x" for name in ("bigbird", "sdpa")))


def train_table(args):
    rows = []
    for config in ("config/bigbird.py", "config/mha.py"):
        out = os.path.join(args.out_root, os.path.basename(config)[:-3])
        cmd = [sys.executable, "train.py", config, f"--out_dir={out}", *args.train_args]
        print("running: " + " ".join(cmd[1:]), file=sys.stderr)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        cfg = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["config"]
        tokens_per_iter = cfg["batch_size"] * cfg["block_size"] * cfg["gradient_accumulation_steps"]
        ms_iter = 1e3 * tokens_per_iter / s["tokens_per_sec"]  # training steps only, evals excluded
        rows.append(f"| {s['attention']} | {s['pos_encoding']} | {s['params'] / 1e6:.2f}M | {s['iters']} | "
                    f"{s['final_val_loss']:.4f} | {s['best_val_loss']:.4f} | {ms_iter:.0f} | {s['tokens_per_sec']:.0f} |")
    print(f"\nTiny Shakespeare (char), {' '.join(args.train_args) or 'config defaults'}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}\n")
    print("| attention | pos | params | iters | final val loss | best val loss | ms/iter | tokens/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqlens", default="1024,2048,4096,8192")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--window", type=int, default=3)
    p.add_argument("--n_global", type=int, default=1)
    p.add_argument("--n_random", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    p.add_argument("--train", action="store_true", help="also train config/bigbird.py and config/mha.py")
    p.add_argument("--train_only", action="store_true", help="skip the attention-op table")
    p.add_argument("--out_root", default="/tmp/bench_sparse", help="--train: run folders go here")
    p.add_argument("--train_args", nargs="*", default=[], help="--train: extra train.py overrides")
    args = p.parse_args()
    args.seqlens = [int(t) for t in args.seqlens.split(",")]
    if args.quick:
        args.seqlens, args.block, args.reps = [128, 256], 16, 1
    if not args.train_only:
        attention_table(args)
    if args.train or args.train_only:
        train_table(args)


if __name__ == "__main__":
    main()
