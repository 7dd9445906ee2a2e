"""Benchmark the gated-linear-attention model against MHA: decoding, training throughput, val loss.
(The GLA Triton kernel alone: --suite=kernel_gla.)

    python -m tools.bench --suite=gla [--json FILE] [--quick] [--runs DIR ...]

Prints markdown tables (medians) on stdout:
1. Decode: per-token time after a prefill of L tokens, L in --contexts (256, 4096, 16384),
   for GLA (a constant (n_kv_head, d_h, d_h) state per layer) and MHA with its KV cache
   (grows with L), plus what each cache holds at that point. Model: --n_layer=2
   --n_embd=256 --n_head=4, block_size large enough for the longest context.
2. Training: forward + backward tokens/s of the same models at T in --train_lens
   (1024, 4096, 8192), batch 1: GLA (chunked form, gla_chunk=64), GLA without its decay
   (gla_nodecay: gla_gate=none, elu features) and MHA (PyTorch SDPA).
3. Step: ms per training step (forward + backward) at the Shakespeare CPU config
   (batch 12, block 64, 4 layers, n_embd 128) for config/mha.py, config/gla.py (and
   with pos_encoding none) and config/gla_nodecay.py, in interleaved rounds so that a
   shared machine's load drifts over all of them alike.
4. Paths: chunk_gla's forward + backward alone at the recall study's width-128 shape (batch 64,
   4 heads of 32, T 64, chunks of 64) for decays drawn up to --rates nats a step: the path each
   rate takes and the time of every path that is exact at it (one matmul, sub-chunks factored,
   pairwise diagonal blocks; attn_kernels/gla_chunked.py), interleaved rounds. Trained gates decay
   far more than initial ones, so a benchmark at initialisation sees only the first path.
5. With --runs: one row per train.py out_dir from its summary.json (final val loss, ms/iter).
--quick: tiny sizes, a smoke test of the script itself.
Timing is wall clock on whatever device torch uses (CPU here); pass OMP_NUM_THREADS to
pin the thread count on a shared machine.
"""
import sys
from unittest import mock

import torch

from attn_kernels import gla_chunked
from model import GPT, GPTConfig
from tools.benchmarks.harness import (
    at_least,
    counts,
    decode_cost,
    emit,
    fmt_bytes,
    int_list,
    median_ms,
    parser,
    positive_floats,
    runs_table,
    train_step,
)

SECTIONS = ("decode", "train", "step", "paths")
VARIANTS = {  # name -> GPTConfig keys
    "gla": {"attention": "gla", "pos_encoding": "none", "gla_gate": "data", "gla_chunk": 64},
    "gla_nodecay": {"attention": "gla", "pos_encoding": "rope", "gla_gate": "none", "gla_feature_map": "elu",
                    "gla_chunk": 64},
    "mha": {"attention": "mha", "pos_encoding": "rope"},
}


def parse_args(argv):
    p = parser(__doc__)
    p.add_argument("--contexts", type=counts, default="256,4096,16384")
    p.add_argument("--train_lens", type=counts, default="1024,4096,8192")
    p.add_argument("--steps", type=at_least(1), default=16, help="decode steps timed per context")
    p.add_argument("--reps", type=at_least(1), default=3, help="training steps timed per length")
    p.add_argument("--n_layer", type=at_least(1), default=2)
    p.add_argument("--n_embd", type=at_least(1), default=256)
    p.add_argument("--n_head", type=at_least(1), default=4)
    p.add_argument("--rounds", type=at_least(1), default=5, help="interleaved rounds of the step table")
    p.add_argument("--only", default=",".join(SECTIONS), help="sections to run")
    p.add_argument("--rates", type=positive_floats, default="0.05,2,30",
                   help="largest decay per step (nats) of the paths section")
    p.add_argument("--runs", nargs="*", default=[], help="train.py out_dirs to tabulate")
    args = p.parse_args(argv)
    unknown = [s for s in args.only.split(",") if s not in SECTIONS]
    if unknown:
        p.error(f"--only: unknown section {', '.join(map(repr, unknown))}; choose from {', '.join(SECTIONS)}")
    if args.quick:
        args.contexts, args.train_lens, args.steps, args.reps = "16,64", "64,128", 4, 2
        args.n_embd, args.n_head, args.rounds = 32, 2, 2
    return args


