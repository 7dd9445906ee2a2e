"""The CPU budget in one command: what a training step and a decoding step of each variant cost
on this CPU, at the fair study's shape, in every setting the trainer offers.

    python -m tools.bench --suite=cpu                                  # the study variants, full grid
    python -m tools.bench --suite=cpu --json cpu.json --out cpu.md
    python -m tools.bench --suite=cpu --compile=off --threads=1 config/ladder256/mha.py config/ladder256/gla.py
    python -m tools.bench --suite=cpu --quick                          # tiny shapes: a smoke test

Training: each config (the keys train.py takes, on random tokens) with its MLP width solved so
that its parameters equal the first config's (tools.sweep --match=params, tools/budget.py), one
forward + backward + AdamW step of its batch. Settings: --dtypes (float32; bfloat16 = train.py's
CPU autocast: weights, optimizer and the linear family's state stay fp32) x --compile (off; on =
torch.compile of the model, its compile time left out; each setting's models compiled afresh, every
one of them compiled: harness.compiling) x --threads (1; 0 = every visible core).
In each setting the variants are timed round-robin, --rounds rounds of --steps steps each: the
median step of each round, then the median over rounds, so that a drift of the machine touches
every variant alike. Read the ratios to the first config in the same setting; beside each, the
range of its per-round ratios (a round runs the variants back to back, so it pairs them): how far
one round's ratio strays on a shared machine.

Decoding: the decode suite's measurement (tools/benchmarks/decode.py; --suite=decode adds 16k,
torch.compile and Hugging Face's generate): batch 1, float32, one thread, greedy, after --contexts
tokens of prefilled context, the median ms of --decode_steps one-token steps per round over
--rounds interleaved rounds, each config's MLP width matched as in training (decode --match=params).

The table names the CPU and whether it has native bf16 matrix units (cpu_bf16_units: AMX tiles
or AVX512-BF16, as torch detects them); its last lines say whether bf16 autocast trained the first config
faster than fp32 here. dtype=auto stays float32 on CPUs: docs/speed.md says why.
--allocator: keep (train.py's: trainer/allocator.py keeps freed memory for the next step) or default
(glibc's own thresholds); the kernel's share of each training step, page faults and system time,
comes with the timings (run the suite once with each, as separate processes, to compare them).
"""
import contextlib
import resource
import statistics
from types import SimpleNamespace

import torch

from model import GPT, GPTConfig
from tools import budget
from tools.benchmarks import decode
from tools.benchmarks.harness import compiling, emit, median_ms, parser, train_step
from trainer.allocator import keep_freed_memory
from trainer.cli import ConfigError, fail
from trainer.settings import MODEL_KEYS, parse_shared_keys
from trainer.threads import visible_cores

VARIANTS = ["study256/mha", "study256/gqa", "study256/mqa", "study256/mla", "study256/bigbird", "study256/gla",
            "study256/fox", "study256/nsa", "ladder256/linear", "ladder256/retnet", "ladder256/deltanet",
            "ladder256/gated_deltanet"]
VOCAB = 65  # tiny Shakespeare's characters, the studies' vocabulary


def cpu_bf16_units() -> str:
    """The CPU's native bf16 matrix units, as torch's own CPU kernels (oneDNN) detect them:
    "AMX" (Intel Sapphire Rapids and later: AMX tiles), "AVX512-BF16" (AMD Zen 4 and later, Intel
    Cooper Lake: bf16 dot products in AVX-512), or "" (bf16 would be emulated: no faster than fp32)."""
    cpu = torch.cpu
    if getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        return "AMX"
    if getattr(cpu, "_is_avx512_bf16_supported", lambda: False)():
        return "AVX512-BF16"
    return ""


def matched_keys(paths):
    """{path: keys} with each config's mlp_hidden solved to the first config's parameters."""
    keys = {p: parse_shared_keys(p, []) for p in paths}
    target = budget.meta_model(keys[paths[0]], VOCAB).num_params()
    for p in paths[1:]:
        keys[p]["mlp_hidden"], _ = budget.solve_mlp_hidden(keys[p], target, VOCAB)
    return keys


def suite_keys(paths, quick=False):
    """({path: keys}, {name: parameters}): matched_keys, or tiny shapes with --quick (a smoke test). Each
    model is built on the meta device, so a config the model refuses fails here, one line, before any timing."""
    extra = ["--n_layer=1", "--n_embd=32", "--n_head=4", "--block_size=32", "--batch_size=2"] if quick else []
    try:
        keys = matched_keys(paths) if not extra else {p: parse_shared_keys(p, extra) for p in paths}
        return keys, {name(p): budget.meta_model(k, VOCAB).num_params() for p, k in keys.items()}
    except (ConfigError, ValueError) as e:
        fail(str(e))


