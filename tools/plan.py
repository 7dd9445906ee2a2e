"""What each attention variant costs at your scale: parameters, training FLOPs and step time,
decode cache, the largest decode batch that fits, and a memory-bound decode speed limit,
computed from the model itself built on the meta device (no memory, instant, any size).

    python -m tools.plan CONFIG... [--key=value ...] --context=N [--batch=B] [--memory=80GB]
                   [--dtype=bf16] [--peak_tflops=989] [--bandwidth=3.35TB/s] [--mfu=0.4]
                   [--vocab_size=50304] [--json FILE]

    python -m tools.plan config/mha.py config/gqa.py config/mla.py config/gla.py \\
        --n_layer=32 --n_head=32 --n_embd=4096 --block_size=32768 --context=32768 --batch=64

--key=value overrides (any train.py key) apply to every config, so one command compares the
variants at the same width and depth. The other flags are the planner's own:
  --context      tokens per sequence: training length and decode context (required)
  --batch        sequences per training step and the decode batch asked for (default 1)
  --memory       device memory for weights + decode cache (default 80GB, an H100; 80GiB, 640GB;
                 a bare number is GB). With N devices pass the totals.
  --dtype        weights and K/V cache: bf16 | fp16 | fp32 | fp8 (default bf16)
  --peak_tflops  dense peak, TFLOP/s (default 989, an H100 SXM's bf16); 989TFLOP/s also reads
  --bandwidth    memory bandwidth (default 3.35TB/s, an H100 SXM's; a bare number is TB/s)
  --mfu          model FLOPs utilization assumed for the step time (default 0.4), in PaLM's count as
                 train.py logs it (GPT.flops_per_token_palm)
  --vocab_size   vocabulary (default 50304, GPT-2's 50257 padded)
A markdown table goes to stdout with the assumptions under it; --json FILE writes one object
per config. Bad input is one line on stderr and exit status 2, before anything is planned.
"""
import argparse
import json
import math
import os
import re
import sys

import torch

from attention.cache import StateCache
from model import GPT, GPTConfig
from trainer.cli import ConfigError, OneLineParser, check_output, fail
from trainer.settings import MODEL_KEYS, parse_shared_keys

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32, "fp8": torch.float8_e4m3fn}
DEFAULTS = {"batch": "1", "memory": "80GB", "dtype": "bf16", "peak_tflops": "989", "bandwidth": "3.35TB/s",
            "mfu": "0.4", "vocab_size": "50304", "context": None, "json": None}
PREFIXES = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
            "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50}
QUANTITY = re.compile(r"^([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(?:(Ki|Mi|Gi|Ti|Pi|[kKMGTP]?)(B/s|B|FLOP/s|FLOPS))?$")
# flag -> (units it accepts, what a bare number means, an example for the error line)
UNITS = {"memory": (("B",), 1e9, "80GB, 80GiB or 80 (GB)"),
         "bandwidth": (("B/s",), 1e12, "4.8TB/s, 3350GB/s or 4.8 (TB/s)"),
         "peak_tflops": (("FLOP/s", "FLOPS"), 1e12, "989, 989TFLOP/s or 1.98PFLOPS")}


def parse_quantity(flag: str, text: str) -> float:
    """'80GB' -> 8e10, '80GiB' -> 85899345920, '4.8TB/s' -> 4.8e12, '989' (peak_tflops) -> 9.89e14."""
    units, bare_scale, example = UNITS[flag]
    m = QUANTITY.match(text.strip())
    if m is None or (m.group(3) is not None and m.group(3) not in units):
        fail(f"--{flag}={text!r} is not a quantity this flag takes: write e.g. {example}")
    value = float(m.group(1)) * (bare_scale if m.group(3) is None else PREFIXES[m.group(2)])
    if not (value > 0 and math.isfinite(value)):
        fail(f"--{flag}={text!r} must be positive: write e.g. {example}")
    return value


