"""Long-context cost of every variant in one command: training tokens/s and peak memory at
T = 1k, 4k, 8k, and decoding ms/token after 256, 4k and 16k tokens of context.

    python -m tools.bench --suite=longctx                     # config/{mha,gqa,mqa,mla,bigbird,swa,moba,gla}.py
    python -m tools.bench --suite=longctx config/mha.py config/gla.py --json longctx.json
    python -m tools.bench --suite=longctx --quick                           # tiny sizes: a smoke test

Each variant is built from its config file (the keys train.py takes), at a common width
(--set overrides, default --n_layer=2 --n_embd=256 --n_head=4) with block_size raised to the
longest length, on random tokens. The sparse variants run at settings sized for long context
(their configs' are sized for context 64), each reading about 256-320 keys per query: BigBird in
blocks of 64 (window 3, global 1, random 1: 320 keys), swa a window of 256, MoBA blocks of 64 with
its own and 3 chosen (256 keys).
- Training: one forward + backward + AdamW step at batch 1 and length T; tokens/s from the
  median of --repeats steps after a warm-up; peak memory is what one step allocates beyond
  the model and optimizer (CUDA: max_memory_allocated; CPU: harness.PeakMemory, every tensor
  an op returns counted until freed).
- Decoding: the context is prefilled into fresh caches in chunks of --prefill_chunk tokens
  (untimed), then --steps one-token steps are timed (median ms/token); "cache" is the bytes
  the caches hold at that point (GLA: its constant state).
A markdown table goes to stdout (and --out), one object per variant to --json. Timing is
wall clock: on a shared machine pin OMP_NUM_THREADS and read the numbers as relative.
"""
import os
import sys

import torch

from model import GPT, GPTConfig
from tools.benchmarks.harness import (
    at_least,
    attempt,
    counts,
    decode_cost,
    device_name,
    emit,
    fmt_bytes,
    int_list,
    median_ms,
    parser,
    peak_bytes,
    train_step,
)
from trainer.cli import ConfigError
from trainer.settings import MODEL_KEYS, parse_keys

DEFAULT_CONFIGS = ["config/mha.py", "config/gqa.py", "config/mqa.py", "config/mla.py", "config/bigbird.py",
                   "config/swa.py", "config/moba.py", "config/gla.py"]
WIDTH = ["--n_layer=2", "--n_embd=256", "--n_head=4"]
# attention -> (its long-context settings, the same for --quick's short lengths)
LONG_SETTINGS = {
    "bigbird": ({"sparse_block": 64, "sparse_window": 3, "sparse_global": 1, "sparse_random": 1},
                {"sparse_block": 16, "sparse_window": 3, "sparse_global": 1, "sparse_random": 1}),
    "swa": ({"sliding_window": 256}, {"sliding_window": 16}),
    "moba": ({"sparse_block": 64, "moba_topk": 3}, {"sparse_block": 8, "moba_topk": 2}),
}


def parse_args(argv):
    p = parser(__doc__)
    p.add_argument("configs", nargs="*", help="config files (default: the eight variants)")
    p.add_argument("--train_lens", type=counts, default="1024,4096,8192")
    p.add_argument("--contexts", type=counts, default="256,4096,16384")
    p.add_argument("--repeats", type=at_least(1), default=3, help="timed training steps per length")
    p.add_argument("--steps", type=at_least(1), default=16, help="timed decode steps per context")
    p.add_argument("--prefill_chunk", type=at_least(1), default=1024)
    p.add_argument("--vocab_size", type=at_least(1), default=65)
    p.add_argument("--device", default="auto")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="--key=value",
                   help=f"override for every config (default width: {' '.join(WIDTH)})")
    args = p.parse_args(argv)
    if args.quick:  # tiny sizes, except what was given explicitly
        quick = {"train_lens": "64,128", "contexts": "32,128", "repeats": 1, "steps": 4, "prefill_chunk": 64}
        for key, value in quick.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
        args.overrides = ["--n_layer=1", "--n_embd=32", "--n_head=4", *args.overrides]
    return args


def model_config(path, args, max_len):
    """GPTConfig of a config file at the benchmark's width and length (ConfigError/ValueError if bad)."""
    cfg = parse_keys([path, *WIDTH, *args.overrides])
    model_keys = {k: cfg[k] for k in MODEL_KEYS}
    for name in dict.fromkeys(a.strip() for a in model_keys["attention"].split(",")):  # a plan: each variant's
        if name in LONG_SETTINGS:
            model_keys.update(LONG_SETTINGS[name][1 if args.quick else 0])
    model_keys["block_size"] = max_len
    return GPTConfig(vocab_size=args.vocab_size, **model_keys)


