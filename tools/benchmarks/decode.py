"""The cost of one decoding step: every variant side by side at 256, 4k and 16k tokens of context,
and our generate against Hugging Face's LlamaForCausalLM.generate at the same tiny GQA + RoPE shape.

    python -m tools.bench --suite=decode                 # the six config/ladder256 variants (below)
    python -m tools.bench --suite=decode config/ladder256/mha.py config/gla.py --json decode.json
    python -m tools.bench --suite=decode --compile       # also through torch.compile (GPT.compiled_step)
    python -m tools.bench --suite=decode --quick         # tiny sizes: a smoke test

1. Variants (default: config/ladder256/ mha, gla, linear, retnet, deltanet and gated_deltanet, the
   ladder study's 4 layers of width 128): each config file as it is (its width and keys; block_size
   raised to the longest context), batch 1, fp32. Its caches are prefilled with --contexts tokens
   (untimed, in chunks of --prefill_chunk; harness.prefilled_step), then one greedy token per step
   is timed, in --rounds interleaved rounds of --steps steps per variant and context, so that a
   shared machine's load drifts over all of them alike: the median ms/token of all its steps, the
   cache bytes at that point, and @last / @first, which is 1 for a cost flat in the context.
   --compile adds the same through GPT.compiled_step (torch.compile; needs a C++ compiler; the
   first calls, which compile, untimed and reported as compile_s).
2. Hugging Face: --hf_config (default config/gqa.py: 4 layers, width 128, 4 query and 2 KV heads,
   RoPE) as our GPT and as transformers' LlamaForCausalLM with the same n_layer, width, heads, KV
   heads, vocabulary, head dim, RoPE base and tied embeddings; Llama's SwiGLU MLP gets 2/3 of our
   hidden width (Llama's own rule), so both MLPs hold the same weights and multiply-adds per token.
   (Llama also has RMSNorm for LayerNorm and rotates half-dims rather than pairs: same work.)
   Both generate --hf_tokens tokens greedily after the same --hf_context random tokens, --rounds
   times, interleaved; ms/token is the median time between consecutive new tokens (our
   generate_stream's yields, transformers' streamer calls): a step with its loop's sampling and
   bookkeeping, the prompt's prefill left out.
Timing is wall clock with --threads threads (default 1: a step at batch 1 is many small ops, which
more threads only make noisier). A markdown table goes to stdout (and --out), the results to --json.
"""
import contextlib
import os
import statistics
import sys
import time

import torch

from model import GPT, GPTConfig
from tools import budget
from tools.benchmarks.harness import (
    at_least,
    attempt,
    compiling,
    counts,
    device_name,
    emit,
    fmt_bytes,
    int_list,
    parser,
    prefilled_step,
)
from trainer.cli import ConfigError
from trainer.settings import MODEL_KEYS, parse_keys

DEFAULT_CONFIGS = [f"config/ladder256/{name}.py" for name in
                   ("mha", "gla", "linear", "retnet", "deltanet", "gated_deltanet")]
QUICK_WIDTH = ["--n_layer=1", "--n_embd=32", "--n_head=4"]
WARMUP = 3  # untimed steps first: a compiled step compiles, then may recompile once for dynamic shapes


def parse_args(argv):
    p = parser(__doc__)
    p.add_argument("configs", nargs="*", help="config files (default: the six ladder256 variants)")
    p.add_argument("--contexts", type=counts, default="256,4096,16384",
                   help="tokens in the cache before the timed steps")
    p.add_argument("--steps", type=at_least(1), default=32, help="timed steps per variant, context and round")
    p.add_argument("--rounds", type=at_least(1), default=5, help="interleaved rounds")
    p.add_argument("--prefill_chunk", type=at_least(1), default=1024)
    p.add_argument("--vocab_size", type=at_least(1), default=65)
    p.add_argument("--threads", type=at_least(0), default=1, help="torch threads (0: leave as is)")
    p.add_argument("--device", default="auto")
    p.add_argument("--compile", action="store_true", help="also time the step through torch.compile")
    p.add_argument("--hf_config", default="config/gqa.py", help="our GQA + RoPE shape for the transformers run")
    p.add_argument("--hf_context", type=at_least(1), default=64, help="prompt tokens before generating")
    p.add_argument("--hf_tokens", type=at_least(1), default=64, help="tokens generated per timed call")
    p.add_argument("--match", choices=("none", "params"), default="none",
                   help="params: each config's MLP width solved so that its parameters equal the first config's "
                        "(as the studies and the cpu suite's training rows match them); none: each at its own")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="--key=value",
                   help="override for every config, e.g. --set=--n_layer=2")
    args = p.parse_args(argv)
    if args.quick:  # tiny sizes, except what was given explicitly
        quick = {"contexts": "16,48", "steps": 4, "rounds": 2, "prefill_chunk": 32, "hf_context": 8, "hf_tokens": 4}
        for key, value in quick.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
        args.overrides = [*QUICK_WIDTH, *args.overrides]
    return args


