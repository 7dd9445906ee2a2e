"""The recall study's table and figure: MQAR accuracy per cell against the bytes each variant keeps.

    python -m tools.recall sweeps/recall/*/*-s? --out sweeps/recall

Zoology's question (Arora et al. 2023): attention keeps every key and should recall at any number
of pairs; a fixed state must grow with them. Runs are train.py out_dirs on MQAR datasets
(data/mqar/prepare.py), grouped by config name (the -s<seed> suffix dropped, as tools.compare
does), model width (n_embd) and cell: the row length and number of pairs of the run's dataset
(the meta.json record in its checkpoint). A run folder kept without checkpoints (summary.json and
test_eval.json, as docs/results/ keeps them) is read from its summary's settings and its dataset's
meta.json instead, so runs of several sessions combine. Per group:
  accuracy  test accuracy of best.pt (selected on val; the sweep's test_eval.json), mean and 95% t
            interval over seeds (min-max below 3 seeds); the best val accuracy where a run has no
            test evaluation
  solved    the seeds whose accuracy reaches --solved (0.95): a run either forms the recall circuit
            or plateaus, so the mean of a few seeds hides a count worth reading
  steps     steps to solve: how many seeds reached stop_val_acc (val accuracy, e.g. 0.99) and the
            median of their first evaluation there (summary.json target_reached_iter)
  Δ         accuracy minus the first config's in the same cell and width, paired over the seeds
            both have: mean and 95% t interval (tools.stats; at least 2 shared seeds)
  bytes     what the variant keeps per sequence after one row: its cache in bf16
            (GPT.cache_elems_per_seq at the row length) plus its constant state in fp32
  reach     tools/reach.py's counts over the test rows, for the configs whose pattern leaves some
            query's pair out (field / direct read / accuracy ceiling); MoBA's from the blocks its
            trained forward chose; and what that costs a trained run, its accuracy on the queries of
            each class (a run with its checkpoint; written to the run's reach.json, which a folder
            kept without checkpoints is read from), averaged over seeds
A seed run at several learning rates in one cell (a rate that failed, then a lower one) counts once:
the run of its best val accuracy (selection on val, the report on test), its rate named in the cell.
A chance row per cell: guessing uniformly among the row's values, computed from the dataset's files
(1/P in Zoology's layout, where no answer is ever in the input). recall.md (one table per width),
recall.json (one object per group) and recall.png (accuracy against bytes kept, one panel per cell,
one curve per config across widths: Zoology's figure) go to --out.
"""
import json
import os
import statistics
import sys

import numpy as np

from model import GPT, GPTConfig
from tools import compare, reach, stats
from tools.scorecard import check_out, write_outputs
from trainer.checkpoint import CheckpointError, WriteError
from trainer.cli import OneLineParser, fail
from trainer.rundir import REACH, Run, RunError, write_json_atomic

SOLVED = 0.95   # the accuracy a seed counts as solved at (--solved)


def run_row(run_dir):
    """One MQAR run: {config, width, cell (row length, pairs), seed, acc, metric, steps, bytes, params, data}."""
    run = Run(run_dir)
    summary = run.results
    settings = summary.get("settings") or {}
    data = os.path.join(settings.get("data_dir", "data"), summary.get("dataset") or "")   # the dataset's folder
    trained = os.path.isfile(run.checkpoint_path())
    if trained:
        (model, _), meta = run.load_model("cpu"), run.meta
    else:
        model, meta = kept_model(summary, data, run_dir)
    mqar = meta.get("mqar")
    if not mqar:
        raise RunError(f"{run_dir} was not trained on an MQAR dataset (no mqar record in its meta.json); "
                       "give runs of data/mqar/prepare.py datasets")
    key = "test_acc" if summary.get("test_acc") is not None else "best_val_acc"
    row_len = model.config.block_size
    return {"config": compare.config_name(run.name), "width": model.config.n_embd,
            "cell": (row_len, mqar["num_pairs"]), "seed": summary.get("seed"), "acc": summary.get(key),
            "metric": key, "steps": summary.get("target_reached_iter"),
            "val_acc": summary.get("best_val_acc"), "lr": summary.get("learning_rate"),
            "bytes": bytes_kept(model, row_len),
            "params": model.num_params(), "data": data,
            "reach": run_reach(run_dir, model, data, row_len, trained)}