def build(keys):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, **{k: keys[k] for k in MODEL_KEYS}))


def train_settings(args):
    """[(dtype, compile, threads)], threads 0 resolved to the visible cores."""
    return [(d, c, t or visible_cores()) for d in args.dtypes.split(",") for c in args.compile.split(",")
            for t in sorted({int(x) for x in args.threads.split(",")})]


def time_training(keys, setting, args):
    """({path: median ms per training step}, {path: {page_faults, sys_ms} per step}, {path: each round's
    median ms}) in one setting, the variants round-robin."""
    dtype, compiled, threads = setting
    torch.set_num_threads(threads)
    with compiling(len(keys)) if compiled == "on" else contextlib.nullcontext():
        return time_rounds({path: training_step(k, dtype, compiled) for path, k in keys.items()}, args)


def training_step(keys, dtype, compiled):
    """One config's training step (forward, backward, AdamW) on random tokens, warmed up (and compiled)."""
    model = build(keys)
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), "cpu")
    if compiled == "on":
        model = torch.compile(model)
    idx = torch.randint(0, VOCAB, (keys["batch_size"], keys["block_size"] + 1))
    step = train_step(model, idx, opt)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()

    def run():
        with autocast:
            step()
    run(), run()  # warm up (and compile)
    return run


def time_rounds(steps, args):
    """time_training's timings of {path: step}: --rounds rounds of --steps steps each, round-robin."""
    rounds, kernel = {p: [] for p in steps}, {p: [0, 0.0] for p in steps}
    for _ in range(args.rounds):
        for path, run in steps.items():
            before = resource.getrusage(resource.RUSAGE_SELF)
            rounds[path].append(median_ms(run, repeats=args.steps, warmup=0))
            after = resource.getrusage(resource.RUSAGE_SELF)
            kernel[path][0] += after.ru_minflt - before.ru_minflt
            kernel[path][1] += after.ru_stime - before.ru_stime
    n = args.rounds * args.steps
    return ({p: statistics.median(ms) for p, ms in rounds.items()},
            {p: {"page_faults": faults / n, "sys_ms": sys_s * 1e3 / n} for p, (faults, sys_s) in kernel.items()},
            rounds)


def time_decoding(paths, args):
    """The decode suite's rows (tools/benchmarks/decode.py: fp32, one thread, interleaved rounds) at --contexts."""
    dec = decode.parse_args([*paths, f"--contexts={','.join(map(str, args.contexts))}", "--threads=1", "--match=params",
                             f"--steps={args.decode_steps}", f"--rounds={args.rounds}", *["--quick"] * args.quick])
    torch.set_num_threads(1)
    return decode.bench_variants(paths, dec, "cpu")


def markdown(results):
    """The two tables (training tokens/s with the ratio to the first config; decoding ms/token) of the
    results main() writes as JSON, so that docs/ regenerates them from the stored file (tools/tables)."""
    train, configs = results["train_ms_per_step"], list(results["params"])
    ref = configs[0]
    per_round = results.get("train_ms_per_round")   # files from before it have none
    spread = "; the range of its per-round ratios" if per_round else ""
    lines = ["| config | params | " + " | ".join(f"{s['dtype']}, compile {s['compile']}, {s['threads']} thread(s): "
                                                 f"tok/s (x {ref}{spread})" for s in train) + " |",
             "| --- | ---: |" + " ---: |" * len(train)]
    for c in configs:
        toks, cells = results["tokens_per_step"][c], []
        for i, s in enumerate(train):
            ratio = f"{s[ref] / s[c]:.2f}"
            if per_round:  # each round's ratio: a round runs the variants back to back, so it pairs them
                rounds = [a / b for a, b in zip(per_round[i][ref], per_round[i][c])]
                ratio += f"; {min(rounds):.2f}-{max(rounds):.2f}"
            cells.append(f"{toks / s[c] * 1e3:,.0f} ({ratio})")
        lines.append(f"| {c} | {results['params'][c]:,} | " + " | ".join(cells) + " |")
    if "train_kernel_per_step" in results:  # files from before the allocator setting have none
        first, kernel = train[0], results["train_kernel_per_step"][0]
        lines += ["", f"| config | page faults / step | system ms / step ({first['dtype']}, {first['threads']} "
                  f"thread(s), allocator: {results['allocator']}) |", "| --- | ---: | ---: |"]
        lines += [f"| {c} | {kernel[c]['page_faults']:,.0f} | {kernel[c]['sys_ms']:.1f} |" for c in configs]
    contexts = ",".join(str(e["context"]) for e in results["decode"][0]["decode"])
    lines += ["", *decode.variants_table(results["decode"], SimpleNamespace(contexts=contexts, compile=False))]
    return "\n".join(lines)