def parse_number(flag: str, text: str, kind, low, high=math.inf):
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        span = f"between {low} and {high}" if high < math.inf else f"at least {low}"
        fail(f"--{flag}={text!r} must be {'an integer' if kind is int else 'a number'} {span}")
    return value


HELP = {"context": "tokens per sequence (required)", "batch": "sequences per step and decode batch (default 1)",
        "memory": "device memory (default 80GB)", "dtype": "weights and K/V cache: " + ", ".join(DTYPES),
        "peak_tflops": "dense peak (default 989)", "bandwidth": "memory bandwidth (default 3.35TB/s)",
        "mfu": "model FLOPs utilization (default 0.4)", "vocab_size": "vocabulary (default 50304)",
        "json": "also write one object per config to this file"}


def flag_parser():
    """The planner's own flags (values kept as text: parse_options checks them); every other --key=value
    is a model override for the configs (parse_known_args), every other word a config file."""
    ap = OneLineParser(prog="python -m tools.plan", description=__doc__, allow_abbrev=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       usage="python -m tools.plan CONFIG... [--key=value ...] --context=N [--batch=B] "
                             "[--memory=80GB] [--dtype=bf16] [...] [--json FILE]")
    ap.add_argument("configs", nargs="*", metavar="CONFIG", help="config files, as train.py reads them")
    for flag, default in DEFAULTS.items():
        ap.add_argument(f"--{flag}", default=default, metavar=flag.upper(), help=HELP[flag])
    return ap


def split_argv(argv):
    """-> (the planner's flags as raw strings, config files, --key=value overrides for the configs)."""
    known, rest = flag_parser().parse_known_args(argv)
    raw = {k: v for k, v in vars(known).items() if k != "configs"}
    configs, overrides = list(known.configs), []
    for arg in rest:   # a config after an override lands here, still in order
        (overrides if arg.startswith("--") else configs).append(arg)
    return raw, configs, overrides


def parse_options(raw: dict) -> dict:
    """The planner's flags, checked (one line and exit 2 on the first bad one)."""
    if raw["context"] is None:
        fail("--context=N is required: the sequence length to plan for, e.g. --context=32768")
    check_output(raw["json"], "--json")  # a missing folder, a folder given as the file, no write access
    if raw["dtype"] not in DTYPES:
        fail(f"--dtype={raw['dtype']!r} is unknown; choose one of {', '.join(DTYPES)}")
    return {"context": parse_number("context", raw["context"], int, 1),
            "batch": parse_number("batch", raw["batch"], int, 1),
            "mfu": parse_number("mfu", raw["mfu"], float, 1e-6, 1.0),
            "vocab_size": parse_number("vocab_size", raw["vocab_size"], int, 1),
            "dtype": DTYPES[raw["dtype"]], "dtype_name": raw["dtype"], "memory_text": raw["memory"],
            **{flag: parse_quantity(flag, raw[flag]) for flag in UNITS}, "json": raw["json"]}


MAX_LAYERS = 10_000


def build_planned_model(path: str, overrides: list, opts: dict) -> GPT:
    """The config's model on the meta device, refused (exit 2) if it cannot run the plan."""
    try:
        cfg = parse_shared_keys(path, overrides)  # --sparse_block=64 for bigbird leaves mha alone
        config = GPTConfig(vocab_size=opts["vocab_size"], **{k: cfg[k] for k in MODEL_KEYS})
    except (ConfigError, ValueError) as e:
        fail(f"{path}: {e}")
    if config.n_layer > MAX_LAYERS:  # building them, even on the meta device, takes minutes to hours
        fail(f"{path}: n_layer={config.n_layer} is more than this planner builds ({MAX_LAYERS}; the deepest LLMs "
             "have ~100-200); plan a shallower model and scale its per-layer numbers")
    with torch.device("meta"):
        model = GPT(config)
    try:
        model.context_window(opts["context"])
    except ValueError:  # learned positions and BigBird's layout end at block_size
        fail(f"{path}: attention={config.attention} with pos_encoding={config.pos_encoding} takes at most "
             f"block_size={config.block_size} tokens, below --context={opts['context']}; "
             f"set --block_size={opts['context']} or lower --context")
    weight_bytes = model.num_params() * opts["dtype"].itemsize
    if weight_bytes > opts["memory"]:
        fail(f"{path}: the weights alone take {fmt_bytes(weight_bytes)} ({fmt_count(model.num_params())} "
             f"parameters at {opts['dtype_name']}), more than --memory={opts['memory_text']}; raise --memory")
    return model