def bytes_kept(model, row_len):
    """What the model keeps per sequence after a row: its cache in bf16 plus its constant state in fp32."""
    return model.cache_elems_per_seq(row_len) * 2 + model.cache_state_elems() * 4


def run_reach(run_dir, model, data, row_len, trained):
    """tools.reach's counts over the test rows (None without them). A trained run is counted with its
    accuracy per class of query (what its pattern costs it), and a content-chosen pattern (MoBA) from
    the blocks its forward chose; where content chooses or the pattern leaves some pair out (limits),
    that is written to the run's reach.json, where a folder kept without checkpoints finds it again."""
    kept = os.path.join(run_dir, REACH)
    if not trained and os.path.isfile(kept):
        with open(kept) as f:
            return json.load(f)
    if not has_split(data, "test"):
        return None
    counts = reach.reach(model, data, row_len, observe=trained, accuracy=trained)
    if trained and (limits(counts) or reach.layer_patterns(model, row_len) is None):
        write_json_atomic(counts, kept)
    return counts


def kept_model(summary, data, run_dir):
    """(model with random weights, the dataset's meta.json) of a run kept without checkpoints (its
    summary.json and test_eval.json, as tools.tables.store keeps them in docs/results): the model from
    summary.json's settings (its patterns and formulas are all this needs), the meta from the dataset's
    folder `data`, which data/mqar/prepare.py writes again alike from the same flags. The settings
    hold every key's value as the run used it (a window, a block pattern, its seed), read as a
    checkpoint's are (GPTConfig.from_dict); the parameter count must be the summary's, so that a key
    this code no longer reads the same way cannot give another model's bytes unnoticed. (FLOPs are no
    such check: their formula has changed since some runs.)"""
    meta_path = os.path.join(data, "meta.json")
    if not os.path.isfile(meta_path):
        raise RunError(f"{run_dir} has no checkpoint and its dataset's {meta_path} is missing: prepare the "
                       "dataset again (data/mqar/prepare.py, the command in docs/recall.md)")
    with open(meta_path) as f:
        meta = json.load(f)
    # read as a checkpoint's config is; built on the CPU, not the meta device: BigBird draws its layout
    # (from sparse_seed) only there
    model = GPT(GPTConfig.from_dict({**(summary.get("settings") or {}), "vocab_size": meta["vocab_size"]}))
    if model.num_params() != summary.get("params"):
        raise RunError(f"{run_dir}: the model of its settings has {model.num_params():,} parameters, its summary.json "
                       f"{summary.get('params')}; give the run folder with its checkpoint")
    return model, meta


def has_split(folder, split):
    return all(os.path.exists(os.path.join(folder, f"{split}{s}")) for s in (".bin", ".targets.bin"))


def chance_from_files(folder, row_len):
    """Mean over the counted queries of the test (else val) split of 1 / (distinct values of the query's
    row): guessing among the row's values. None when the files are not there."""
    for split in ("test", "val"):
        if has_split(folder, split):
            y = np.fromfile(os.path.join(folder, f"{split}.targets.bin"), dtype=np.int32).reshape(-1, row_len)
            counted = y != -1
            distinct = np.array([len(set(row[c].tolist())) for row, c in zip(y, counted)])
            return float((counted.sum(1) / distinct).sum() / counted.sum())
    return None


def interval(values):
    """(lo, hi): the 95% t interval of the mean from 3 seeds on, cut to accuracy's range [0, 1] (seeds that
    split between solved and chance spread the t interval past both ends), else min-max; None without values."""
    if len(values) >= 3:
        lo, hi = stats.paired(values, 0.0)["ci95"]
        return max(lo, 0.0), min(hi, 1.0)
    return (min(values), max(values)) if values else None


