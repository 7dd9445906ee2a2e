"""Tables of the studies whose run files are stored: docs/results/<study>/<config>-s<seed>/ (summary.json,
log.jsonl, test_eval.json as tools.sweep wrote them), <study>/plan.json and evaluation JSON (tools.eval
--json). They land with `python -m tools.tables.store SWEEP_DIR STUDY [EVAL_JSON ...]`.

Each table is tools.compare's (the runs, paired differences, the plan) over the stored runs, so a
table here reads exactly as `python -m tools.compare` prints it from the sweep's folder.
"""
import glob
import json
import os

from tools import compare, stats
from tools.tables.source import md_table, results_dir
from trainer.rundir import load_run

MARGIN = 0.01   # nats: tools.compare's default equivalence margin, the studies' one margin


def groups_of(root, study, configs):
    """{config: [(name, summary, log)]} of the stored runs, in the order of configs (the first: the reference)."""
    found = compare.group_runs([load_run(p) for p in sorted(glob.glob(os.path.join(results_dir(root, study), "*-s*")))])
    return {c: found[c] for c in configs}


def runs_table(study, configs):
    def table(root):
        groups = groups_of(root, study, configs)
        st = {c: compare.group_stats(runs) for c, runs in groups.items()}
        ref = configs[0]
        return compare.runs_header(ref) + [compare.table_row(c, s, compare.delta_cell(c, s, ref, st[ref]))
                                           for c, s in st.items()]
    return table


def paired_table(study, configs, metric):
    """Each config after the first against the first, paired by seed, on metric (test or best_val), Holm
    over the rows."""
    def table(root):
        groups = groups_of(root, study, configs)
        return compare.paired_table(compare.paired_rows(groups, compare.METRICS[metric], MARGIN))
    return table


def steps_table(study, steps, metric):
    """Rung against rung: each (lower, upper, what changes) as upper minus lower, paired by seed on metric
    (test or best_val), Holm over the steps."""
    def table(root):
        configs = list(dict.fromkeys(c for lower, upper, _ in steps for c in (lower, upper)))
        by_seed = {c: compare.values_by_seed(runs, compare.METRICS[metric])
                   for c, runs in groups_of(root, study, configs).items()}
        diffs = [[by_seed[upper][sd] - by_seed[lower][sd] for sd in sorted(set(by_seed[upper]) & set(by_seed[lower]))]
                 for lower, upper, _ in steps]
        rows = stats.verdicts([stats.paired(d, MARGIN) for d in diffs], MARGIN)
        return md_table(["step", "pairs", "Δ [95% CI]", "p (Holm)", "verdict"],
                        [[f"{upper} − {lower} ({what})", r["n"], stats.fmt_delta(r["mean"], r["ci95"]),
                          f"{r['p_holm']:.2g}", r["verdict"]] for (lower, upper, what), r in zip(steps, rows)])
    return table


def plan_table(study):
    """The sweep's plan.json (budget matching, lr grid, the rate chosen) with each config's parameters."""
    def table(root):
        with open(os.path.join(results_dir(root, study), "plan.json")) as f:
            configs = json.load(f)["configs"]
        params = {c: runs[0][1].get("params") for c, runs in groups_of(root, study, list(configs)).items()}
        return compare.plan_table({c: {**e, "params": params[c]} for c, e in configs.items()})
    return table


def window_bound(study, eval_file):
    """tools.eval --window rows: per run, the loss under the window minus the loss as trained, paired by
    seed over the runs (the most the window costs weights not trained for it)."""
    def table(root):
        with open(os.path.join(results_dir(root, study), eval_file)) as f:
            rows = json.load(f)
        full = {(r["run"], r["length"]): r["test_loss"] for r in rows if "window" not in r}
        windowed = [r for r in rows if "window" in r]
        as_trained = [full[r["run"].split(" [window")[0], r["length"]] for r in windowed]   # the same run, all keys
        d = stats.verdicts([stats.paired([r["test_loss"] - a for r, a in zip(windowed, as_trained)], MARGIN)],
                           MARGIN)[0]
        w, length = windowed[0]["window"], windowed[0]["length"]
        mean = sum(as_trained) / len(as_trained)
        return md_table(["evaluated at", "runs", "test loss, all keys (mean)", f"window of {w} keys minus all keys",
                         "verdict"],
                        [[f"{length} tokens", len(windowed), f"{mean:.4f}", stats.fmt_delta(d["mean"], d["ci95"]),
                          d["verdict"]]])
    return table


FLOPS = ["mha", "mla", "bigbird", "gla"]
DELTA = ["mha", "gla", "deltanet", "gated_deltanet", "gdn_mha"]
TABLES = {
    "cache256-paired-test": paired_table("cache256", ["mla", "mqa", "gqa"], "test"),
    "flops256-causal-paired-test": paired_table("flops256-causal", FLOPS, "test"),
    "sparse512-window": window_bound("sparse512-window", "eval_window.json"),
    "ladder256-delta-paired-test": paired_table("ladder256_delta", DELTA, "test"),
    "fair256-fox-nsa-paired-test": paired_table("fair256_fox_nsa", ["mha", "fox", "nsa"], "test"),
    "flops256-fox-nsa-paired-test": paired_table("flops256_fox_nsa", ["mha", "fox", "nsa"], "test"),
}
