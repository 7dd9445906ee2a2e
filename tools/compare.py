"""Compare runs: one row per config (its seeds grouped, mean ± std), paired differences against the
first config, and validation-loss curves.

    python -m tools.compare out-mha out-gqa out-mla --out report
    python -m tools.compare sweeps/cpu/*-s* --out sweeps/cpu        # what sweep.py writes

Runs of one config are the run folders whose names differ only in a -s<seed> suffix
(mha-s1, mha-s2, ...); a folder without the suffix is a group of one. Reads each
RUN_DIR/summary.json, log.jsonl and, when sweep.py wrote it, test_eval.json (the test loss of
its best.pt), through trainer.rundir.Run. Writes OUT/report.md:
  - per config: n, mean ± sample std of best and final val loss and of test loss, throughput,
    memory, cache (bytes per token in bf16, this repo's one convention; the state in fp32),
    training FLOPs;
  - per config against the first: the paired difference over shared seeds (--metric: the test
    loss when every run has one, else the best val loss), its 95% t interval, Holm-corrected
    p, the equivalence test against --margin and a verdict (tools/stats.py);
  - the budget and learning-rate choices of sweep.py's plan.json (--plan), and the loss at
    equal training FLOPs read from the curves;
and OUT/report.png (mean val loss with a band of ± one std over seeds, against iterations, wall
time and training FLOPs).
"""
import json
import math
import os
import re
import statistics
import sys

from tools import stats
from trainer.cli import OneLineParser, check_output, fail, positive_float
from trainer.rundir import RunError, load_run, settings_differ

SEED_SUFFIX = re.compile(r"-s(\d+)$")
METRICS = {"test": "test_loss", "best_val": "best_val_loss", "final_val": "final_val_loss"}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}   # summary.json's dtype -> bytes per element


def config_name(run_name):
    return SEED_SUFFIX.sub("", run_name)


def run_seed(name, summary):
    seed = summary.get("seed")
    if seed is None and SEED_SUFFIX.search(name):
        seed = int(SEED_SUFFIX.search(name).group(1))
    return seed


def group_runs(runs):
    """[(name, summary, log)] -> {config: [runs]} in order of first appearance."""
    groups = {}
    for run in runs:
        groups.setdefault(config_name(run[0]), []).append(run)
    return groups


def mean_std(values):
    """(mean, sample std with n-1, n) over the non-missing values; std None below 2 values."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None, None, 0
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None), len(values)


def cache_bytes_bf16(summary):
    """The KV cache bytes per token of a run in this repo's one convention, bf16 (2 bytes an element):
    summary.json states them in the dtype the run trained in. None where that dtype is not recorded."""
    stated = summary.get("kv_cache_bytes_per_token")
    itemsize = DTYPE_BYTES.get(summary.get("dtype"))
    if stated == 0:
        return 0
    return None if stated is None or itemsize is None else stated // itemsize * 2


def group_stats(runs):
    """The numbers of one config's row."""
    s0 = runs[0][1]
    summaries = [s for _, s, _ in runs]
    col = {key: mean_std([s.get(key) for s in summaries])
           for key in ("best_val_loss", "final_val_loss", "test_loss", "tokens_per_sec", "peak_mem_bytes",
                       "wall_s", "iters", "train_flops", "best_val_acc", "final_val_acc", "test_acc")}
    return {"n": len(runs), "attention": s0.get("attention"), "pos_encoding": s0.get("pos_encoding"),
            "params": s0.get("params"), "kv_cache_bytes_per_token": cache_bytes_bf16(s0),
            "cache_state_bytes": s0.get("cache_state_bytes"), **col}


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def fmt_ms(stat, spec, scale=1.0):
    mean, std, _ = stat
    if mean is None:
        return "-"
    return f"{format(mean / scale, spec)} ± {'-' if std is None else format(std / scale, spec)}"


def runs_header(ref_name):
    """The header of the per-config table (report.md's first, and the docs' study tables)."""
    return [("| config | n | attention | pos | params | best val (mean ± std) | final val (mean ± std) "
             f"| test (mean ± std) | Δ best vs {ref_name} | tokens/s | peak mem (MB) | KV cache B/token (bf16) "
             "| constant state B (fp32) | iters | train TFLOPs | wall (s, mean) |"), "|" + "---|" * 16]


def delta_cell(name, st, ref_name, ref):
    """The unpaired difference of mean best val loss to the reference, as its column prints it."""
    a, b = st["best_val_loss"][0], ref["best_val_loss"][0]
    return "(reference)" if name == ref_name else ("-" if a is None or b is None else f"{a - b:+.4f}")


