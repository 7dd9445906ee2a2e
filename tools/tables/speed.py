"""docs/speed.md's tables: the paired bf16 study's run files (docs/results/dtype256/<config>-s<seed>/:
summary.json, log.jsonl, test_eval.json, read through trainer.rundir) and the CPU benchmarks' JSON as
tools.bench wrote it (docs/results/speed/<suite>.json).
"""
import glob
import json
import os
import statistics
from types import SimpleNamespace

from tools import compare, stats
from tools.benchmarks import cpu, decode, gla, longctx, nanogpt
from tools.tables.source import md_table, results_dir
from trainer.rundir import load_run

MARGIN = 0.01  # nats: the equivalence margin bf16 must meet against fp32 to become dtype=auto on CPUs


def dtype_runs(root):
    """{config: [(name, results, log)]} of the study's runs (configs <variant>_fp32 and <variant>_bf16)."""
    paths = sorted(glob.glob(os.path.join(results_dir(root, "dtype256"), "*-s*")))
    return compare.group_runs([load_run(p) for p in paths])


def dtype_paired(root):
    """Per variant, bf16 minus fp32 in test loss (best.pt, selected on val), paired by seed; Holm over
    the variants."""
    groups = dtype_runs(root)
    variants = sorted({c.rsplit("_", 1)[0] for c in groups})
    diffs = []
    for v in variants:
        loss = {dt: {compare.run_seed(n, s): s["test_loss"] for n, s, _ in groups[f"{v}_{dt}"]}
                for dt in ("fp32", "bf16")}
        seeds = sorted(set(loss["fp32"]) & set(loss["bf16"]))
        diffs.append(stats.paired([loss["bf16"][sd] - loss["fp32"][sd] for sd in seeds], MARGIN))
    return compare.paired_table(dict(zip([f"{v}: bf16 − fp32" for v in variants], stats.verdicts(diffs, MARGIN))))


def dtype_means(root):
    """Each config's test and best val loss, mean ± sd over its seeds (tools.compare's cells)."""
    lines = ["| config | seeds | test loss | best val loss |", "|---|---|---|---|"]
    for config, runs in dtype_runs(root).items():
        st = compare.group_stats(runs)
        lines.append(f"| {config} | {len(runs)} | {compare.fmt_ms(st['test_loss'], '.4f')} | "
                     f"{compare.fmt_ms(st['best_val_loss'], '.4f')} |")
    return lines


def bench(suite, render):
    def table(root):
        return render(load_json(os.path.join(results_dir(root, "speed"), f"{suite}.json"))).splitlines()
    return table


def stored_runs(root, folder, which):
    """A suite's repeated runs of one setting, docs/results/speed/<folder>/<which>_run<n>.json, in order."""
    return [load_json(p) for p in sorted(glob.glob(os.path.join(results_dir(root, "speed"), folder,
                                                                 f"{which}_run*.json")))]


def decode_runs(root, which):
    """The decode suite's runs, docs/results/speed/decode/<which>_run*.json."""
    return stored_runs(root, "decode", which)


def decode_medians(root, folder):
    """{(variant, context): {"before": ms, "after": ms}}: medians over a folder's stored runs of each."""
    times = {}
    for which in ("before", "after"):
        for run in stored_runs(root, folder, which):
            for row in run["variants"]:
                for e in row["decode"]:
                    times.setdefault((row["variant"], e["context"]), {}).setdefault(which, []).append(e["ms_per_token"])
    return {key: {w: statistics.median(ts) for w, ts in cell.items()} for key, cell in times.items()}


def decode_before_after(root, folder="decode", ratio_to=None):
    """Per variant and context, the median over the stored runs of ms/token before and after a change
    (folder decode: the cheaper step, before = commit 2ac2b49; decode_step: the one-token steps, before =
    commit bd63c9b; each timed by the same suite, runs alternating), with its ratio to `ratio_to`'s."""
    median = decode_medians(root, folder)
    variants = list(dict.fromkeys(v for v, _ in median))
    contexts = sorted({c for _, c in median})

    def cell(v, c, w):
        ms = median[v, c][w]
        return f"{ms:.2f}" + (f" ({ms / median[ratio_to, c][w]:.2f})" if ratio_to else "")
    rows = [[v, *(f"{cell(v, c, 'before')} → {cell(v, c, 'after')}" for c in contexts)] for v in variants]
    what = f"ms/token (x {ratio_to})" if ratio_to else "ms/token"
    return md_table(["variant", *(f"{what} after {c:,} tokens: before → after" for c in contexts)], rows)


def decode_gpt2_width(root):
    """The decode suite at 12 layers x 768 once with MLP widths matched to MHA's parameters and once at
    each config's own: ms/token at each context with its ratio to MHA's in the same run."""
    runs = {w: load_json(os.path.join(results_dir(root, "speed"), "decode_step", f"gpt2_width_{w}.json"))
            for w in ("matched", "own")}
    head, rows = ["variant"], {}
    for which, run in runs.items():
        mha = {e["context"]: e["ms_per_token"] for e in run["variants"][0]["decode"]}
        head += [f"{which}: params"] + [f"{which}: ms/token @{c} (x mha)" for c in mha]
        for row in run["variants"]:
            ms = [e["ms_per_token"] for e in row["decode"]]
            rows.setdefault(row["variant"], [row["variant"]]).extend(
                [f"{row['params'] / 1e6:.2f}M"] + [f"{t:.2f} ({t / mha[c]:.2f})" for t, c in zip(ms, mha)])
    return md_table(head, list(rows.values()))