def select_on_val(rows):
    """One run per config, width, cell and seed: where a seed ran at several learning rates (a rate that
    failed, then a lower one), the run of the best val accuracy (ties: the first given). Each kept row
    records how many distinct rates its seed tried; the test accuracy plays no part in the choice."""
    best, rates = {}, {}
    for r in rows:
        key = (r["config"], r["width"], r["cell"], r["seed"])
        rates.setdefault(key, set()).add(r["lr"])
        if key not in best or (r["val_acc"] or 0.0) > (best[key]["val_acc"] or 0.0):
            best[key] = r
    return [{**r, "rates_tried": len(rates[key])} for key, r in best.items()]


def group_rows(rows, solved=SOLVED):
    """[{config, width, row_len, pairs, n, acc, acc_interval, solved, steps, delta, delta_ci95, metric,
    bytes_per_seq, params, learning_rates}] in order of appearance, a seed's rates chosen on val
    (select_on_val); delta is paired against the first config in the same cell and width."""
    rows = select_on_val(rows)
    groups = {}
    for r in rows:
        groups.setdefault((r["config"], r["width"], r["cell"]), []).append(r)
    reference = rows[0]["config"]
    out = []
    for (config, width, cell_key), runs in groups.items():
        accs = {r["seed"]: r["acc"] for r in runs if r["acc"] is not None}
        ref = {r["seed"]: r["acc"] for r in groups.get((reference, width, cell_key), []) if r["acc"] is not None}
        paired = None if config == reference else stats.paired([accs[s] - ref[s] for s in accs if s in ref], 0.01)
        steps = [r["steps"] for r in runs if r["steps"] is not None]
        values = list(accs.values())
        out.append({"config": config, "width": width, "row_len": cell_key[0], "pairs": cell_key[1],
                    "n": len(values), "acc": compare.mean_std(values)[0], "acc_interval": interval(values),
                    "solved": sum(a >= solved for a in values),
                    "steps": statistics.median(steps) if steps else None, "reached": len(steps),
                    "delta": paired and paired["mean"], "delta_ci95": paired and list(paired["ci95"]),
                    "metric": sorted({r["metric"] for r in runs}), "bytes_per_seq": runs[0]["bytes"],
                    "params": runs[0]["params"], "reach": mean_reach([r["reach"] for r in runs]),
                    "learning_rates": sorted({r["lr"] for r in runs if r["lr"] is not None}),
                    "rates_tried": max(r["rates_tried"] for r in runs)})
    return out


def chance_rows(rows):
    """One "chance" group per cell, from the first run's dataset files."""
    out = {}
    for r in rows:
        if r["cell"] not in out:
            out[r["cell"]] = {"config": "chance", "width": None, "row_len": r["cell"][0], "pairs": r["cell"][1],
                              "acc": chance_from_files(r["data"], r["cell"][0])}
    return [g for g in out.values() if g["acc"] is not None]


def cell(g):
    """One config in one cell: mean [interval] (n), solved k/n, median steps, and Δ [95% CI]."""
    if g is None or g["acc"] is None:
        return "-"
    if g["config"] == "chance":
        return f"{g['acc']:.3f}"
    lo_hi = g["acc_interval"]
    text = f"{g['acc']:.3f}" + (f" [{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]" if g["n"] > 1 else "")
    text += f" (n={g['n']}); solved {g['solved']}/{g['n']}"
    if g["steps"] is not None:
        text += f"; stop_val_acc reached by {g['reached']}/{g['n']}, median step {g['steps']:,.0f}"
    if g["delta"] is not None:
        text += f"; Δ {stats.fmt_delta(g['delta'], g['delta_ci95'], 3)}"
    return text + rate_note(g)


def rate_note(g):
    """Where a seed tried more than one rate: the rate val chose."""
    if g.get("rates_tried", 1) < 2:
        return ""
    return f"; at {'/'.join(f'{lr:g}' for lr in g['learning_rates'])} (chosen on val of {g['rates_tried']} rates)"