def table_row(name, st, delta):
    """One config's row of the runs_header table; delta is the Δ column's text (delta_cell)."""
    params = fmt(st['params'] and st['params'] / 1e6, '.2f')
    flops = fmt(st["train_flops"][0] and st["train_flops"][0] / 1e12, ".2f")
    return (f"| {name} | {st['n']} | {st['attention']} | {st['pos_encoding']} | {params}M | "
            f"{fmt_ms(st['best_val_loss'], '.4f')} | {fmt_ms(st['final_val_loss'], '.4f')} | "
            f"{fmt_ms(st['test_loss'], '.4f')} | {delta} | "
            f"{fmt_ms(st['tokens_per_sec'], ',.0f')} | {fmt_ms(st['peak_mem_bytes'], ',.0f', 2 ** 20)} | "
            f"{fmt(st['kv_cache_bytes_per_token'], ',.0f')} | {fmt(st['cache_state_bytes'], ',.0f')} | "
            f"{fmt(st['iters'][0], '.0f')} | {flops} | {fmt(st['wall_s'][0], ',.0f')} |")


def choose_metric(groups, metric):
    """The summary key the paired statistics use: --metric, or auto (test when every run has it)."""
    if metric != "auto":
        return METRICS[metric]
    every = all(s.get("test_loss") is not None for runs in groups.values() for _, s, _ in runs)
    return "test_loss" if every else "best_val_loss"


def values_by_seed(runs, key):
    """{seed: the run's summary value of key} of one config's runs."""
    return {run_seed(n, s): s.get(key) for n, s, _ in runs}


def paired_rows(groups, key, margin):
    """{config: paired statistics against the reference (stats.paired + verdicts), or None}."""
    ref_name = next(iter(groups))
    by_seed = {name: values_by_seed(runs, key) for name, runs in groups.items()}
    ref = by_seed[ref_name]
    names = [n for n in groups if n != ref_name]
    rows = []
    for name in names:
        seeds = [sd for sd, v in by_seed[name].items() if sd is not None and v is not None and ref.get(sd) is not None]
        rows.append(stats.paired([by_seed[name][sd] - ref[sd] for sd in sorted(seeds)], margin))
    return dict(zip(names, stats.verdicts(rows, margin)))


def paired_table(rows):
    """{config: paired_rows' statistics or None} as the table of paired differences (header and rows)."""
    lines = ["| config | pairs | mean Δ | 95% CI | p (Holm) | equivalence p (Holm, ±margin) | verdict "
             "| seeds to resolve |", "|" + "---|" * 8]
    for name, r in rows.items():
        if r is None:
            lines.append(f"| {name} | <2 | - | - | - | - | undetermined (fewer than 2 shared seeds) | - |")
            continue
        need = "-" if r["verdict"] != "undetermined" else (f"{r['seeds_needed']}" if r["seeds_needed"]
                                                           else f"> {stats.MAX_SEEDS}")
        lines.append(f"| {name} | {r['n']} | {r['mean']:+.4f} | {stats.fmt_ci(r['ci95'])} | "
                     f"{r['p_holm']:.3g} | {r['p_equiv_holm']:.3g} | {r['verdict']} | {need} |")
    return lines


def paired_markdown(groups, key, margin):
    ref_name = next(iter(groups))
    rows = paired_rows(groups, key, margin)
    lines = [f"Paired differences against {ref_name} ({key}; per seed, config minus {ref_name}):", ""]
    lines += paired_table(rows)
    lines += ["", (f"Two-sided paired t-test and two one-sided tests (margin ±{margin:g} nats), each Holm-corrected "
                   f"over the {len(rows)} comparisons at alpha {stats.ALPHA:g}; 'seeds to resolve': the fewest "
                   f"seeds that would show a difference or the equivalence at {stats.POWER:.0%} power if the "
                   "observed mean and sd held (before the Holm correction).")]
    return lines


def accuracy_markdown(table):
    """Datasets of examples (e.g. MQAR): accuracy on the counted targets, beside the loss above."""
    if not any(st["best_val_acc"][0] is not None for st in table.values()):
        return []
    lines = ["| config | n | best val acc (mean ± std) | final val acc (mean ± std) | test acc (mean ± std) |",
             "|---|---|---|---|---|"]
    lines += [f"| {name} | {st['best_val_acc'][2]} | {fmt_ms(st['best_val_acc'], '.4f')} | "
              f"{fmt_ms(st['final_val_acc'], '.4f')} | {fmt_ms(st['test_acc'], '.4f')} |" for name, st in table.items()]
    return lines + ["", ("Accuracy: the share of counted targets (meta.json format=examples) the model predicts "
                         "exactly (greedy), at best.pt's evaluation (best), at the last one (final), and of best.pt "
                         "on the test split."), ""]