def decode_hf(root):
    """Hugging Face's generate against ours (ms/token over ours) in each stored run, before and after."""
    cells = {w: [f"{r['hf_llama']['hf_over_ours']:.2f}" for r in decode_runs(root, w)] for w in ("before", "after")}
    ratio = {w: statistics.median(float(c) for c in cs) for w, cs in cells.items()}
    return md_table(["code", "HF ms/token over ours, each run", "median"],
                    [[w, ", ".join(cs), f"{ratio[w]:.2f}"] for w, cs in cells.items()])


def decode_compiled(root, path=("decode", "after_compile3.json")):
    """One run of the decode suite with --compile: eager and compiled steps, and Hugging Face's generate."""
    with open(os.path.join(results_dir(root, "speed"), *path)) as f:
        run = json.load(f)
    contexts = ",".join(str(e["context"]) for e in run["variants"][0]["decode"])
    return decode.variants_table(run["variants"], SimpleNamespace(contexts=contexts, compile=True)) + [""] + \
        decode.hf_table(run["hf_llama"])


def load_json(path):
    with open(path) as f:
        return json.load(f)


def allocator(root):
    """The cpu suite run with --allocator=default and =keep, alternating (docs/results/speed/allocator/
    <allocator>_run<n>.json): per config, the kernel's share of a training step and tokens/s, each run."""
    loaded = {a: stored_runs(root, "allocator", a) for a in ("default", "keep")}
    first = loaded["default"][0]
    setting = first["train_ms_per_step"][0]    # the suite's first setting: its kernel counts are of it
    where = f"{setting['dtype']}, {setting['threads']} thread(s)"

    def cells(config, value):
        return " → ".join("; ".join(value(r, config) for r in loaded[a]) for a in ("default", "keep"))
    rows = [[c, cells(c, lambda r, c: f"{r['train_kernel_per_step'][0][c]['page_faults']:,.0f}"),
             cells(c, lambda r, c: f"{r['train_kernel_per_step'][0][c]['sys_ms']:.1f}"),
             cells(c, lambda r, c: f"{r['tokens_per_step'][c] / r['train_ms_per_step'][0][c] * 1e3:,.0f}")]
            for c in first["params"]]
    return md_table(["config", f"page faults / step ({where}): default → keep, each run", "system ms / step",
                     "tokens/s"], rows)


def ratio_to_first(run, i, config):
    """In setting i of a cpu suite run, config's training tokens/s as a multiple of the run's first config's."""
    ms = run["train_ms_per_step"][i]
    return ms[next(iter(run["params"]))] / ms[config]


def before_after(folder):
    """The cpu suite run at a parent commit and at its change, alternating (docs/results/speed/<folder>/
    {before,after}_run<n>.json): per config and setting, tokens/s as a multiple of the first config's
    (MHA's) in the same run, each run, before → after."""
    def table(root):
        runs = {w: stored_runs(root, folder, w) for w in ("before", "after")}
        first = runs["after"][0]
        base = next(iter(first["params"]))
        settings = range(len(first["train_ms_per_step"]))
        rows = [[c, *(" → ".join("; ".join(f"{ratio_to_first(r, i, c):.2f}" for r in runs[w])
                                 for w in ("before", "after")) for i in settings)] for c in first["params"]]
        heads = [f"{s['dtype']}, {s['threads']} thread(s): x {base}, each run, before → after"
                 for s in first["train_ms_per_step"]]
        return md_table(["config", *heads], rows)
    return table


def repeated(folder):
    """The cpu suite run several times in a row (docs/results/speed/<folder>/cpu_run<n>.json): per config
    and setting, tokens/s as a multiple of the first config's (MHA's) in the same run, each run, and the
    median over the runs."""
    def table(root):
        runs = stored_runs(root, folder, "cpu")
        first = runs[0]
        settings = first["train_ms_per_step"]

        def cell(i, config):
            ratios = [ratio_to_first(run, i, config) for run in runs]
            return "; ".join(f"{r:.2f}" for r in ratios) + f" ({statistics.median(ratios):.2f})"
        heads = [f"{s['dtype']}, compile {s['compile']}, {s['threads']} thread(s): x {next(iter(first['params']))}, "
                 "each run (median)" for s in settings]
        return md_table(["config", *heads], [[c, *(cell(i, c) for i in range(len(settings)))] for c in first["params"]])
    return table