def model_config(path, args, block_size=None, target_params=None):
    """GPTConfig of a config file with the overrides (ConfigError/ValueError if bad); block_size raised
    to at least `block_size` (learned positions end there; the others decode past it anyway); with
    target_params, mlp_hidden solved to that many parameters (tools/budget.py, ValueError if none can)."""
    cfg = parse_keys([path, *args.overrides])
    keys = {k: cfg[k] for k in MODEL_KEYS}
    keys["block_size"] = max(keys["block_size"], block_size or 0)
    if target_params is not None:
        keys["mlp_hidden"], _ = budget.solve_mlp_hidden(keys, target_params, args.vocab_size)
    return GPTConfig(vocab_size=args.vocab_size, **keys)


def target_params(configs, args, block_size=None):
    """--match=params: the first config's parameter count at block_size (learned positions' table grows
    with it), which the others' MLP widths are solved to; else None."""
    if args.match != "params":
        return None
    with torch.device("meta"):
        return GPT(model_config(configs[0], args, block_size)).num_params()


def timed_steps(args):
    """Decoding steps each prefilled cache makes room for: every round's, and the warm-up's."""
    return args.rounds * args.steps + WARMUP


def longest(args):
    """The block_size every variant is built with: the longest context plus every step after it."""
    return max(int_list(args.contexts)) + timed_steps(args)


def step_times(step, n):
    """Milliseconds of each of n calls of step()."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def prepare_variant(path, args, device, target=None):
    """(row, cells): the variant's row without timings, and a cell (entry, key, step, times) per context
    (and --compile) holding a prefilled step with room for every round's steps, which the rounds time.
    target: the parameters its MLP width is solved to (--match=params), or None."""
    torch.manual_seed(0)
    model = GPT(model_config(path, args, longest(args), target)).to(device).eval()
    row = {"variant": os.path.splitext(os.path.basename(path))[0], "attention": model.config.attention,
           "pos_encoding": model.config.pos_encoding, "params": model.num_params(),
           "kv_cache_bytes_per_token": model.cache_elems_per_token() * 4,
           "cache_state_bytes": model.cache_state_elems() * 4,
           "decode": [{"context": c} for c in int_list(args.contexts)]}
    total = timed_steps(args)
    forwards = {"ms_per_token": None, **({"compiled_ms_per_token": model.compiled_step} if args.compile else {})}
    cells = []
    for entry in row["decode"]:
        for key, forward in forwards.items():
            made = attempt(lambda: prefilled_step(model, entry["context"], total, device, args.prefill_chunk, forward))
            if isinstance(made, dict):  # the error
                entry[key] = made["error"]
                continue
            step, info = made
            entry.update(info)
            t0 = time.perf_counter()
            step_times(step, WARMUP)  # first calls: lazy setup; torch.compile's compiling (and recompiling)
            if forward is not None:
                entry["compile_s"] = time.perf_counter() - t0
            cells.append((entry, key, step, []))
    return row, cells


def bench_variants(configs, args, device):
    """One row per config: median ms/token per context, from interleaved rounds."""
    target = target_params(configs, args, longest(args))
    with compiling(len(configs)) if args.compile else contextlib.nullcontext():
        prepared = [prepare_variant(path, args, device, target) for path in configs]
        cells = [cell for _, variant_cells in prepared for cell in variant_cells]
        for r in range(args.rounds):
            for entry, key, step, times in cells:
                times.extend(step_times(step, args.steps))
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr)
    for entry, key, _, times in cells:
        entry[key] = statistics.median(times)
    rows = [row for row, _ in prepared]
    for row in rows:
        first, last = row["decode"][0].get("ms_per_token"), row["decode"][-1].get("ms_per_token")
        numbers = isinstance(first, float) and isinstance(last, float)
        row["last_over_first"] = last / first if numbers else None
    return rows


def check_llama_shape(config):
    """ValueError (one line) unless Llama has this shape: MHA/GQA/MQA, full RoPE without scaling."""
    if config.attention not in ("mha", "gqa", "mqa") or config.pos_encoding != "rope":
        raise ValueError(f"--hf_config needs attention mha, gqa or mqa with pos_encoding=rope (Llama's), got "
                         f"attention={config.attention} pos_encoding={config.pos_encoding}")
    if config.rope_scaling != "none" or config.rope_fraction != 1.0 or config.attn_output_gate != "none":
        raise ValueError("--hf_config: rope_scaling, rope_fraction and attn_output_gate must be at their defaults")


def llama_config(config):
    """transformers' LlamaConfig of our shape (see the module docstring)."""
    import transformers
    check_llama_shape(config)
    hidden = config.mlp_hidden or 4 * config.n_embd
    return transformers.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.n_embd, intermediate_size=round(2 * hidden / 3),
        num_hidden_layers=config.n_layer, num_attention_heads=config.n_head, num_key_value_heads=config.n_kv_head,
        head_dim=config.n_embd // config.n_head, max_position_embeddings=config.block_size,
        rope_theta=config.rope_base, tie_word_embeddings=True, attention_bias=config.bias, mlp_bias=config.bias,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)


