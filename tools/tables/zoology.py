"""docs/recall.md's tables on Zoology's footing (config/zoology/: a conv layer, the mixer, no MLP): the
softmax anchor's cells (docs/results/zoology/anchor-w<width>-p<pairs>/: 3 seeds, up to 64,000 steps) and
the families' (docs/results/zoology/w<width>-p<pairs>/: seed 1, 16,000 steps), as tools.sweep wrote them:
plan.json, lr/<config>-lr<rate>-s1/ and <config>-s<seed>/, each summary.json and test_eval.json; and
tools.recall's groups over those runs (docs/results/zoology/study/: recall.json and Zoology's figure,
recall.png) beside the older setup's (docs/results/recall/study: no shared convolution, 4,000 steps).
"""
import glob
import math
import os
import re
import statistics

from tools import compare
from tools.tables.mqar import lr_runs, recall_groups, study_cell
from tools.tables.source import fmt_sci, md_table, results_dir
from trainer.rundir import Run

SOLVED = 0.95   # test accuracy that counts as solved (the threshold; Zoology stops at val 0.99)
CELL = re.compile(r"/(anchor-)?w(\d+)-p(\d+)$")
# the families' softmax reference: every other family has 4 query heads, so MHA's row reads the anchor's
# 4-head mha4 (3 seeds), not the families' 1-head mha
REFERENCE = {"mha": "mha4"}


def cells(root, anchor):
    """[(width, pairs, folder)] of the stored anchor sweeps (or the families'), by width then pairs."""
    found = []
    for folder in glob.glob(os.path.join(results_dir(root, "zoology"), "*w*-p*")):
        m = CELL.search(folder)
        if m and bool(m.group(1)) == anchor:
            found.append((int(m.group(2)), int(m.group(3)), folder))
    return sorted(found)


def rate_label(rate):
    """3.2e-3 -> '3.2e-3', 1e-3 -> '1e-3': Zoology's grid has two significant digits."""
    return fmt_sci(rate, 1).replace(".0e", "e")


def grid_cell(summary, chosen):
    """A grid probe: the step it reached stop_val_acc, else its best val accuracy rounded down (0.986 reads
    0.98, so a probe that missed 0.99 never shows it)."""
    reached = summary.get("target_reached_iter")
    text = f"{reached:,}" if reached is not None else f"- ({math.floor(summary['best_val_acc'] * 100) / 100:.2f})"
    return text + (" *" if chosen else "")


def seed_runs(folder, config):
    return [Run(p).results for p in sorted(glob.glob(os.path.join(folder, f"{config}-s*")))]


def cell_table(anchor):
    return lambda root: cells_table(root, anchor)


def cells_table(root, anchor):
    """One row per config and cell: the grid (steps to val accuracy 0.99 per rate, the chosen one starred),
    then each seed's test accuracy, solved k/n and the median step to 0.99 over the seeds that got there."""
    rates, rows = set(), []
    for width, pairs, folder in cells(root, anchor):
        plan_path = os.path.join(folder, "plan.json")
        plan = compare.read_plan(plan_path)["configs"] if os.path.isfile(plan_path) else {}
        for config, probes in lr_runs(folder).items():
            rates |= set(probes)
            chosen = plan.get(config, {}).get("learning_rate")
            runs = seed_runs(folder, config)
            steps = [r["target_reached_iter"] for r in runs if r.get("target_reached_iter") is not None]
            accs = ", ".join(f"{r['test_acc']:.3f}" for r in runs if r.get("test_acc") is not None)
            solved = sum(r.get("test_acc") is not None and r["test_acc"] >= SOLVED for r in runs)
            rows.append((width, pairs, config, probes, chosen, accs or "-",
                         f"{solved}/{len(runs)}" if runs else "-",
                         f"{statistics.median(steps):,.0f}" if steps else "-"))
    grid = sorted(rates)
    head = ["width", "pairs", "config", *(f"lr {rate_label(r)}" for r in grid), "test acc (seeds)",
            f"solved (test acc >= {SOLVED})", "median step to val 0.99"]
    return md_table(head, [[str(w), str(p), c, *(grid_cell(probes[r], r == chosen) if r in probes else ""
                                                 for r in grid), accs, solved, median]
                           for w, p, c, probes, chosen, accs, solved, median in rows])


