"""docs/speed.md's tables: the paired bf16 study's run files (docs/results/dtype256/<config>-s<seed>/:
summary.json, log.jsonl, test_eval.json, read through trainer.rundir) and the CPU benchmarks' JSON as
tools.bench wrote it (docs/results/speed/<suite>.json).
"""
import glob
import json
import os

from tools import compare, stats
from tools.benchmarks import cpu, nanogpt
from tools.tables.source import results_dir

MARGIN = 0.01  # nats: the equivalence margin bf16 must meet against fp32 to become dtype=auto on CPUs


def dtype_runs(root):
    """{config: [(name, results, log)]} of the study's runs (configs <variant>_fp32 and <variant>_bf16)."""
    from trainer.rundir import load_run
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
        with open(os.path.join(results_dir(root, "speed"), f"{suite}.json")) as f:
            return render(json.load(f)).splitlines()
    return table


TABLES = {
    "dtype256-paired": dtype_paired,
    "dtype256-means": dtype_means,
    "speed-cpu": bench("cpu", cpu.markdown),
    "speed-nanogpt": bench("nanogpt", nanogpt.markdown),
}
