"""Compare runs: one row per config (its seeds grouped, mean ± std) and validation-loss curves.

    python -m tools.compare out-mha out-gqa out-mla --out report
    python -m tools.compare sweeps/cpu/*-s* --out sweeps/cpu        # what sweep.py writes

Runs of one config are the run folders whose names differ only in a -s<seed> suffix
(mha-s1, mha-s2, ...); a folder without the suffix is a group of one. Reads each
RUN_DIR/summary.json and log.jsonl; writes OUT/report.md (per config: n, mean ± sample std
of best and final val loss, throughput, memory, cache, and the difference to the first
config marked where it exceeds the seed noise) and OUT/report.png (mean val loss with a
band of ± one std over seeds, against iterations and against wall time).
"""
import argparse
import math
import os
import re
import statistics
import sys

from configurator import fail
from trainer.rundir import RunError, load_run

SEED_SUFFIX = re.compile(r"-s\d+$")
NOISE_FACTOR = 2.0  # a difference counts when |diff| > NOISE_FACTOR x the pooled std of the two configs


def config_name(run_name):
    return SEED_SUFFIX.sub("", run_name)


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


def pooled_std(a, b):
    """Pooled sample std of two groups given as (mean, std, n); None if either has one value."""
    (_, sa, na), (_, sb, nb) = a, b
    if sa is None or sb is None:
        return None
    return math.sqrt(((na - 1) * sa ** 2 + (nb - 1) * sb ** 2) / (na + nb - 2))


def group_stats(runs):
    """The numbers of one config's row."""
    s0 = runs[0][1]
    summaries = [s for _, s, _ in runs]
    col = {key: mean_std([s.get(key) for s in summaries])
           for key in ("best_val_loss", "final_val_loss", "tokens_per_sec", "peak_mem_bytes", "wall_s", "iters")}
    return {"n": len(runs), "attention": s0.get("attention"), "pos_encoding": s0.get("pos_encoding"),
            "params": s0.get("params"), "kv_cache_bytes_per_token": s0.get("kv_cache_bytes_per_token"),
            "cache_state_bytes": s0.get("cache_state_bytes"), **col}


def noise_mark(stats, ref):
    """(diff of mean best val loss to ref, pooled std, exceeds-noise flag or None if unknown)."""
    a, b = stats["best_val_loss"], ref["best_val_loss"]
    if a[0] is None or b[0] is None:
        return None, None, None
    diff, pooled = a[0] - b[0], pooled_std(a, b)
    return diff, pooled, (None if pooled is None else abs(diff) > NOISE_FACTOR * pooled)


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def fmt_ms(stat, spec, scale=1.0):
    mean, std, _ = stat
    if mean is None:
        return "-"
    return f"{format(mean / scale, spec)} ± {'-' if std is None else format(std / scale, spec)}"


def table_row(name, st, ref_name, ref):
    diff, _pooled, exceeds = noise_mark(st, ref)
    if name == ref_name:
        delta = "(reference)"
    elif diff is None:
        delta = "-"
    else:
        mark = {True: " *", False: "", None: " (n/a: <2 seeds)"}[exceeds]
        delta = f"{diff:+.4f}{mark}"
    state = st["cache_state_bytes"]
    params = fmt(st['params'] and st['params'] / 1e6, '.2f')
    return (f"| {name} | {st['n']} | {st['attention']} | {st['pos_encoding']} | {params}M | "
            f"{fmt_ms(st['best_val_loss'], '.4f')} | {fmt_ms(st['final_val_loss'], '.4f')} | {delta} | "
            f"{fmt_ms(st['tokens_per_sec'], ',.0f')} | {fmt_ms(st['peak_mem_bytes'], ',.0f', 2 ** 20)} | "
            f"{fmt(st['kv_cache_bytes_per_token'], ',.0f')} | {fmt(state, ',.0f')} | {fmt(st['iters'][0], '.0f')} | "
            f"{fmt(st['wall_s'][0], ',.0f')} |")


def report_markdown(groups):
    """The report.md text for {config: runs}; the first config is the reference for differences."""
    stats = {name: group_stats(runs) for name, runs in groups.items()}
    ref_name = next(iter(stats))
    lines = [("| config | n | attention | pos | params | best val (mean ± std) | final val (mean ± std) "
             f"| Δ best vs {ref_name} | tokens/s | peak mem (MB) | KV cache B/token | constant state B "
             "| iters | wall (s, mean) |"), "|" + "---|" * 14]
    lines += [table_row(name, st, ref_name, stats[ref_name]) for name, st in stats.items()]
    lines += ["", (f"n runs per config (seeds); mean ± sample std (n-1), '-' where n = 1. Δ is the difference of "
              f"mean best val loss to {ref_name}; * marks |Δ| > {NOISE_FACTOR:g} x the pooled std of the two "
              "configs (sqrt(((n1-1)s1² + (n2-1)s2²) / (n1+n2-2))), i.e. beyond the seed noise; no mark: within "
              "it. KV cache grows per token (all layers); constant state is the decoding state that does not "
              "grow with length (GLA's recurrent state, fp32).")]
    return "\n".join(lines) + "\n"


def mean_curve(runs, x_key):
    """(x, mean val loss, std) over the evaluations every run of the group has (by index);
    x is the mean of the runs' x at that index (iterations agree; wall times differ)."""
    logs = [log for _, _, log in runs if log]
    if not logs:
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
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    later = []
    for name, runs in groups.items():
        s = runs[0][1]
        label = f"{name} ({s.get('attention')}, {s.get('pos_encoding')}, n={len(runs)})"
        for ax, x_key in zip(axes, ("iter", "elapsed_s")):
            xs, means, stds = mean_curve(runs, x_key)
            if not xs:
                continue
            (line,) = ax.plot(xs, means, marker=".", label=label)
            ax.fill_between(xs, [m - d for m, d in zip(means, stds)], [m + d for m, d in zip(means, stds)],
                            color=line.get_color(), alpha=0.2)
        later += [r["val_loss"] for _, _, log in runs for r in log if r.get("iter", 0) > 0 and r.get("val_loss")]
    axes[0].set(xlabel="iteration", ylabel="validation loss", title="val loss vs iterations (mean ± std over seeds)")
    axes[1].set(xlabel="wall time (s)", title="val loss vs wall time")
    for ax in axes:
        ax.grid(alpha=0.3)
        if later:  # the loss at iteration 0 (ln vocab) would flatten the curves that matter
            ax.set_ylim(min(later) - 0.05, max(later) + 0.05)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(run_dirs, out_dir):
    """Load, group and write out_dir/report.md and report.png; returns the markdown. RunError on a bad run."""
    groups = group_runs([load_run(r) for r in run_dirs])
    os.makedirs(out_dir, exist_ok=True)
    text = report_markdown(groups)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(text)
    plot_report(groups, os.path.join(out_dir, "report.png"))
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", default="report", help="folder for report.md and report.png")
    args = ap.parse_args(argv)
    try:
        text = write_report(args.runs, args.out)
    except RunError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write to --out {args.out} ({e.strerror}); pick a writable folder")
    print(text, end="")
    print(f"wrote {args.out}/report.md and {args.out}/report.png", file=sys.stderr)


if __name__ == "__main__":
    main()