def families_grid(root):
    """The families' rate grids in one row per config: per cell (width, pairs), each probe's step to val 0.99
    (or '-' and its best val accuracy) in the grid's order, the chosen rate starred; the seeds' accuracies and
    steps are the study table's (study_vs_older)."""
    found = {}   # config -> {(width, pairs): (probes, chosen rate)}
    for width, pairs, folder in cells(root, anchor=False):
        plan_path = os.path.join(folder, "plan.json")
        plan = compare.read_plan(plan_path)["configs"] if os.path.isfile(plan_path) else {}
        for config, probes in lr_runs(folder).items():
            found.setdefault(config, {})[width, pairs] = probes, plan.get(config, {}).get("learning_rate")
    cols = sorted({cell for by_cell in found.values() for cell in by_cell})
    grid = sorted({r for by_cell in found.values() for probes, _ in by_cell.values() for r in probes})

    def cell(entry):
        if entry is None:
            return "-"
        probes, chosen = entry
        return " / ".join(grid_cell(probes[r], r == chosen) if r in probes else "" for r in grid)
    head = ["config", *(f"w{w}, {p} pairs: lr {' / '.join(rate_label(r) for r in grid)}" for w, p in cols)]
    return md_table(head, [[c, *(cell(by_cell.get(col)) for col in cols)] for c, by_cell in sorted(found.items())])


def test_accuracy(root, variant, pairs, width=64):
    """The mean test accuracy of a variant's stored seeds in one cell (mha: the anchor's mha4); None if none."""
    name = REFERENCE.get(variant)
    folder = f"anchor-w{width}-p{pairs}" if name else f"w{width}-p{pairs}"
    runs = seed_runs(os.path.join(results_dir(root, "zoology"), folder), name or variant)
    accs = [r["test_acc"] for r in runs if r.get("test_acc") is not None]
    return statistics.mean(accs) if accs else None


def study_vs_older(root, width=64):
    """A row per config that ran at this width, of tools.recall's groups on Zoology's model
    (docs/results/zoology/study): params, bytes kept, then per pair count the cell and the older setup's
    at the same width (no shared convolution, 4,000 steps; docs/results/recall/study) beside it; the
    chance row last."""
    new, old = recall_groups(root, "zoology"), recall_groups(root, "recall")
    mine = {(g["config"], g["pairs"]): g for g in new if g["width"] in (width, None)}
    older = {(g["config"], g["pairs"]): g for g in old if g["width"] in (width, None)}
    pairs = sorted({g["pairs"] for g in new})
    rows = []
    for c in dict.fromkeys(g["config"] for g in new if g["config"] != "chance" and g["width"] == width):
        first = next(g for (name, _), g in mine.items() if name == c)
        rows.append([c, f"{first['params']:,}", f"{first['bytes_per_seq']:,}",
                     *(study_cell(d.get((c, p))) for p in pairs for d in (mine, older))])
    rows.append(["chance (from the files)", "-", "0", *(study_cell(mine.get(("chance", p))) for p in pairs
                                                         for _ in (0, 1))])
    head = ["config", "params", "bytes kept / sequence"]
    head += [f"{p} pairs{s}" for p in pairs for s in ("", ", older setup")]
    return md_table(head, rows)


TABLES = {"zoology-anchor": cell_table(anchor=True), "zoology-families": families_grid,
          "zoology-study-w64": study_vs_older, "zoology-study-w128": lambda root: study_vs_older(root, 128)}
