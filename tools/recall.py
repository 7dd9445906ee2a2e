"""The recall study's table and figure: MQAR accuracy against the number of pairs and the bytes kept.

    python -m tools.recall sweeps/recall/p*/*-s? --out sweeps/recall

Zoology's question (Arora et al. 2023): attention keeps every key and should recall at any number
of pairs; a fixed state must grow with them. Runs are train.py out_dirs on MQAR datasets
(data/mqar/prepare.py), grouped by config name (the -s<seed> suffix dropped, as tools.compare
does) and by their dataset's number of pairs (the meta.json record in best.pt). Per group:
  accuracy  test accuracy of best.pt (selected on val; the sweep's test_eval.json), mean and
            min-max over seeds; the best val accuracy where a run has no test evaluation
  Δ         accuracy minus the first config's at the same number of pairs, paired over the seeds
            both have: mean and 95% t interval (tools.stats; at least 2 shared seeds)
  solved    the seeds whose accuracy reaches --solved (0.95): at a short budget a run either forms
            the recall circuit or plateaus, so the mean of a few seeds hides a count worth reading
  bytes     what the variant keeps per sequence after one row: its cache in bf16
            (GPT.cache_elems_per_seq at the row length) plus its constant state in fp32
recall.md (configs x pairs), recall.json (one object per group) and recall.png (accuracy against
pairs; accuracy against bytes kept, one marker per pair count) go to --out.
"""
import sys

from tools import compare, stats
from tools.scorecard import check_out, write_outputs
from trainer.checkpoint import CheckpointError
from trainer.cli import OneLineParser, fail
from trainer.rundir import Run, RunError

SOLVED = 0.95   # the accuracy a seed counts as solved at (--solved)


def run_row(run_dir):
    """(config, pairs, seed, accuracy, which accuracy, bytes kept per sequence, params) of one MQAR run."""
    run = Run(run_dir)
    summary = run.results
    mqar = run.meta.get("mqar")
    if not mqar:
        raise RunError(f"{run_dir} was not trained on an MQAR dataset (no mqar record in its meta.json); "
                       "give runs of data/mqar/prepare.py datasets")
    key = "test_acc" if summary.get("test_acc") is not None else "best_val_acc"
    model, _ = run.load_model("cpu")
    row_len = model.config.block_size
    kept = model.cache_elems_per_seq(row_len) * 2 + model.cache_state_elems() * 4
    return (compare.config_name(run.name), mqar["num_pairs"], summary.get("seed"), summary.get(key), key, kept,
            model.num_params())


def group_rows(rows, solved=SOLVED):
    """[{config, pairs, n, acc, acc_min, acc_max, solved, delta, delta_ci95, metric, bytes_per_seq,
    params}] in order of appearance; delta is paired against the first config at the same pairs;
    solved counts the seeds at accuracy >= solved."""
    groups = {}
    for config, pairs, seed, acc, key, kept, params in rows:
        groups.setdefault((config, pairs), []).append((seed, acc, key, kept, params))
    reference = rows[0][0]
    out = []
    for (config, pairs), runs in groups.items():
        accs = {seed: a for seed, a, _, _, _ in runs if a is not None}
        ref = {seed: a for seed, a, _, _, _ in groups.get((reference, pairs), []) if a is not None}
        paired = None if config == reference else stats.paired([accs[s] - ref[s] for s in accs if s in ref], 0.01)
        values = list(accs.values())
        out.append({"config": config, "pairs": pairs, "n": len(values),
                    "acc": compare.mean_std(values)[0],
                    "acc_min": min(values, default=None), "acc_max": max(values, default=None),
                    "solved": sum(a >= solved for a in values),
                    "delta": paired and paired["mean"], "delta_ci95": paired and list(paired["ci95"]),
                    "metric": sorted({k for _, _, k, _, _ in runs}), "bytes_per_seq": runs[0][3],
                    "params": runs[0][4]})
    return out


def cell(g):
    """One config at one pair count: mean [min, max] (n), solved k/n, and Δ [95% CI] to the reference."""
    if g is None or g["acc"] is None:
        return "-"
    text = f"{g['acc']:.3f}" + (f" [{g['acc_min']:.3f}, {g['acc_max']:.3f}]" if g["n"] > 1 else "")
    text += f" (n={g['n']}); solved {g['solved']}/{g['n']}"
    if g["delta"] is not None:
        text += f"; Δ {g['delta']:+.3f} [{g['delta_ci95'][0]:+.3f}, {g['delta_ci95'][1]:+.3f}]"
    return text


def markdown(groups, solved=SOLVED):
    configs = list(dict.fromkeys(g["config"] for g in groups))
    pairs = sorted({g["pairs"] for g in groups})
    cells = {(g["config"], g["pairs"]): g for g in groups}
    lines = ["| config | params | bytes kept / sequence | " + " | ".join(f"{p} pairs" for p in pairs) + " |",
             "|" + "---|" * (3 + len(pairs))]
    for c in configs:
        first = next(g for g in groups if g["config"] == c)
        lines.append(f"| {c} | {first['params']:,} | {first['bytes_per_seq']:,} | "
                     + " | ".join(cell(cells.get((c, p))) for p in pairs) + " |")
    metrics = sorted({m for g in groups for m in g["metric"]})
    lines += ["", f"Accuracy: {', '.join(metrics)} of best.pt (mean [min, max] over seeds); solved: seeds at "
              f"accuracy >= {solved:g}; Δ: minus {groups[0]['config']}'s, paired over shared seeds (95% t interval). "
              "Bytes: cache (bf16) after one row plus constant state (fp32), from the model's formulas."]
    return "\n".join(lines) + "\n"


def plot(groups, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for c in dict.fromkeys(g["config"] for g in groups):
        mine = sorted((g for g in groups if g["config"] == c and g["acc"] is not None), key=lambda g: g["pairs"])
        line, = left.plot([g["pairs"] for g in mine], [g["acc"] for g in mine], "o-", label=c)
        right.scatter([g["bytes_per_seq"] for g in mine], [g["acc"] for g in mine], color=line.get_color(),
                      s=[12 + 6 * g["pairs"] for g in mine], label=c)
    left.set(xscale="log", xlabel="key-value pairs per row", ylabel="MQAR accuracy (mean over seeds)",
             title="recall against pairs")
    pairs = sorted({g["pairs"] for g in groups})
    left.set_xticks(pairs, [str(p) for p in pairs])   # the pair counts themselves, not 2 x 10^0
    left.minorticks_off()
    right.set(xscale="log", xlabel="bytes kept per sequence (cache bf16 + state fp32)",
              title="recall against memory (marker size: pairs)")
    for ax in (left, right):
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
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
        groups = group_rows([run_row(d) for d in dict.fromkeys(args.runs)], args.solved)  # a folder twice: once
    except (RunError, CheckpointError) as e:
        fail(str(e))
    write_outputs(args.out, "recall", markdown(groups, args.solved), groups, plot)


if __name__ == "__main__":
    main()
