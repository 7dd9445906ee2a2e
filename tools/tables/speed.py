"""docs/speed.md's tables: the paired bf16 study's run files (docs/results/dtype256/<config>-s<seed>/:
summary.json, log.jsonl, test_eval.json, read through trainer.rundir) and the CPU benchmarks' JSON as
tools.bench wrote it (docs/results/speed/<suite>.json).
"""
import glob
import json
import os
import statistics

from tools import compare, stats
from tools.benchmarks import cpu, longctx, nanogpt
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


def bench(suite, render):
    def table(root):
        return render(load_json(os.path.join(results_dir(root, "speed"), f"{suite}.json"))).splitlines()
    return table


def stored_runs(root, folder, which):
    """A suite's repeated runs of one setting, docs/results/speed/<folder>/<which>_run<n>.json, in order."""
    return [load_json(p) for p in sorted(glob.glob(os.path.join(results_dir(root, "speed"), folder,
                                                                 f"{which}_run*.json")))]


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
    # the page faults and system time per step stay in cpu.json (and the suite's own output), not in speed.md
    "speed-cpu": bench("cpu", lambda r: cpu.markdown({k: v for k, v in r.items() if k != "train_kernel_per_step"})),
    "speed-nanogpt": bench("nanogpt", nanogpt.markdown),
    "speed-nanogpt-bf16": bench("nanogpt_bf16", nanogpt.markdown),
    "speed-compile-runs": repeated("compile_runs"),
    "speed-linear-in-t": linear_in_t,
}