def name(path):
    return path.removeprefix("config/").removesuffix(".py")


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("configs", nargs="*", help="config files (default: the study variants); the first is the reference")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--compile", default="off,on")
    ap.add_argument("--threads", default="1,0", help="thread counts; 0 = every visible core")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--contexts", default="256,4096")
    ap.add_argument("--decode_steps", type=int, default=20)
    ap.add_argument("--allocator", choices=("keep", "default"), default="keep",
                    help="keep: freed memory stays for the next step, as in train.py; default: glibc's thresholds")
    args = ap.parse_args(argv)
    check_args(args)
    allocator = keep_freed_memory() if args.allocator == "keep" else "glibc's defaults"
    paths = args.configs or [f"config/{v}.py" for v in VARIANTS]
    keys, params = suite_keys(paths, args.quick)
    train = {s: time_training(keys, s, args) for s in train_settings(args)}   # {setting: (ms, kernel, rounds)}
    decoding = time_decoding(paths, args)
    results = {"cpu_bf16_units": cpu_bf16_units(), "visible_cores": visible_cores(), "torch": torch.__version__,
               "rounds": args.rounds, "steps": args.steps, "params": params,
               "allocator": allocator,
               "train_ms_per_step": [{"dtype": d, "compile": c, "threads": t, **{name(p): ms for p, ms in v.items()}}
                                     for (d, c, t), (v, _, _) in train.items()],
               "train_ms_per_round": [{"dtype": d, "compile": c, "threads": t, **{name(p): r for p, r in v.items()}}
                                      for (d, c, t), (_, _, v) in train.items()],
               "train_kernel_per_step": [{name(p): k for p, k in kernel.items()} for _, kernel, _ in train.values()],
               "tokens_per_step": {name(p): k["batch_size"] * k["block_size"] for p, k in keys.items()},
               "decode": decoding}
    head = (f"CPU: {visible_cores()} visible cores, native bf16 matrix units: {results['cpu_bf16_units'] or 'none'}; "
            f"torch {torch.__version__}; allocator: {allocator}; "
            f"medians of {args.rounds} rounds x {args.steps} steps\n\n")
    emit(head + markdown(results) + bf16_advice(results), results, args)


def bf16_gains(results, config):
    """{threads: bf16 autocast's tokens/s over fp32's} for config, compile off, per thread count timed in both."""
    ms = {(s["dtype"], s["threads"]): s[config] for s in results["train_ms_per_step"] if s["compile"] == "off"}
    return {t: ms["float32", t] / ms["bfloat16", t] for t in sorted({t for _, t in ms})
            if ("float32", t) in ms and ("bfloat16", t) in ms}


def bf16_advice(results):
    """A line per thread count saying whether --dtype=bfloat16 trains the first config faster than fp32 here
    (compile off), for the reader deciding on it: dtype=auto does not (docs/speed.md)."""
    ref = next(iter(results["params"]))
    lines = [f"bf16 autocast trains {ref} at {gain:.2f}x fp32's tokens/s with {t} thread(s): "
             + ("pass --dtype=bfloat16 to gain it" if gain > 1 else "keep float32")
             for t, gain in bf16_gains(results, ref).items()]
    return "\n\n" + "\n".join(lines) if lines else ""


def check_args(args):
    """One line and exit 2 for a bad flag, before any timing."""
    if args.quick:
        args.rounds, args.steps, args.contexts, args.decode_steps, args.compile = 1, 1, "16", 2, "off"
    for flag, allowed in (("dtypes", {"float32", "bfloat16"}), ("compile", {"off", "on"})):
        bad = set(getattr(args, flag).split(",")) - allowed
        if bad:
            fail(f"--{flag}={getattr(args, flag)}: choose from {', '.join(sorted(allowed))}")
    try:
        args.contexts = [int(c) for c in str(args.contexts).split(",")]
        threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        fail("--contexts and --threads are comma-separated integers, e.g. --contexts=256,4096 --threads=1,0")
    if min(args.contexts) < 1 or min(threads) < 0 or min(args.rounds, args.steps, args.decode_steps) < 1:
        fail("--contexts, --rounds, --steps and --decode_steps must be at least 1, --threads at least 0")


if __name__ == "__main__":
    main()