def mean_reach(reaches):
    """The seeds' reach averaged (a fixed pattern's is the same for every seed; MoBA's, observed, is not;
    an accuracy None where some seed lacks it); content-chosen (None values) when any seed has no
    observation; None without files."""
    known = [r for r in reaches if r is not None]
    unobserved = [r for r in known if r["field"] is None]
    if not known or unobserved:
        return unobserved[0] if unobserved else None
    keys = dict.fromkeys(k for r in known for k in r)
    return {k: statistics.fmean(r[k] for r in known) if all(r.get(k) is not None for r in known) else None
            for k in keys}


def reach_cell(r):
    if r is None:
        return "-"
    return "content-chosen" if r["field"] is None else f"{r['field']:.3f} / {r['direct']:.3f} / {r['ceiling']:.3f}"


def limits(r):
    """A reach (tools/reach.py) that leaves some query's pair out of the field or of a direct read, or that
    content decides; False for None (no files to count on)."""
    return r is not None and (r["field"] is None or min(r["field"], r["direct"]) < 1)


def cost_cell(r):
    """A trained run's accuracy on its direct / in-field-only / outside queries ('-' for an empty class)."""
    if r is None or "acc_direct" not in r:
        return "-"
    return " / ".join("-" if r.get(k) is None else f"{r[k]:.3f}" for k in ("acc_direct", "acc_indirect", "acc_outside"))


def reach_table(configs, mine, cells):
    """The configs whose pattern limits some query in some cell (limits): the counts, then what the
    trained runs scored on each class of query."""
    short = [c for c in configs if any(limits((mine.get((c, t, p)) or {}).get("reach")) for t, p in cells)]
    if not short:
        return []
    head = ["| config | " + " | ".join(f"{t} tokens, {p} pairs" for t, p in cells) + " |",
            "|" + "---|" * (1 + len(cells))]

    def rows(fmt):
        return [f"| {c} | " + " | ".join(fmt((mine.get((c, t, p)) or {}).get("reach")) for t, p in cells) + " |"
                for c in short]
    return (["Queries the pattern lets reach their pair (tools.reach: field / direct / ceiling):", "", *head,
             *rows(reach_cell), "", "What that costs the trained runs: accuracy on the queries read directly / "
             "in the field only / outside it (from checkpoints; '-': none of that class or no checkpoint):", "",
             *head, *rows(cost_cell), ""])


def width_rows(groups, chance, width, cells, fmt=cell):
    """The rows of one width's table: [config, params, bytes kept, fmt(group) per cell] per config in
    order of appearance, the chance row last (fmt(None) where a config lacks a cell)."""
    mine = {(g["config"], g["row_len"], g["pairs"]): g for g in groups if g["width"] == width}
    by_cell = {(g["row_len"], g["pairs"]): g for g in chance}
    rows = []
    for c in dict.fromkeys(g["config"] for g in groups if g["width"] == width):
        first = next(g for g in mine.values() if g["config"] == c)
        rows.append([c, f"{first['params']:,}", f"{first['bytes_per_seq']:,}",
                     *(fmt(mine.get((c, t, p))) for t, p in cells)])
    return rows + [["chance (from the files)", "-", "0", *(fmt(by_cell.get(k)) for k in cells)]]


