"""Benchmark gated linear attention against MHA: decoding, training throughput, val loss.

    python scripts/bench_linear.py [--json FILE] [--quick] [--runs DIR ...]

Prints markdown tables (medians) on stdout:
1. Decode: per-token time after a prefill of L tokens, L in --contexts (256, 4096, 16384),
   for GLA (a constant (n_kv_head, d_h, d_h) state per layer) and MHA with its KV cache
   (grows with L), plus what each cache holds at that point. Model: --n_layer=2
   --n_embd=256 --n_head=4, block_size large enough for the longest context.
2. Training: forward + backward tokens/s of the same models at T in --train_lens
   (1024, 4096, 8192), batch 1: GLA (chunked form, gla_chunk=64), plain linear
   attention (gla_gate=none) and MHA (PyTorch SDPA).
3. Step: ms per training step (forward + backward) at the Shakespeare CPU config
   (batch 12, block 64, 4 layers, n_embd 128) for config/mha.py, config/gla.py (and
   with pos_encoding none) and config/linear.py, in interleaved rounds so that a
   shared machine's load drifts over all of them alike.
4. With --runs: one row per train.py out_dir from its summary.json (final val loss, ms/iter).
--quick: tiny sizes, a smoke test of the script itself.
Timing is wall clock on whatever device torch uses (CPU here); pass OMP_NUM_THREADS to
pin the thread count on a shared machine.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from model import GPT, GPTConfig  # noqa: E402

VARIANTS = {  # name -> GPTConfig keys
    "gla": dict(attention="gla", pos_encoding="none", gla_gate="data", gla_chunk=64),
    "linear": dict(attention="gla", pos_encoding="rope", gla_gate="none", gla_feature_map="elu", gla_chunk=64),
    "mha": dict(attention="mha", pos_encoding="rope"),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None, help="also write the results as JSON")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--contexts", default="256,4096,16384")
    p.add_argument("--train_lens", default="1024,4096,8192")
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per context")
    p.add_argument("--reps", type=int, default=3, help="training steps timed per length")
    p.add_argument("--n_layer", type=int, default=2)
    p.add_argument("--n_embd", type=int, default=256)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the step table")
    p.add_argument("--only", default="decode,train,step", help="sections to run")
    p.add_argument("--runs", nargs="*", default=[], help="train.py out_dirs to tabulate")
    args = p.parse_args()
    if args.quick:
        args.contexts, args.train_lens, args.steps, args.reps = "16,64", "64,128", 4, 2
        args.n_embd, args.n_head, args.rounds = 32, 2, 2
    return args


def build(name, args, block_size):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=block_size, vocab_size=65, n_layer=args.n_layer, n_head=args.n_head,
                    n_embd=args.n_embd, dropout=0.0, **VARIANTS[name])
    return GPT(cfg)


@torch.no_grad()
def bench_decode(name, args, contexts):
    """Per-token ms after prefilling each context (median over --steps single steps)."""
    model = build(name, args, max(contexts) + args.steps).eval()
    rows = []
    for L in contexts:
        prompt = torch.randint(0, 65, (1, L), generator=torch.Generator().manual_seed(L))
        caches = model.init_caches(1, L + args.steps)
        t0 = time.perf_counter()
        logits, _ = model(prompt, caches=caches, last_only=True)
        prefill_s = time.perf_counter() - t0
        times = []
        for _ in range(args.steps):
            tok = logits[:, -1].argmax(-1, keepdim=True)
            t0 = time.perf_counter()
            logits, _ = model(tok, caches=caches, last_only=True)
            times.append(time.perf_counter() - t0)
        rows.append(dict(variant=name, context=L, ms_per_token=1e3 * statistics.median(times),
                         prefill_s=prefill_s, cache_bytes=sum(c.nbytes() for c in caches)))
    return rows


def bench_train(name, args, lens):
    """Forward + backward tokens/s at batch 1 (median over --reps steps after one warm-up)."""
    rows = []
    for T in lens:
        model = build(name, args, T).train()
        idx = torch.randint(0, 65, (1, T + 1), generator=torch.Generator().manual_seed(T))
        times = []
        for rep in range(args.reps + 1):
            t0 = time.perf_counter()
            _, loss = model(idx[:, :-1], idx[:, 1:])
            loss.backward()
            if rep:  # the first step warms up the allocator
                times.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        rows.append(dict(variant=name, T=T, tokens_per_sec=T / statistics.median(times),
                         ms_per_step=1e3 * statistics.median(times)))
    return rows


STEP_VARIANTS = {  # the Shakespeare configs (config/*.py) at base_shakespeare_char.py's size
    "mha (config/mha.py)": dict(attention="mha", pos_encoding="rope"),
    "gla (config/gla.py)": dict(attention="gla", pos_encoding="rope", gla_chunk=32),
    "gla, pos none": dict(attention="gla", pos_encoding="none", gla_chunk=32),
    "linear (config/linear.py)": dict(attention="gla", pos_encoding="rope", gla_gate="none",
                                      gla_feature_map="elu", gla_chunk=16),
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
            for _ in range(3):
                t0 = time.perf_counter()
                _, loss = model(idx[:, :-1], idx[:, 1:])
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if rnd:  # round 0 warms up
                    times[name].append(time.perf_counter() - t0)
    return [dict(variant=name, ms_per_step=1e3 * statistics.median(t), params=models[name][0].num_params())
            for name, t in times.items()]


def fmt_bytes(n):
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def decode_table(rows, contexts):
    by = {(r["variant"], r["context"]): r for r in rows}
    names = sorted({r["variant"] for r in rows}, key=list(VARIANTS).index)
    out = ["| context | " + " | ".join(f"{n} ms/token | {n} cache" for n in names) + " |",
           "| ---: | " + " | ".join("---: | ---:" for _ in names) + " |"]
    for L in contexts:
        cells = [f"{by[n, L]['ms_per_token']:.2f} | {fmt_bytes(by[n, L]['cache_bytes'])}" for n in names]
        out.append(f"| {L} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def train_table(rows, lens):
    by = {(r["variant"], r["T"]): r for r in rows}
    names = sorted({r["variant"] for r in rows}, key=list(VARIANTS).index)
    out = ["| T | " + " | ".join(f"{n} tok/s" for n in names) + " |",
           "| ---: | " + " | ".join("---:" for _ in names) + " |"]
    for T in lens:
        out.append(f"| {T} | " + " | ".join(f"{by[n, T]['tokens_per_sec']:,.0f}" for n in names) + " |")
    return "\n".join(out)


def runs_table(dirs):
    out = ["| run | attention | pos | params | final val loss | best val loss | ms/iter | tok/s | wall s |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows = []
    for d in dirs:
        s = json.load(open(os.path.join(d, "summary.json")))
        cfg = torch.load(os.path.join(d, "ckpt.pt"), map_location="cpu", weights_only=True)["config"]
        tokens_per_iter = cfg["batch_size"] * cfg["block_size"] * cfg["gradient_accumulation_steps"]
        ms_iter = 1e3 * tokens_per_iter / s["tokens_per_sec"]
        rows.append(dict(run=d, **s, ms_per_iter=ms_iter))
        out.append(f"| {os.path.basename(os.path.normpath(d))} | {s['attention']} | {s['pos_encoding']} | "
                   f"{s['params']:,} | {s['final_val_loss']:.4f} | {s['best_val_loss']:.4f} | {ms_iter:.1f} | "
                   f"{s['tokens_per_sec']:,.0f} | {s['wall_s']:.0f} |")
    return "\n".join(out), rows


def main():
    args = parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    lens = [int(x) for x in args.train_lens.split(",")]
    print(f"device cpu, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"n_layer={args.n_layer} n_embd={args.n_embd} n_head={args.n_head}", file=sys.stderr)
    results, only = {}, args.only.split(",")
    if "decode" in only:
        decode = [r for n in ("gla", "mha") for r in bench_decode(n, args, contexts)]
        results["decode"] = decode
        print(f"### Decode: ms per token after a prefill of `context` tokens (median of {args.steps} steps)\n")
        print(decode_table(decode, contexts) + "\n")
    if "train" in only:
        train = [r for n in VARIANTS for r in bench_train(n, args, lens)]
        results["train"] = train
        print(f"### Training: forward + backward tokens/s, batch 1 (median of {args.reps} steps)\n")
        print(train_table(train, lens) + "\n")
    if "step" in only:
        step = bench_step(args)
        results["step"] = step
        shape = "batch 4, T 32, 2 layers, n_embd 32" if args.quick else "batch 12, T 64, 4 layers, n_embd 128"
        print(f"### Training step at the Shakespeare config ({shape}; "
              f"median of {args.rounds} interleaved rounds x 3 steps)\n")
        print("| config | params | ms/step |\n| --- | ---: | ---: |")
        print("\n".join(f"| {r['variant']} | {r['params']:,} | {r['ms_per_step']:.1f} |" for r in step) + "\n")
    if args.runs:
        table, rows = runs_table(args.runs)
        results["runs"] = rows
        print("### Shakespeare char runs (train.py summary.json)\n")
        print(table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