def bf16_gain_before_after(root):
    """The cpu suite at the commit before softmax attention ran in fp32 under CPU autocast and at it,
    alternating (docs/results/speed/bf16_softmax/{before,after}_run<n>.json): per config and thread
    count, bf16's tokens/s as a multiple of fp32's in the same run, each run, before → after."""
    runs = {w: stored_runs(root, "bf16_softmax", w) for w in ("before", "after")}
    first = runs["after"][0]
    threads = list(cpu.bf16_gains(first, next(iter(first["params"]))))
    rows = [[c, *(" → ".join("; ".join(f"{cpu.bf16_gains(r, c)[t]:.2f}" for r in runs[w]) for w in ("before", "after"))
                  for t in threads)] for c in first["params"]]
    return md_table(["config", *(f"bf16 over fp32 tokens/s, {t} thread(s), each run: before → after"
                                 for t in threads)], rows)


def ops_before_after(root):
    """The ops suite at a parent commit and at its change (docs/results/speed/ops/{before,after}.json):
    per config, ATen ops and ms inside them per attention layer step, before → after."""
    runs = [load_json(os.path.join(results_dir(root, "speed"), "ops", f"{w}.json")) for w in ("before", "after")]
    rows = [[c, " → ".join(f"{r['layers'][c]['ops_per_step']:,.0f}" for r in runs),
             " → ".join(f"{r['layers'][c]['ms_in_ops']:.1f}" for r in runs)] for c in runs[1]["layers"]]
    return md_table(["config", "ATen ops per step: before → after", "ms in ops per step"], rows)


def delta_chunk(root):
    """The longctx suite at each delta_chunk (docs/results/speed/delta_chunk/chunk<C>.json): training
    tokens/s per variant, chunk length and sequence length."""
    paths = glob.glob(os.path.join(results_dir(root, "speed"), "delta_chunk", "chunk*.json"))
    runs = sorted((int(os.path.basename(p)[len("chunk"):-len(".json")]), load_json(p)) for p in paths)
    lens = [t["T"] for t in runs[0][1][0]["train"]]
    rows = [[r["variant"], str(chunk), *(longctx.cell(e, "tokens_per_sec", ",.0f") for e in r["train"])]
            for variant in [r["variant"] for r in runs[0][1]]
            for chunk, run in runs for r in run if r["variant"] == variant]
    return md_table(["variant", "delta_chunk", *(f"train tok/s T={t:,}" for t in lens)], rows)


def linear_in_t(root):
    """The longctx suite's training rows (docs/results/speed/linear_in_t.json): tokens/s per length and the
    ratio of the longest length's to the shortest's (1.0: cost linear in T; 1/16 from 256 to 4,096:
    quadratic)."""
    rows = load_json(os.path.join(results_dir(root, "speed"), "linear_in_t.json"))
    lens = [t["T"] for t in rows[0]["train"]]
    return md_table(["variant", *(f"train tok/s T={t:,}" for t in lens), f"T={lens[-1]:,} / T={lens[0]:,}"],
                    [[f"{r['variant']} ({r['attention']})",
                      *(longctx.cell(e, "tokens_per_sec", ",.0f") for e in r["train"]),
                      f"{r['train'][-1]['tokens_per_sec'] / r['train'][0]['tokens_per_sec']:.2f}"] for r in rows])


TABLES = {
    "dtype256-paired": dtype_paired,
    "dtype256-means": dtype_means,
    "speed-cpu": bench("cpu", cpu.markdown),
    "speed-cpu-xeon": bench("cpu_xeon", cpu.markdown),
    "speed-nanogpt": bench("nanogpt", nanogpt.markdown),
    "speed-nanogpt-learned": bench("nanogpt_learned", nanogpt.markdown),
    "speed-nanogpt-compile": bench("nanogpt_compile", nanogpt.markdown),
    "speed-nanogpt-bf16-compile": bench("nanogpt_bf16_compile", nanogpt.markdown),
    "speed-nanogpt-bf16": bench("nanogpt_bf16", nanogpt.markdown),
    "speed-bf16-softmax": bf16_gain_before_after,
    "speed-cpu-compile": bench("cpu_compile", cpu.markdown),
    "speed-cpu-delta": bench("cpu_delta", cpu.markdown),
    "speed-cpu-delta-pass-before": bench("cpu_delta_pass_before", cpu.markdown),
    "speed-cpu-delta-pass-after": bench("cpu_delta_pass_after", cpu.markdown),
    "speed-delta-ops": before_after("delta_ops"),
    "speed-compile-runs": repeated("compile_runs"),
    "speed-delta-chunk": delta_chunk,
    "speed-ops": ops_before_after,
    "speed-decode": decode_before_after,
    "speed-decode-step": lambda root: decode_before_after(root, "decode_step", ratio_to="mha"),
    "speed-decode-gpt2-width": decode_gpt2_width,
    "speed-decode-step-compiled": lambda root: decode_compiled(root, ("decode_step", "compiled.json")),
    "speed-decode-compiled": decode_compiled,
    "speed-decode-hf": decode_hf,
    "speed-allocator": allocator,
    "speed-gla-paths": bench("gla_paths", lambda run: gla.paths_markdown(run["paths"])),
    "speed-linear-in-t": linear_in_t,
}