def bench_train(model, T, args, device):
    """{T, tokens_per_sec, peak_mem_bytes} of forward + backward + AdamW at batch 1."""
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), torch.device(device).type)
    idx = torch.randint(0, args.vocab_size, (1, T + 1), generator=torch.Generator().manual_seed(T)).to(device)
    step = train_step(model, idx, opt, device)
    ms = median_ms(step, repeats=args.repeats, warmup=1)  # the warm-up also creates AdamW's state
    peak, _ = peak_bytes(step, device)
    return {"T": T, "tokens_per_sec": T / (ms / 1e3), "peak_mem_bytes": peak}


def max_length(args):
    return max(max(int_list(args.train_lens)), max(int_list(args.contexts)) + args.steps)


def bench_variant(path, args, device):
    torch.manual_seed(0)
    model = GPT(model_config(path, args, max_length(args))).to(device)
    row = {"variant": os.path.splitext(os.path.basename(path))[0], "attention": model.config.attention,
           "pos_encoding": model.config.pos_encoding, "params": model.num_params(),
           "kv_cache_bytes_per_token": model.cache_elems_per_token() * 4,
           "cache_state_bytes": model.cache_state_elems() * 4, "device": device_name(), "train": [], "decode": []}
    for T in int_list(args.train_lens):
        row["train"].append({"T": T, **attempt(lambda T=T: bench_train(model.train(), T, args, device))})
        print(f"  {row['variant']} train T={T}: {row['train'][-1]}", file=sys.stderr)
    for context in int_list(args.contexts):
        cost = attempt(lambda c=context: decode_cost(model.eval(), c, args.steps, device, args.prefill_chunk))
        row["decode"].append({"context": context, **cost})
        print(f"  {row['variant']} decode {context}: {row['decode'][-1]}", file=sys.stderr)
    return row


def cell(entry, key, spec, scale=1.0):
    if "error" in entry:
        return "error"
    return format(entry[key] / scale, spec) if key in entry else "-"  # '-': not measured


def table_lines(rows, lens, contexts, cache_dtype="fp32, as run"):
    """The table of rows (bench_variant's) at training lengths lens and decode contexts; the cache column
    holds each row's last decode entry's cache_bytes, counted in cache_dtype (a constant state: fp32)."""
    head = (["variant", "params"] + [f"train tok/s T={t}" for t in lens] + [f"peak MiB T={t}" for t in lens]
            + [f"decode ms/token @{c}" for c in contexts] + [f"cache @{contexts[-1]} ({cache_dtype})"])
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        cells = [f"{r['variant']} ({r['attention']}, {r['pos_encoding']})", f"{r['params'] / 1e6:.2f}M"]
        cells += [cell(e, "tokens_per_sec", ",.0f") for e in r["train"]]
        cells += [cell(e, "peak_mem_bytes", ",.0f", 2 ** 20) for e in r["train"]]
        cells += [cell(e, "ms_per_token", ".2f") for e in r["decode"]]
        last = r["decode"][-1]
        cells.append("error" if "error" in last else fmt_bytes(last["cache_bytes"])
                     + (" (constant state)" if r["cache_state_bytes"] and not r["kv_cache_bytes_per_token"] else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(rows, args):
    lines = table_lines(rows, int_list(args.train_lens), int_list(args.contexts))
    width = " ".join(WIDTH + args.overrides)
    lines += ["", (f"{device_name()}, fp32, batch 1, {width}; training: median of {args.repeats} steps "
              f"(forward + backward + AdamW); decoding: median of {args.steps} one-token steps after the context")]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    configs = args.configs or DEFAULT_CONFIGS
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    for path in configs:
        if not os.path.isfile(path):
            print(f"error: config file {path} not found", file=sys.stderr)
            sys.exit(2)
    for path in configs:  # every config checked before any work
        try:
            model_config(path, args, max_length(args))
        except (ConfigError, ValueError) as e:
            print(f"error: {path}: {e}", file=sys.stderr)
            sys.exit(2)
    rows = [bench_variant(path, args, device) for path in configs]
    emit(markdown(rows, args), rows, args)


if __name__ == "__main__":
    main()