def report_markdown(groups, metric="auto", margin=0.01, plan=None):
    """The report.md text for {config: runs}; the first config is the reference for differences."""
    table = {name: group_stats(runs) for name, runs in groups.items()}
    ref_name = next(iter(table))
    lines = runs_header(ref_name)
    lines += [table_row(name, st, delta_cell(name, st, ref_name, table[ref_name])) for name, st in table.items()]
    lines += ["", (f"n runs per config (seeds); mean ± sample std (n-1), '-' where n = 1. Δ is the unpaired "
              f"difference of mean best val loss to {ref_name}; the paired statistics below decide. Test: the "
              "loss of best.pt (selected on val) over every window of the test split. KV cache: bytes per token "
              "(all layers) in bf16, 2 bytes an element whatever dtype the run trained in; constant state: the "
              "decoding state that does not grow with length (the linear family's recurrent state), fp32 as the "
              "model keeps it. Train TFLOPs: flops_per_token (6N + attention, causal pairs only) x tokens trained, "
              "as each run logged it (runs older than that count logged PaLM's, every key)."), ""]
    lines += accuracy_markdown(table)
    if len(groups) > 1:
        lines += paired_markdown(groups, choose_metric(groups, metric), margin) + [""]
    if plan:
        lines += plan_markdown(plan) + [""]
    lines += equal_flops_markdown(groups)
    return "\n".join(lines).rstrip("\n") + "\n"


def plan_markdown(plan):
    """sweep.py's plan.json as a table: what was matched and which learning rate was chosen."""
    inputs = plan.get("inputs", {})
    match = ", ".join(inputs.get("match") or []) or "nothing (every config as written)"
    grid = inputs.get("lr_grid")
    return [f"Budget: matched {match} against the first config"
            + (f"; learning rate tuned per config over {', '.join(f'{g:g}' for g in grid)} (one seed, "
               f"{inputs.get('lr_fraction'):g} of the budget, best val loss)" if grid else
               "; one learning rate for all (not tuned)") + ".", ""] + plan_table(plan.get("configs", {}))


def plan_table(configs):
    """plan.json's configs as a table: parameters, overrides, FLOPs, the lr grid and the lr chosen."""
    lines = ["| config | params | overrides | FLOPs/token | probe tokens/s | lr grid (best val) | lr |",
             "|---|---|---|---|---|---|---|"]
    for name, e in configs.items():
        grid_cells = ", ".join(f"{lr}: {v:.4f}" for lr, v in (e.get("lr_grid") or {}).items()) or "-"
        lines.append(f"| {name} | {fmt(e.get('params'), ',')} | {' '.join(e.get('overrides', [])) or '-'} | "
                     f"{fmt(e.get('flops_per_token'), ',.0f')} | {fmt(e.get('probe_tokens_per_sec'), ',.0f')} | "
                     f"{grid_cells} | {fmt(e.get('learning_rate'), 'g')} |")
    return lines


def interpolate(xs, ys, x):
    """Linear interpolation of the curve (xs increasing) at x; None outside it."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def equal_flops_markdown(groups):
    """Mean val loss of each config read from its curve at training FLOPs every config reached."""
    curves = {name: mean_curve(runs, "flops") for name, runs in groups.items()}
    if not all(xs for xs, _, _ in curves.values()):
        return []
    reach = min(xs[-1] for xs, _, _ in curves.values())
    points = [reach * f for f in (0.25, 0.5, 1.0)]
    lines = ["Mean val loss at equal training FLOPs (read from the curves, linear between evaluations):", "",
             "| config | " + " | ".join(f"{p:.3g} FLOPs" for p in points) + " |",
             "|---|" + "---|" * len(points)]
    for name, (xs, means, _) in curves.items():
        lines.append(f"| {name} | " + " | ".join(fmt(interpolate(xs, means, p), ".4f") for p in points) + " |")
    return lines


def mean_curve(runs, x_key):
    """(x, mean val loss, std) over the evaluations every run of the group has (by index);
    x is the mean of the runs' x at that index (iterations agree; wall times differ). Empty
    when a run's log lacks x_key (logs written before the key existed)."""
    logs = [log for _, _, log in runs if log]
    if not logs or any(x_key not in r for log in logs for r in log):
        return [], [], []
    n = min(len(log) for log in logs)
    xs, means, stds = [], [], []
    for i in range(n):
        xs.append(statistics.fmean(log[i][x_key] for log in logs))
        m, s, _ = mean_std([log[i]["val_loss"] for log in logs])
        means.append(m)
        stds.append(s or 0.0)
    return xs, means, stds