def markdown(groups, chance, solved=SOLVED):
    cells = sorted({(g["row_len"], g["pairs"]) for g in groups})
    lines = []
    for width in sorted({g["width"] for g in groups}):
        rows = width_rows(groups, chance, width, cells)
        lines += [f"Width {width}:", "",
                  "| config | params | bytes kept / sequence (cache bf16 + state fp32) | "
                  + " | ".join(f"{t} tokens, {p} pairs" for t, p in cells) + " |",
                  "|" + "---|" * (3 + len(cells))]
        lines += ["| " + " | ".join(row) + " |" for row in rows] + [""]
        mine = {(g["config"], g["row_len"], g["pairs"]): g for g in groups if g["width"] == width}
        lines += reach_table([row[0] for row in rows[:-1]], mine, cells)
    metrics = sorted({m for g in groups for m in g["metric"]})
    lines += [f"Accuracy: {', '.join(metrics)} of best.pt, mean [95% t interval from 3 seeds, cut to [0, 1]; "
              f"min-max below] (n seeds); solved: seeds at accuracy >= {solved:g}; stop_val_acc: the seeds whose val "
              "accuracy reached it and the median step they did; "
              f"Δ: minus {groups[0]['config']}'s in the same cell and width, paired over shared seeds (95% t "
              "interval). Bytes: cache (bf16) after one row plus constant state (fp32), from the model's formulas. "
              "Chance: guessing among the row's values, from the dataset's files."]
    return "\n".join(lines) + "\n"


def plot(groups, path):
    """Zoology's figure: one panel per cell, accuracy against bytes kept, a curve per config across widths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker
    cells = sorted({(g["row_len"], g["pairs"]) for g in groups if g["config"] != "chance"})
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells) + 1.6, 4.0), squeeze=False, sharey=True)
    # 20 distinct colours and a marker per family kind: 14 configs overrun matplotlib's 10-colour cycle
    cmap = plt.get_cmap("tab20")
    colors = {c: cmap(i % 20) for i, c in enumerate(dict.fromkeys(g["config"] for g in groups))}
    for ax, (t, p) in zip(axes[0], cells):
        here = [g for g in groups if (g["row_len"], g["pairs"]) == (t, p) and g["acc"] is not None]
        for c in dict.fromkeys(g["config"] for g in here if g["config"] != "chance"):
            mine = sorted((g for g in here if g["config"] == c), key=lambda g: g["bytes_per_seq"])
            fixed_state = c.startswith(("linear", "retnet", "gla", "delta", "gated")) and not c.endswith("_mha")
            ax.plot([g["bytes_per_seq"] for g in mine], [g["acc"] for g in mine], color=colors[c], label=c,
                    marker="s" if fixed_state else "^" if c.endswith("_mha") else "o",
                    linestyle="--" if fixed_state else "-")
        for g in here:
            if g["config"] == "chance":
                ax.axhline(g["acc"], color="k", lw=0.8, ls=":", label="chance")
        ax.set(xscale="log", title=f"{t} tokens, {p} pairs", xlabel="KiB kept per sequence (cache bf16 + state fp32)")
        # powers of two, labelled in KiB: the sizes are powers of two, and log10's minor labels overlap
        ax.xaxis.set_major_locator(ticker.LogLocator(base=2))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x / 1024:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy (mean over seeds)")
    # one legend for every config of every panel, beside the panels, not over points
    legend = {}
    for ax in axes[0]:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.tight_layout(rect=(0, 0, 1 - 1.4 / fig.get_figwidth(), 1))
    fig.legend(legend.values(), legend.keys(), fontsize=7, loc="upper right")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = OneLineParser(prog="python -m tools.recall", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="train.py out_dirs on MQAR datasets (-s<seed>)")
    ap.add_argument("--out", default="recall", help="folder for recall.md, .json and .png (made if missing)")
    ap.add_argument("--solved", type=float, default=SOLVED, help="the accuracy a seed counts as solved at")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if not 0 < args.solved <= 1:
        fail(f"--solved={args.solved:g} is an accuracy: give a number in (0, 1], e.g. --solved=0.95")
    check_out(args.out)
    try:
        rows = [run_row(d) for d in dict.fromkeys(args.runs)]  # a folder given twice counts once
    except (RunError, CheckpointError, WriteError) as e:
        fail(str(e))
    groups, chance = group_rows(rows, args.solved), chance_rows(rows)
    write_outputs(args.out, "recall", markdown(groups, chance, args.solved), groups + chance, plot)


if __name__ == "__main__":
    main()