def build(name, args, block_size):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=block_size, vocab_size=65, n_layer=args.n_layer, n_head=args.n_head,
                    n_embd=args.n_embd, dropout=0.0, **VARIANTS[name])
    return GPT(cfg)


def bench_decode(name, args, contexts):
    """Per-token ms after prefilling each context (median over --steps single steps)."""
    model = build(name, args, max(contexts) + args.steps).eval()
    return [{"variant": name, "context": L, **decode_cost(model, L, args.steps)} for L in contexts]


def bench_train(name, args, lens):
    """Forward + backward tokens/s at batch 1 (median over --reps steps after one warm-up)."""
    rows = []
    for T in lens:
        model = build(name, args, T).train()
        idx = torch.randint(0, 65, (1, T + 1), generator=torch.Generator().manual_seed(T))
        ms = median_ms(train_step(model, idx), repeats=args.reps, warmup=1)  # the warm-up primes the allocator
        rows.append({"variant": name, "T": T, "tokens_per_sec": T / (ms / 1e3), "ms_per_step": ms})
    return rows


STEP_VARIANTS = {  # the Shakespeare configs (config/*.py) at base_shakespeare_char.py's size
    "mha (config/mha.py)": {"attention": "mha", "pos_encoding": "rope"},
    "gla (config/gla.py)": {"attention": "gla", "pos_encoding": "rope", "gla_chunk": 32},
    "gla, pos none": {"attention": "gla", "pos_encoding": "none", "gla_chunk": 32},
    "gla_nodecay (config/gla_nodecay.py)": {"attention": "gla", "pos_encoding": "rope", "gla_gate": "none",
                                            "gla_feature_map": "elu", "gla_chunk": 16},
}