def plot_report(groups, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = (("iter", "iteration"), ("elapsed_s", "wall time (s)"), ("flops", "training FLOPs"))
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5), sharey=True)
    later = []
    for name, runs in groups.items():
        s = runs[0][1]
        label = f"{name} ({s.get('attention')}, {s.get('pos_encoding')}, n={len(runs)})"
        for ax, (x_key, _) in zip(axes, panels):
            xs, means, stds = mean_curve(runs, x_key)
            if not xs:
                continue
            (line,) = ax.plot(xs, means, marker=".", label=label)
            ax.fill_between(xs, [m - d for m, d in zip(means, stds)], [m + d for m, d in zip(means, stds)],
                            color=line.get_color(), alpha=0.2)
        later += [r["val_loss"] for _, _, log in runs for r in log if r.get("iter", 0) > 0 and r.get("val_loss")]
    for ax, (_, xlabel) in zip(axes, panels):
        ax.set(xlabel=xlabel, title=f"val loss vs {xlabel.split(' (')[0]} (mean ± std over seeds)")
        ax.grid(alpha=0.3)
        if later:  # the loss at iteration 0 (ln vocab) would flatten the curves that matter
            ax.set_ylim(min(later) - 0.05, max(later) + 0.05)
    axes[0].set_ylabel("validation loss")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_plan(path):
    if path is None:
        return None
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise RunError(f"--plan {path} is not readable JSON ({e}); pass sweep.py's OUT/plan.json") from None
    configs = plan.get("configs") if isinstance(plan, dict) else None
    if not (isinstance(configs, dict) and all(isinstance(e, dict) for e in configs.values())
            and isinstance(plan.get("inputs", {}), dict)):
        raise RunError(f"--plan {path} is JSON but not a sweep's plan (no table of configs); "
                       "pass sweep.py's OUT/plan.json")
    return plan


def check_groups_alike(groups):
    """Seeds of one config must differ only in the seed (summary.json's "settings"; older runs lack it)."""
    for name, runs in groups.items():
        with_settings = [(n, s["settings"]) for n, s, _ in runs if isinstance(s.get("settings"), dict)]
        for other, settings in with_settings[1:]:
            differ = settings_differ(with_settings[0][1], settings)
            if differ:
                raise RunError(f"{with_settings[0][0]} and {other} are grouped as {name} but were trained with other "
                               f"settings ({'; '.join(differ[:3])}); compare them under different names, or pass "
                               "--allow_mixed to group them anyway")


def write_report(run_dirs, out_dir, metric="auto", margin=0.01, plan_path=None, allow_mixed=False):
    """Load, group and write out_dir/report.md and report.png; returns the markdown. RunError on a bad run."""
    groups = group_runs([load_run(r) for r in run_dirs])
    if not allow_mixed:
        check_groups_alike(groups)
    if metric == "test" and any(s.get("test_loss") is None for runs in groups.values() for _, s, _ in runs):
        raise RunError("--metric=test: some runs have no test_eval.json; run python -m tools.eval RUN --split=test "
                       "--json RUN/test_eval.json (sweep.py does it when the dataset has test.bin)")
    text = report_markdown(groups, metric, margin, read_plan(plan_path))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(text)
    plot_report(groups, os.path.join(out_dir, "report.png"))
    return text


def main(argv=None):
    ap = OneLineParser(prog="python -m tools.compare", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", default="report", help="folder for report.md and report.png")
    ap.add_argument("--metric", default="auto", choices=("auto", *METRICS),
                    help="what the paired statistics compare (auto: test when every run has it, else best_val)")
    ap.add_argument("--margin", type=positive_float, default=0.01,
                    help="equivalence margin in nats for the two one-sided tests (default 0.01)")
    ap.add_argument("--plan", help="sweep.py's OUT/plan.json, to report the matching and the lr choice")
    ap.add_argument("--allow_mixed", action="store_true",
                    help="group runs of one name even when their settings differ beyond the seed")
    args = ap.parse_args(argv)
    check_output(args.out, "--out", folder=True)
    try:
        text = write_report(args.runs, args.out, args.metric, args.margin, args.plan, args.allow_mixed)
    except RunError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write to --out {args.out} ({e.strerror}); pick a writable folder")
    print(text, end="")
    print(f"wrote {args.out}/report.md and {args.out}/report.png", file=sys.stderr)


if __name__ == "__main__":
    main()
