"""Compare finished runs: a markdown table and validation-loss curves on shared axes.

    python compare.py out-mha out-gqa out-mla --out report

Reads each RUN_DIR/summary.json and log.jsonl; writes OUT/report.md (one row per run)
and OUT/report.png (val loss against iterations and against wall time).
"""
import argparse
import json
import os
import sys

from configurator import fail


def load_run(run_dir):
    paths = {name: os.path.join(run_dir, name) for name in ("summary.json", "log.jsonl")}
    for name, path in paths.items():
        if not os.path.isfile(path):
            fail(f"{path} not found; is {run_dir} a finished train.py out_dir?")
    with open(paths["summary.json"]) as f:
        summary = json.load(f)
    with open(paths["log.jsonl"]) as f:
        log = [json.loads(line) for line in f if line.strip()]
    return summary, log


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", default="report", help="folder for report.md and report.png")
    args = ap.parse_args()
    runs = [(os.path.basename(os.path.normpath(r)), *load_run(r)) for r in args.runs]
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        fail(f"cannot create --out {args.out} ({e.strerror}); pick a writable folder")

    lines = ["| run | attention | pos | params | best val | final val | iters | tokens/s | peak mem (MB) "
             "| KV cache B/token | wall (s) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s, _ in sorted(runs, key=lambda r: r[1].get("best_val_loss") or float("inf")):
        lines.append(f"| {name} | {s['attention']} | {s['pos_encoding']} | {s['params'] / 1e6:.2f}M | "
                     f"{fmt(s['best_val_loss'], '.4f')} | {fmt(s['final_val_loss'], '.4f')} | {s['iters']} | "
                     f"{s['tokens_per_sec']:,.0f} | {s['peak_mem_bytes'] / 2**20:,.0f} | "
                     f"{s['kv_cache_bytes_per_token']:,.0f} | {s['wall_s']:.0f} |")
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_iter, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for name, s, log in runs:
        label = f"{name} ({s['attention']}, {s['pos_encoding']})"
        ax_iter.plot([r["iter"] for r in log], [r["val_loss"] for r in log], marker=".", label=label)
        ax_time.plot([r["elapsed_s"] for r in log], [r["val_loss"] for r in log], marker=".", label=label)
    ax_iter.set(xlabel="iteration", ylabel="validation loss", title="val loss vs iterations")
    ax_time.set(xlabel="wall time (s)", title="val loss vs wall time")
    later = [r["val_loss"] for _, _, log in runs for r in log if r["iter"] > 0]
    for ax in (ax_iter, ax_time):
        ax.grid(alpha=0.3)
        if later:  # the loss at iteration 0 (ln vocab) would flatten the curves that matter
            ax.set_ylim(min(later) - 0.05, max(later) + 0.05)
    ax_iter.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "report.png"), dpi=120)
    print(f"wrote {args.out}/report.md and {args.out}/report.png", file=sys.stderr)


if __name__ == "__main__":
    main()