def bench_step(args):
    """ms per forward + backward + AdamW step at batch 12, T 64, 4 x 128 (quick: 2 x 32)."""
    n_layer, n_embd, B, T = (2, 32, 4, 32) if args.quick else (4, 128, 12, 64)
    models, times = {}, {name: [] for name in STEP_VARIANTS}
    for name, kw in STEP_VARIANTS.items():
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=T, vocab_size=65, n_layer=n_layer, n_head=4, n_embd=n_embd, **kw))
        models[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    idx = torch.randint(0, 65, (B, T + 1), generator=torch.Generator().manual_seed(0))
    for rnd in range(args.rounds + 1):
        for name, (model, opt) in models.items():
            ms = median_ms(train_step(model, idx, opt), repeats=3, warmup=0)
            if rnd:  # round 0 warms up
                times[name].append(ms)
    return [{"variant": name, "ms_per_step": sorted(t)[len(t) // 2], "params": models[name][0].num_params()}
            for name, t in times.items()]


PATHS = {  # name -> (MAX_FACTORED_SPAN, MAX_SUB_CHUNK_SPAN): a bound of -1 rules its path out
    "one matmul": (float("inf"), float("inf")), "sub-chunks factored": (-1.0, float("inf")),
    "pairwise diagonal": (-1.0, -1.0)}


def bench_paths(args):
    """ms of chunk_gla forward + backward per decay rate and path, each path only where it is exact."""
    B, H, T, D = (2, 2, 16, 8) if args.quick else (64, 4, 64, 32)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=gen, requires_grad=True) for _ in range(3))
    rows = []
    for rate in [float(r) for r in args.rates.split(",")]:
        g = (-rate * torch.rand(B, H, T, D, generator=gen)).requires_grad_()
        b = g.detach().cumsum(-2)[:, :, None]               # (B, H, 1, T, D): T is one chunk
        form = gla_chunked.intra_chunk_form(b)               # the kernel's own choice
        chosen = "one matmul" if form == T else ("sub-chunks factored" if form else "pairwise diagonal")
        exact = list(PATHS)[list(PATHS).index(chosen):]     # a later path is exact wherever an earlier one is
        times = {name: [] for name in exact}
        for _ in range(args.rounds):
            for name in exact:
                with mock.patch.multiple(gla_chunked, MAX_FACTORED_SPAN=PATHS[name][0],
                                         MAX_SUB_CHUNK_SPAN=PATHS[name][1]):
                    step = lambda: chunk_step(q, k, v, g)   # noqa: E731
                    times[name].append(median_ms(step, repeats=3, warmup=1))
        rows.append({"rate": rate, "chunk_span": -b.min().item(), "taken": chosen,
                     **{name: sorted(t)[len(t) // 2] for name, t in times.items()}})
    return rows


def paths_markdown(rows):
    """The paths section's table: per decay rate, the path taken and each exact path's ms."""
    head = ("| decay up to (nats/step) | chunk's largest span | path taken | " + " | ".join(PATHS) + " |\n"
            "| ---: | ---: | --- |" + " ---: |" * len(PATHS))
    return "\n".join([head, *(f"| {r['rate']:g} | {r['chunk_span']:.1f} | {r['taken']} | "
                               + " | ".join(f"{r[n]:.2f}" if n in r else "-" for n in PATHS) + " |" for r in rows)])


def chunk_step(q, k, v, g):
    o, _ = gla_chunked.chunk_gla(q, k, v, g, chunk_size=q.size(2))
    o.sum().backward()


def variant_table(rows, key, values, headers, cells):
    """Rows keyed by (variant, key) -> one markdown line per value of key, the variants across:
    headers(name) and cells(row) give each variant's column titles and cell texts."""
    by = {(r["variant"], r[key]): r for r in rows}
    names = sorted({r["variant"] for r in rows}, key=list(VARIANTS).index)
    titles = [h for n in names for h in headers(n)]
    out = [f"| {key} | " + " | ".join(titles) + " |", "| ---: | " + " | ".join("---:" for _ in titles) + " |"]
    for value in values:
        out.append(f"| {value} | " + " | ".join(c for n in names for c in cells(by[n, value])) + " |")
    return "\n".join(out)


def decode_table(rows, contexts):
    return variant_table(rows, "context", contexts, lambda n: (f"{n} ms/token", f"{n} cache"),
                         lambda r: (f"{r['ms_per_token']:.2f}", fmt_bytes(r["cache_bytes"])))


def train_table(rows, lens):
    return variant_table(rows, "T", lens, lambda n: (f"{n} tok/s",), lambda r: (f"{r['tokens_per_sec']:,.0f}",))


def main(argv=None):
    args = parse_args(argv)
    contexts, lens = int_list(args.contexts), int_list(args.train_lens)
    print(f"device cpu, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"n_layer={args.n_layer} n_embd={args.n_embd} n_head={args.n_head}", file=sys.stderr)
    results, only, parts = {}, args.only.split(","), []
    if "decode" in only:
        decode = [r for n in ("gla", "mha") for r in bench_decode(n, args, contexts)]
        results["decode"] = decode
        parts.append(f"### Decode: ms per token after a prefill of `context` tokens (median of {args.steps} steps)\n\n"
                     + decode_table(decode, contexts) + "\n")
    if "train" in only:
        train = [r for n in VARIANTS for r in bench_train(n, args, lens)]
        results["train"] = train
        parts.append(f"### Training: forward + backward tokens/s, batch 1 (median of {args.reps} steps)\n\n"
                     + train_table(train, lens) + "\n")
    if "step" in only:
        step = results["step"] = bench_step(args)
        shape = "batch 4, T 32, 2 layers, n_embd 32" if args.quick else "batch 12, T 64, 4 layers, n_embd 128"
        parts.append(f"### Training step at the Shakespeare config ({shape}; median of {args.rounds} interleaved "
                     "rounds x 3 steps)\n\n| config | params | ms/step |\n| --- | ---: | ---: |\n"
                     + "\n".join(f"| {r['variant']} | {r['params']:,} | {r['ms_per_step']:.1f} |" for r in step) + "\n")
    if "paths" in only:
        paths = results["paths"] = bench_paths(args)
        shape = "batch 2, 2 heads of 8, T 16" if args.quick else "batch 64, 4 heads of 32, T 64"
        parts.append(f"### chunk_gla's paths, forward + backward ms ({shape}, one chunk; median of {args.rounds} "
                     f"rounds)\n\n{paths_markdown(paths)}\n")
    if args.runs:
        table, results["runs"] = runs_table(args.runs)
        parts.append("### Shakespeare char runs (train.py summary.json)\n\n" + table + "\n")
    emit("\n".join(parts), results, args)


if __name__ == "__main__":
    main()