def plan_row(path: str, model: GPT, opts: dict) -> dict:
    """Every number of one config's row, from the model's own counts."""
    context, batch, itemsize = opts["context"], opts["batch"], opts["dtype"].itemsize
    params = model.num_params()
    attn_params = sum(p.numel() for b in model.h for p in b.attn.parameters())
    flops = model.flops_per_token(context)            # as computed: what budgets compare
    palm = model.flops_per_token_palm(context)        # what MFU counts, so the step time at an MFU uses it
    keys = keys_per_query(model, context)
    per_token = model.cache_elems_per_token() * itemsize
    state = model.cache_state_elems() * StateCache.dtype.itemsize
    weight_bytes = params * itemsize
    cache_seq = model.cache_elems_per_seq(context) * itemsize  # swa: flat once the window is full
    max_batch = int((opts["memory"] - weight_bytes) // (cache_seq + state))
    # A decode step reads every weight once and each sequence's cache (the sparse variants: only
    # the keys they read, though BigBird's and MoBA's caches hold the whole context); a recurrent
    # state is read and written back every step.
    read_per_seq = per_token * (keys or 0) + 2 * state

    def decode_bound(b):
        return b * opts["bandwidth"] / (weight_bytes + b * read_per_seq) if 1 <= b <= max_batch else None
    return {"variant": os.path.splitext(os.path.basename(path))[0], "attention": model.config.attention,
            "pos_encoding": model.config.pos_encoding, "params": params, "attn_params": attn_params,
            "context": context, "batch": batch, "train_flops_per_token": flops,
            "attn_flops_per_token": flops - 6 * params, "palm_flops_per_token": palm,
            "train_step_s": batch * context * palm / (opts["peak_tflops"] * opts["mfu"]),
            "kv_cache_bytes_per_token": per_token, "kv_cache_bytes_per_seq": cache_seq,
            "cache_state_bytes": state, "weight_bytes": weight_bytes, "max_decode_batch": max_batch,
            "decode_tokens_per_sec_bound": decode_bound(batch),
            "decode_tokens_per_sec_bound_max_batch": decode_bound(max_batch),
            "keys_per_query": keys, "vocab_size": model.config.vocab_size,
            "dtype": opts["dtype_name"], "memory_bytes": opts["memory"],
            "bandwidth_bytes_per_sec": opts["bandwidth"], "peak_flops": opts["peak_tflops"], "mfu": opts["mfu"]}


def keys_per_query(model: GPT, context: int) -> int | None:
    """Keys the last query of a sequence of `context` tokens reads, the most over layers: all of them
    for dense attention, the window (swa), the selected or chosen blocks (BigBird, MoBA); None for a
    layer that reads a state instead (GLA)."""
    keys = [k for k in (b.attn.keys_per_query(context) for b in model.h) if k is not None]
    return max(keys) if keys else None


def fmt_count(n: float) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.0f}"


def fmt_bytes(n: float) -> str:
    for scale, suffix in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= scale:
            return f"{n / scale:.3g} {suffix}"
    return f"{n:.0f} B"


def fmt_rate(r) -> str:
    return "does not fit" if r is None else f"{r:,.0f}"


