"""What MLA's latent cache saves and costs: cache size, decode speed, and val loss of finished runs.

    python -m tools.bench --suite=mla                       # cache table + decode table (a few minutes on CPU)
    python -m tools.bench --suite=mla --quick               # smoke test: short contexts, one repeat
    python -m tools.bench --suite=mla --runs /tmp/mla /tmp/mha /tmp/gqa --skip_decode   # val-loss table

1. Cache per token per layer, measured from the allocated cache tensors (numel / (B * max_len *
   n_layer)) next to each variant's formula, at n_head=12, d_h=64 (GPT-2 small's attention shape):
   MHA, GQA (n_kv_head=2), MQA, MLA absorbed (latent cache) and MLA expanded (per-head K/V).
2. Decode tokens/s at several context lengths (batch 1, n_layer=2, n_embd=384, n_head=6 by default):
   prefill `context` random tokens into fresh caches (untimed), then time `--steps` one-token
   steps; the median over `--repeats` runs. `--impls sdpa,naive` times both of `attend`'s
   PyTorch paths (sdpa is what attn_impl=auto picks off CUDA).
3. With --runs: one row per training run directory (summary.json + ckpt.pt's train config).

Prints markdown tables on stdout; progress goes to stderr.
"""
import os
import sys

import torch

from attention import ATTN_IMPLS, build_attention
from model import GPT, GPTConfig
from tools.benchmarks.harness import at_least, counts, decode_cost, emit, int_list, load_average, parser, runs_table

# name -> GPTConfig overrides
VARIANTS = {
    "MHA": {"attention": "mha"},
    "GQA (n_kv_head=2)": {"attention": "gqa", "n_kv_head": 2},
    "MQA": {"attention": "mqa"},
    "MLA absorbed": {"attention": "mla", "mla_decode": "absorbed"},
    "MLA expanded": {"attention": "mla", "mla_decode": "expanded"},
}


def parse_args(argv):
    p = parser(__doc__, quick="contexts 64,128, 8 steps, one repeat")
    p.add_argument("--contexts", type=counts, default="256,1024,4096")
    p.add_argument("--steps", type=at_least(1), default=32, help="timed one-token decode steps")
    p.add_argument("--repeats", type=at_least(1), default=3)
    p.add_argument("--impls", default="sdpa", help="comma list of attn_impl values to time")
    p.add_argument("--decode_variants", default="MHA,MLA absorbed,MLA expanded")
    p.add_argument("--n_layer", type=at_least(1), default=2)
    p.add_argument("--n_embd", type=at_least(1), default=384)
    p.add_argument("--n_head", type=at_least(1), default=6)
    p.add_argument("--threads", type=at_least(0), default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--runs", nargs="*", default=[], help="training run dirs for the val-loss table")
    p.add_argument("--skip_decode", action="store_true")
    args = p.parse_args(argv)
    for flag, known in (("decode_variants", VARIANTS), ("impls", ATTN_IMPLS)):
        unknown = [n.strip() for n in getattr(args, flag).split(",") if n.strip() not in known]
        if unknown:
            p.error(f"--{flag}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    return args


def cache_table(n_head=12, head_dim=64, batch=2, max_len=16):
    """Measured elements per token per layer from one layer's allocated cache, in fp32 and bf16."""
    rows = [("| variant | cache elems / token / layer (measured) | formula | bytes bf16 | bytes fp32 "
            "| MHA / this |"), "| --- | ---: | ---: | ---: | ---: | ---: |"]
    base = None
    for name, kw in VARIANTS.items():
        cfg = GPTConfig(block_size=max_len, vocab_size=64, n_layer=1, n_head=n_head,
                        n_embd=n_head * head_dim, pos_encoding="rope", **kw)
        attn = build_attention(cfg, 0)
        cache = attn.init_cache(batch, max_len, "cpu", torch.bfloat16)
        elems = cache.numel() / (batch * max_len)
        base = base or elems
        rows.append(f"| {name} | {elems:.0f} | {attn.cache_elems_per_token()} "
                    f"| {cache.nbytes() / (batch * max_len):.0f} | {4 * elems:.0f} | {base / elems:.1f}x |")
    detail = (f"n_head={n_head}, d_h={head_dim}; MLA defaults kv_lora_rank=4*d_h={4 * head_dim}, "
              f"rope_head_dim=d_h/2={head_dim // 2}")
    return detail, rows


def decode_table(args, contexts, steps, repeats):
    names = [n.strip() for n in args.decode_variants.split(",")]
    impls = args.impls.split(",")
    head = ("| variant | attn_impl | cache elems / token (all layers) | "
            + " | ".join(f"tok/s @ {c}" for c in contexts) + " |")
    rows = [head, "| --- | --- | ---: |" + " ---: |" * len(contexts)]
    for name in names:
        for impl in impls:
            torch.manual_seed(0)
            cfg = GPTConfig(block_size=max(contexts) + steps, vocab_size=65, n_layer=args.n_layer,
                            n_head=args.n_head, n_embd=args.n_embd, pos_encoding="rope", attn_impl=impl,
                            **VARIANTS[name])
            model = GPT(cfg).eval()
            decode_cost(model, 16, 4)   # warm-up
            cells = []
            for context in contexts:
                ms = sorted(decode_cost(model, context, steps)["ms_per_token"] for _ in range(repeats))
                tps = 1e3 / ms[len(ms) // 2]
                cells.append(f"{tps:,.0f}")
                print(f"{name} {impl} ctx {context}: {tps:,.1f} tok/s", file=sys.stderr)
            rows.append(f"| {name} | {impl} | {model.cache_elems_per_token()} | " + " | ".join(cells) + " |")
    detail = (f"batch 1, n_layer={args.n_layer}, n_embd={args.n_embd}, n_head={args.n_head}, fp32, "
              f"{torch.get_num_threads()} threads; median over {repeats} runs of the median of {steps} "
              "one-token steps after a prefill")
    return detail, rows


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    contexts = [64, 128] if args.quick else int_list(args.contexts)
    steps, repeats = (8, 1) if args.quick else (args.steps, args.repeats)
    parts = [f"# MLA benchmark ({os.cpu_count()} CPUs, load average {load_average():.1f} at start)\n"]
    detail, rows = cache_table()
    parts += [f"## Cache per token per layer ({detail})\n", "\n".join(rows) + "\n"]
    if not args.skip_decode:
        detail, rows = decode_table(args, contexts, steps, repeats)
        parts += [f"## Decode tokens/s ({detail})\n", "\n".join(rows) + "\n"]
    run_rows = []
    if args.runs:
        table, run_rows = runs_table(args.runs)
        parts += ["## Training runs\n", table + "\n"]
    emit("\n".join(parts), {"runs": run_rows}, args)


if __name__ == "__main__":
    main()
