"""docs/recall.md's tables: the recall study's run files as tools.recall's sweeps wrote them
(docs/results/recall/<sweep>/: summary.json, test_eval.json, plan.json, read through trainer.rundir.Run),
and tools.reach's counts of the pairs each pattern leaves out of reach (docs/results/recall/reach).
"""
import glob
import json
import os

from attention import VARIANTS
from tools import compare, recall
from tools.tables.source import fmt_sci, md_table, model_of, results_dir
from trainer.rundir import Run

VARIANTS_ORDER = list(VARIANTS)


def registry_order(summary):
    """Sort key of a run: its attention in the registry's order (a per-layer plan after its first layer's
    variant alone)."""
    plan = summary["attention"].split(",")
    return VARIANTS_ORDER.index(plan[0]), len(set(plan))


def lr_runs(folder):
    """{config: {learning rate: the probe's summary}} of a sweep's lr/<config>-lr<rate>-s<seed> folders,
    configs in the registry's order of their attention, rates ascending."""
    runs = {}
    for path in glob.glob(os.path.join(folder, "lr", "*")):
        summary = Run(path).summary
        runs.setdefault(os.path.basename(path).rsplit("-lr", 1)[0], {})[summary["learning_rate"]] = summary
    order = sorted(runs, key=lambda c: (registry_order(next(iter(runs[c].values()))), c))
    return {c: dict(sorted(runs[c].items())) for c in order}


def probe_cell(summary):
    """A probe's best val accuracy, and the step it reached stop_val_acc where it did."""
    reached = summary.get("target_reached_iter")
    return f"{summary['best_val_acc']:.3f}" + (f", {summary['stop_val_acc']:g} at step {reached:,}"
                                                if reached is not None else "")


def tune_status(root):
    """The tuning grid (docs/results/recall/tune-w64-t64-p4): best val accuracy per config and rate, the
    rate the sweep chose marked once its plan.json is stored. The grid runs each config's rates in turn,
    so a config with some rates missing is running the first missing one."""
    folder = os.path.join(results_dir(root, "recall"), "tune-w64-t64-p4")
    probes = lr_runs(folder)
    plan_path = os.path.join(folder, "plan.json")   # the sweep writes it once every probe has run
    chosen = ({c: v["learning_rate"] for c, v in compare.read_plan(plan_path)["configs"].items()}
              if os.path.isfile(plan_path) else {})
    grid = sorted({lr for runs in probes.values() for lr in runs})   # every rate some family has run
    rows = []
    for config, runs in probes.items():
        cells = [probe_cell(runs[lr]) + (" (chosen)" if chosen.get(config) == lr else "") if lr in runs else ""
                 for lr in grid]
        if "" in cells:
            cells[cells.index("")] = "(running)"
        rows.append([config, *cells])
    return md_table(["config", *map(fmt_sci, grid)], rows)


def reach(root):
    """tools.reach's counts (docs/results/recall/reach/reach.json) for the configs whose pattern limits
    some query in some cell (tools.recall.limits), cells as columns."""
    with open(os.path.join(results_dir(root, "recall"), "reach", "reach.json")) as f:
        rows = json.load(f)
    cells = list(dict.fromkeys((r["row_len"], r["pairs"]) for r in rows))
    by = {(r["config"], r["row_len"], r["pairs"]): r for r in rows}
    configs = [c for c in dict.fromkeys(r["config"] for r in rows) if any(recall.limits(by[(c, *k)]) for k in cells)]
    return md_table(["config", *(f"{t} tokens, {p} pairs" for t, p in cells)],
                    [[c, *(recall.reach_cell(by[(c, *k)]) for k in cells)] for c in configs])


def recall_groups(root, study, folder="study"):
    """tools.recall's groups as stored: docs/results/<study>/<folder>/recall.json."""
    with open(os.path.join(results_dir(root, study), folder, "recall.json")) as f:
        return json.load(f)


def study_cell(g):
    """One config in one cell of the study: accuracy [interval] (seeds), solved k/n, median step to stop_val_acc."""
    if g is None or g["acc"] is None:
        return "-"
    if g["config"] == "chance":
        return f"{g['acc']:.3f}"
    lo, hi = g["acc_interval"]
    text = f"{g['acc']:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if g["n"] > 1 else "") + f"; {g['solved']}/{g['n']}"
    return text + (f"; step {g['steps']:,.0f}" if g["steps"] is not None else "") + recall.rate_note(g)


def reach_cost(root):
    """What a sparse pattern costs the trained runs (the study's recall.json, reach kept from their
    checkpoints): per config, width and cell where the pattern leaves some pair out, the share of queries
    in each class and the runs' accuracy on it."""
    groups = [g for g in recall_groups(root, "recall") if recall.limits(g.get("reach")) and "acc_direct" in g["reach"]]

    def share_acc(r, share, acc):
        return "-" if r[acc] is None else f"{share:.3f}: {r[acc]:.3f}"   # None: no query of that class
    return md_table(["config", "width", "cell", "test accuracy", "read directly: share, accuracy",
                     "in the field only", "outside the field", "ceiling"],
                    [[g["config"], g["width"], f"{g['row_len']} tokens, {g['pairs']} pairs", f"{g['acc']:.3f}",
                      share_acc(g["reach"], g["reach"]["direct"], "acc_direct"),
                      share_acc(g["reach"], g["reach"]["field"] - g["reach"]["direct"], "acc_indirect"),
                      share_acc(g["reach"], 1 - g["reach"]["field"], "acc_outside"),
                      f"{g['reach']['ceiling']:.3f}"] for g in groups])


# docs/linear.md's 2 x 2 at 64 tokens, 4 pairs, width 64, seed 1: {add and decay, the delta rule} x {no
# convolution over time, 4 taps}; each stored sweep folder and the configs it holds, a row per run
CONV_RUNS = {"tune-w64-t64-p4": ("gla", "deltanet", "gated_deltanet"),
             "noconv-w64-t64-p4": ("deltanet_noconv", "gated_deltanet_noconv"),
             "noconv-lr3e-3-w64-t64-p4": ("deltanet_noconv", "gated_deltanet_noconv"),
             "glaconv-lr0.001-w64-t64-p4": ("gla_conv",),
             "glaconv-lr0.003-w64-t64-p4": ("gla_conv",),
             "glaconv-lr0.01-w64-t64-p4": ("gla_conv",)}


def conv_ablation(root):
    """The runs of CONV_RUNS: state update, taps of the convolution over time, bytes kept after one row,
    learning rate, test accuracy and the step val accuracy reached stop_val_acc; rows by (taps, update)."""
    rows = []
    for folder, configs in CONV_RUNS.items():
        for config in configs:
            s = Run(os.path.join(results_dir(root, "recall"), folder, f"{config}-s1")).results
            m = model_of(f"config/recall/{config}.py")
            cfg = m.config
            taps = cfg.gla_conv if cfg.attention == "gla" else cfg.delta_conv if cfg.delta_conv > 1 else 0
            reached = s.get("target_reached_iter")
            rows.append([config, "delta rule" if "delta" in cfg.attention else "add and decay",
                         taps or "none", f"{recall.bytes_kept(m, 64):,}",
                         fmt_sci(s["learning_rate"]), f"{s['test_acc']:.3f}", f"{reached:,}" if reached else "-"])
    rows.sort(key=lambda r: (r[2] != "none", r[1], r[0], float(r[4])))
    return md_table(["config", "state update", "conv taps", "bytes kept / sequence", "learning rate",
                     "test accuracy", "val 0.99 at step"], rows)


TABLES = {
    "recall-reach": reach,
    "recall-conv": conv_ablation,
}