def table_lines(rows: list, opts: dict) -> list:
    """The plan as a markdown table; the cache columns name the dtype they are counted in."""
    b, dt = opts["batch"], opts["dtype_name"]
    lines = [f"| variant | attention | params | attn params | train GFLOP/token (attn) | train step s (batch {b}) "
             f"| cache/token ({dt}) | cache/seq ({dt}) | state/seq (fp32) | max decode batch "
             f"| decode tok/s <= (batch {b}) | decode tok/s <= (max batch) | keys/query |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['attention']}, {r['pos_encoding']} | {fmt_count(r['params'])} "
                     f"| {fmt_count(r['attn_params'])} | {r['train_flops_per_token'] / 1e9:.3g} "
                     f"({r['attn_flops_per_token'] / r['train_flops_per_token']:.0%}) | {r['train_step_s']:.3g} "
                     f"| {fmt_bytes(r['kv_cache_bytes_per_token'])} | {fmt_bytes(r['kv_cache_bytes_per_seq'])} "
                     f"| {fmt_bytes(r['cache_state_bytes'])} | {r['max_decode_batch']:,} "
                     f"| {fmt_rate(r['decode_tokens_per_sec_bound'])} "
                     f"| {fmt_rate(r['decode_tokens_per_sec_bound_max_batch'])} "
                     f"| {'-' if r['keys_per_query'] is None else format(r['keys_per_query'], ',')} |")
    return lines


def print_assumptions(opts: dict):
    c, dt = opts["context"], opts["dtype_name"]
    print(f"""
Assumptions: context {c:,} tokens; weights and K/V cache in {dt} ({opts['dtype'].itemsize} bytes), GLA's state
in fp32 as the model keeps it; vocab_size {opts['vocab_size']:,} (--vocab_size to change).
- params: every parameter, the tied embedding once; attn params: the attention layers only.
- train FLOPs/token: 6 x params + each layer's attention at context {c:,} as the variant computes it, causal
  pairs only (dense softmax (context + 1) / 2 keys per query on average; BigBird, MoBA: the keys of the blocks
  each query visits, MoBA's block gates too; swa: its window; GLA: its chunk and state): GPT.flops_per_token,
  what budgets compare (sweep --match=flops).
  Step time: batch x context x FLOPs by PaLM's convention (GPT.flops_per_token_palm: every key of the context,
  causal half not subtracted, the count MFU uses) / ({opts['peak_tflops'] / 1e12:g} TFLOP/s x MFU {opts['mfu']:g}).
- memory {opts['memory'] / 1e9:g} GB holds the weights, then the decode cache of each sequence (cache/seq +
  state/seq); activations, framework overhead and fragmentation are not counted: max decode batch is an upper limit.
- decode tok/s <=: memory-bound at {opts['bandwidth'] / 1e12:g} TB/s: each step reads all weights once and each
  sequence's cache (keys/query of it: BigBird and MoBA their blocks, swa its window; GLA reads and writes its
  state; MoBA's block means, one key per block, not counted), batch x bandwidth / bytes moved; compute ignored.
- cache/seq: what the cache holds at {c:,} tokens (swa stops at its window; BigBird and MoBA keep every key).
- several devices: pass the totals (e.g. 8 x H100: --memory=640GB --bandwidth=26.8TB/s --peak_tflops=7912).""")


def main(argv=None):
    raw, configs, overrides = split_argv(sys.argv[1:] if argv is None else argv)
    opts = parse_options(raw)
    if not configs:
        fail("no config files given: e.g. python -m tools.plan config/mha.py config/mla.py --context=32768")
    models = [build_planned_model(path, overrides, opts) for path in configs]  # all checked before any row
    rows = [plan_row(path, model, opts) for path, model in zip(configs, models)]
    print("\n".join(table_lines(rows, opts)))
    print_assumptions(opts)
    if opts["json"]:
        with open(opts["json"], "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
