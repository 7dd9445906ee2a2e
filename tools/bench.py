"""Benchmark attention variants side by side: training throughput, decoding speed with and
without the cache, and the cache's size (measured from the allocated tensors and from the
formula).

    python -m tools.bench                                   # every config/*.py variant
    python -m tools.bench config/gqa.py config/mla.py --json bench.json --context=256

Each variant is built from its config file (the same keys as train.py), on random tokens.
Numbers are medians over --repeats runs. A markdown table goes to stdout.

Every other benchmark is a suite of the tools/benchmarks/ package, run through this script:

    python -m tools.bench --suite=NAME [its options]       # python -m tools.bench --suite=NAME --help for them

Suites are named after what they time: kernel_<name> is a Triton kernel against its PyTorch
counterpart (needs CUDA; --quick runs tiny shapes under the Triton interpreter); a variant's
name is that attention variant's model-level costs against MHA; longctx is every variant at
long context; data is the tokenizing pipeline. All take --json FILE, --out FILE and --quick.
"""
import argparse
import glob
import importlib
import json
import os
import sys

import torch

from model import GPT, GPTConfig
from tools.benchmarks.harness import median_ms
from trainer.cli import ConfigError, OneLineParser, check_output, fail
from trainer.settings import MODEL_KEYS, parse_shared_keys, resolve_device


def cache_bytes(model, length, dtype):
    return sum(c.nbytes() for c in model.init_caches(1, length, dtype=dtype))


def bench_variant(path, args, device):
    cfg = parse_shared_keys(path, args.overrides)  # a variant's own key only where its plan reads it
    config = GPTConfig(vocab_size=args.vocab_size, **{k: cfg[k] for k in MODEL_KEYS})
    torch.manual_seed(0)
    model = GPT(config).to(device)
    B, T = cfg["batch_size"], config.block_size
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    # training: forward + backward + AdamW step on random tokens
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device.type)
    x = torch.randint(0, args.vocab_size, (B, T), device=device)

    def train_step():
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
    train_step()  # warm up
    train_tps = B * T / (median_ms(train_step, args.repeats, warmup=0) / 1e3)

    # decoding: greedy, batch 1, after a prompt of --context tokens
    model.eval()
    # learned positions and BigBird end at block_size; the others decode over any window (max_context)
    n_new = args.decode_tokens
    try:
        model.context_window(args.context + n_new)
        context = args.context
    except ValueError:
        context = min(args.context, config.block_size - n_new)
    if context < 1:
        raise ValueError(f"block_size={config.block_size} leaves no room for a prompt and {n_new} new tokens")
    prompt = torch.randint(0, args.vocab_size, (1, context), device=device)

    def decode(use_cache):
        def run():
            for _ in model.generate_stream(prompt, n_new, temperature=0, use_cache=use_cache,
                                           max_context=context + n_new):  # the window holds everything
                pass
            sync()
        return run
    decode(True)()
    dec = n_new / (median_ms(decode(True), args.repeats, warmup=0) / 1e3)
    dec_nc = n_new / (median_ms(decode(False), args.repeats, warmup=0) / 1e3)

    # cache size: the slope of allocated bytes against length separates per-token from constant state,
    # measured below the shortest window (a window's cache stops growing there)
    dtype = next(model.parameters()).dtype
    l2 = min(128, config.block_size, model.cache_max_tokens() or 128)
    l1 = l2 // 2
    b1, b2 = cache_bytes(model, l1, dtype), cache_bytes(model, l2, dtype)
    per_token = (b2 - b1) / (l2 - l1)
    return {"variant": os.path.splitext(os.path.basename(path))[0], "attention": config.attention,
            "pos_encoding": config.pos_encoding, "params": model.num_params(),
            "train_tokens_per_sec": train_tps, "decode_tokens_per_sec": dec,
            "decode_tokens_per_sec_no_cache": dec_nc, "decode_context": context,
            "kv_cache_bytes_per_token": per_token,
            "kv_cache_bytes_per_token_formula": model.cache_elems_per_token() * dtype.itemsize,
            "cache_constant_bytes": b1 - per_token * l1, "device": str(device)}