class Clock:
    """A generate() streamer (put, end: transformers' interface) that keeps the time of each put."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def ours_generate(model, prompt, n, **kwargs):
    """Our GPT.generate_stream's token times (a Clock: the prompt's, then one per new token)."""
    clock = Clock()
    clock.put(prompt)
    for _ in model.generate_stream(prompt, n, temperature=0, **kwargs):
        clock.put(None)
    return clock


def hf_generate(llama, prompt, n):
    """transformers' generate (greedy, exactly n new tokens) with a Clock as its streamer."""
    clock = Clock()
    llama.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=clock)
    return clock


def generate_cost(generate, rounds):
    """{name: ms/token}: the median time between consecutive new tokens (each a decoding step, with
    the loop's own sampling and bookkeeping; the prompt's prefill before the first is left out) over
    `rounds` interleaved calls of each generate() -> Clock."""
    gaps = {name: [] for name in generate}
    for gen in generate.values():  # warm up (and compile)
        gen()
    for _ in range(rounds):
        for name, gen in generate.items():
            times = gen().times[1:]
            gaps[name] += [(b - a) * 1e3 for a, b in zip(times, times[1:])]
    return {name: statistics.median(g) for name, g in gaps.items()}


@torch.no_grad()
def bench_hf(args, device):
    """Our GPT.generate against transformers' LlamaForCausalLM.generate, greedy, at --hf_config's shape."""
    import transformers
    transformers.logging.set_verbosity_error()
    config = model_config(args.hf_config, args, args.hf_context + args.hf_tokens)
    torch.manual_seed(0)
    ours = GPT(config).to(device).eval()
    llama = transformers.LlamaForCausalLM(llama_config(config)).to(device).eval()
    prompt = torch.randint(0, config.vocab_size, (1, args.hf_context), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(device)
    n = args.hf_tokens
    generate = {"ours": lambda: ours_generate(ours, prompt, n), "hf": lambda: hf_generate(llama, prompt, n)}
    if args.compile:
        generate["ours_compiled"] = lambda: ours_generate(ours, prompt, n, compile=True)
    cost = generate_cost(generate, args.rounds)
    compiled = {}
    if args.compile:
        compiled = {"compiled_ms_per_token": cost["ours_compiled"],
                    "hf_over_ours_compiled": cost["hf"] / cost["ours_compiled"]}
    shape = {k: getattr(config, k) for k in ("attention", "n_layer", "n_embd", "n_head", "n_kv_head", "vocab_size")}
    return {**shape, "mlp_hidden": config.mlp_hidden or 4 * config.n_embd,
            "hf_intermediate_size": llama.config.intermediate_size, "params": ours.num_params(),
            "hf_params": llama.num_parameters(), "context": args.hf_context, "tokens": args.hf_tokens,
            "ms_per_token": cost["ours"], "hf_ms_per_token": cost["hf"], "hf_over_ours": cost["hf"] / cost["ours"],
            **compiled, "transformers": transformers.__version__}


def cell(entry, key):
    value = entry.get(key, "-")
    return f"{value:.3f}" if isinstance(value, float) else ("error" if value != "-" else value)


def variants_table(rows, args):
    contexts = int_list(args.contexts)
    keys = ["ms_per_token"] + ["compiled_ms_per_token"] * args.compile
    head = (["variant", "params", f"cache @{contexts[-1]}"]
            + [f"{'compiled ' if 'compiled' in k else ''}ms/token @{c}" for k in keys for c in contexts]
            + [f"@{contexts[-1]} / @{contexts[0]}"])
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        last = r["decode"][-1]
        cache = fmt_bytes(last["cache_bytes"]) if "cache_bytes" in last else "error"
        cells = [f"{r['variant']} ({r['attention']}, {r['pos_encoding']})", f"{r['params'] / 1e6:.2f}M", cache]
        cells += [cell(e, k) for k in keys for e in r["decode"]]
        cells.append(f"{r['last_over_first']:.2f}" if r["last_over_first"] is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def hf_table(hf):
    if "error" in hf:
        return [f"Hugging Face comparison: {hf['error']}"]
    shape = (f"{hf['attention']}, {hf['n_layer']} layers, width {hf['n_embd']}, {hf['n_head']} heads / "
             f"{hf['n_kv_head']} KV, vocab {hf['vocab_size']}, context {hf['context']}")
    lines = ["| generate (greedy) | params | MLP hidden | ms/token |", "|---|---:|---:|---:|",
             f"| ours: GPT ({shape}) | {hf['params']:,} | {hf['mlp_hidden']} | {hf['ms_per_token']:.3f} |"]
    if "compiled_ms_per_token" in hf:
        lines.append(f"| ours, compile=True | {hf['params']:,} | {hf['mlp_hidden']} | "
                     f"{hf['compiled_ms_per_token']:.3f} |")
    lines += [f"| transformers {hf['transformers']} LlamaForCausalLM | {hf['hf_params']:,} | "
              f"{hf['hf_intermediate_size']} (SwiGLU) | {hf['hf_ms_per_token']:.3f} |",
              "", f"Hugging Face's ms/token over ours: {hf['hf_over_ours']:.2f}x"
              + (f" (compiled: {hf['hf_over_ours_compiled']:.2f}x)" if "hf_over_ours_compiled" in hf else "")]
    return lines


def markdown(rows, hf, args):
    width = " ".join(args.overrides) or "each config's own width"
    if args.match == "params":
        width += ", MLP widths matched to the first config's parameters"
    lines = variants_table(rows, args) + [
        "", f"{device_name()}, fp32, batch 1, {width}; median ms/token of {args.rounds} x {args.steps} greedy "
            "one-token steps after the context, interleaved rounds", ""]
    return "\n".join(lines + hf_table(hf)) + "\n"


def main(argv=None):
    args = parse_args(argv)
    configs = args.configs or DEFAULT_CONFIGS
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    for path in [*configs, args.hf_config]:  # every config checked before any work, built as its run builds it
        try:
            if not os.path.isfile(path):
                raise ConfigError("not found")
            if path == args.hf_config:
                check_llama_shape(model_config(path, args))
            else:
                model_config(path, args, longest(args), target_params(configs, args, longest(args)))
        except (ConfigError, ValueError) as e:
            print(f"error: config file {path}: {e}", file=sys.stderr)
            sys.exit(2)
    # every variant's GPT.forward is one code object to torch.compile, whose recompile limit (8) counts them all
    with torch._dynamo.config.patch(recompile_limit=max(8, 4 * len(configs) + 4)):
        rows = bench_variants(configs, args, device)
        hf = attempt(lambda: bench_hf(args, device))
    emit(markdown(rows, hf, args), {"variants": rows, "hf_llama": hf, "device": device_name(),
                                    "threads": torch.get_num_threads()}, args)


if __name__ == "__main__":
    main()