SUITES = {
    "kernel_flash": "Triton FlashAttention-2 forward/backward TFLOP/s against SDPA's flash backend",
    "kernel_gla": "Triton chunked GLA kernel against the PyTorch chunked form",
    "mla": "MLA's latent cache: sizes against MHA/GQA/MQA, absorbed vs expanded decoding by context",
    "bigbird": "BigBird block-sparse attention op against dense SDPA, T=1k..8k: time and memory",
    "gla": "the GLA model against MHA: decoding by context, training by length, step time",
    "longctx": "every variant: training tokens/s and peak memory at T=1k/4k/8k, decode ms/token at 256/4k/16k",
    "data": "the data/*/prepare.py pipelines: tokens/s and peak memory",
    "cpu": "every variant on this CPU: training tokens/s fp32/bf16, compile off/on, 1/all threads; decode ms/token",
    "nanogpt": "nanoGPT's own shakespeare_char CPU recipe side by side with ours: ms/iter and val loss",
    "threads": "CPU thread settings for training, quiet and with one competing process",
    "decode": "one decoding step: every variant at 256/4k/16k context, and ours against HF Llama generate",
    "ops": "one attention layer's training step ATen op by op: ops per step, time in them, the costliest",
}


def run_suite(argv):
    """python -m tools.bench --suite=NAME [args]: hand the remaining arguments to tools/benchmarks/NAME.py."""
    i = next(i for i, a in enumerate(argv) if a == "--suite" or a.startswith("--suite="))
    name = argv[i].split("=", 1)[1] if "=" in argv[i] else (argv[i + 1] if i + 1 < len(argv) else "")
    rest = argv[:i] + argv[i + (1 if "=" in argv[i] else 2):]
    if name not in SUITES:
        fail(f"--suite={name!r} is not a suite; choose one of {', '.join(SUITES)}")
    importlib.import_module(f"tools.benchmarks.{name}").main(rest)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--suite" or a.startswith("--suite=") for a in argv):
        return run_suite(argv)
    ap = OneLineParser(prog="python -m tools.bench", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="suites:\n" + "\n".join(f"  {k:13s} {v}" for k, v in SUITES.items()))
    ap.add_argument("--suite", help="run a suite of tools/benchmarks/ instead (listed below)")
    ap.add_argument("configs", nargs="*", help="config files (default: every variant in config/)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--context", type=int, default=256, help="prompt length before decoding (capped by the window)")
    ap.add_argument("--decode_tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab_size", type=int, default=65)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="--key=value",
                    help="override applied to every config, e.g. --set=--block_size=512")
    args = ap.parse_args(argv)
    check_output(args.json, "--json")
    not_variants = ("base", "gpt2", "finetune", "uptrain")   # bases, GPT-2-sized and pretrained runs
    configs = args.configs or sorted(p for p in glob.glob("config/*.py") if not any(w in p for w in not_variants))
    for p in configs:
        if not os.path.isfile(p):
            fail(f"config file {p} not found")
    for flag in ("context", "decode_tokens", "repeats", "vocab_size"):
        if getattr(args, flag) < 1:
            fail(f"--{flag}={getattr(args, flag)} must be at least 1")
    try:
        device = torch.device(resolve_device(args.device))
    except ConfigError as e:
        fail(str(e))
    rows = []
    for path in configs:
        try:
            rows.append(bench_variant(path, args, device))
        except (ConfigError, ValueError) as e:
            fail(f"{path}: {e}")
        print(f"done {path}", file=sys.stderr)
    print("| variant | params | train tok/s | prompt | decode tok/s (cache) | decode tok/s (no cache) | "
          "cache B/token (measured) | cache B/token (formula) | constant state B |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} ({r['attention']}, {r['pos_encoding']}) | {r['params'] / 1e6:.2f}M | "
              f"{r['train_tokens_per_sec']:,.0f} | {r['decode_context']} | {r['decode_tokens_per_sec']:,.1f} | "
              f"{r['decode_tokens_per_sec_no_cache']:,.1f} | {r['kv_cache_bytes_per_token']:,.0f} | "
              f"{r['kv_cache_bytes_per_token_formula']:,.0f} | {r['cache_constant_bytes']:,.0f} |")
    print(f"\ndevice {device}, {args.decode_tokens} tokens decoded after the prompt, medians of {args.repeats}",
          file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
