"""One table and one figure per study: what each attention costs and what it buys.

    python -m tools.scorecard sweeps/sparse512/*-s? --mqar sweeps/recall/*-s? --context=4096 --out sweeps/sparse512
    python -m tools.scorecard sweeps/fair256/*-s? --mqar sweeps/recall/w64-t64-p4/*-s? --mqar_as mha=mha4

Rows are configs (run folders grouped by their -s<seed> suffix, as tools.compare groups them);
the first config is the reference. Columns, each from where it is measured:
  quality       test loss of best.pt (the sweep's test_eval.json; best val loss where there is
                none): mean and 95% t half-width over seeds, and the paired difference to the
                reference with its interval and verdict (tools.stats, as tools.compare reports it)
  recall        --mqar runs of the same config names: mean test accuracy of best.pt on MQAR (the
                best val accuracy where a run has no test evaluation), with the number of
                pairs from their dataset's meta.json (the column is left out without --mqar runs);
                --mqar_as CONFIG=NAME reads a config's recall from MQAR runs named otherwise (the
                recall study's 4-head softmax is mha4, its 1-head anchor mha)
  extrapolation the first seed's loss at positions [L, F*L) of windows of F*L (--ext_factor F,
                L its block_size) minus its sliding-window loss at L (stride L/2, tools.eval):
                below 0, the model uses context past L; n/a where the model stops at L
  memory        cache bytes per token (bf16) averaged over --context tokens, and the constant
                state (fp32), from the model's own formulas (GPT.cache_elems_per_seq)
  speed         training tokens/s (mean of the runs' summaries, as trained) and decoding ms/token,
                measured now on this machine: the median of --steps steps that end at block_size
scorecard.md, scorecard.json (one object per config) and scorecard.png (quality against the
bytes each variant keeps per sequence at --context: the frontier a user chooses on) go to --out.
"""
import math
import os
import sys

import torch

from tools import compare, stats
from tools import eval as length_eval
from tools.benchmarks.harness import decode_cost
from trainer.checkpoint import CheckpointError
from trainer.cli import OneLineParser, fail
from trainer.rundir import Run, RunError, write_json_atomic, write_text_atomic


def quality(runs):
    """(key, mean, 95% half-width, n) of the test loss (else best val) over one config's seeds."""
    key = "test_loss" if all(s.get("test_loss") is not None for _, s, _ in runs) else "best_val_loss"
    values = [s[key] for _, s, _ in runs if s.get(key) is not None]
    mean, sd, n = compare.mean_std(values)
    half = stats.t_ppf(1 - stats.ALPHA / 2, n - 1) * sd / math.sqrt(n) if sd is not None else None
    return key, mean, half, n


def extrapolation(run_dir, ckpt, model, args, device):
    """Loss at positions [L, F*L) minus the sliding-window loss at L, on the first run's split."""
    L = model.config.block_size
    tokens = length_eval.split_tokens(ckpt, run_dir, args.data_dir, args.split)
    if (ckpt.get("meta") or {}).get("format") == "examples" or length_eval.why_not(model, args.ext_factor * L,
                                                                                    len(tokens)):
        return None
    sums, n = length_eval.position_sums(model, tokens, args.ext_factor * L, 8, device, "extrapolation")
    past = sums[L:].sum().item() / (n * (len(sums) - L))
    return past - length_eval.strided_loss(model, tokens, L, max(1, L // 2), 8, device, "sliding window")


def mqar_accuracy(mqar_groups, name):
    """(mean test accuracy of best.pt, else best val accuracy; pairs) of the --mqar runs (Run) named like
    this config, or (None, None)."""
    runs = mqar_groups.get(name)
    if not runs:
        return None, None
    key = "test_acc" if all(r.results.get("test_acc") is not None for r in runs) else "best_val_acc"
    mean, _, _ = compare.mean_std([r.results.get(key) for r in runs])
    return mean, (runs[0].meta.get("mqar") or {}).get("num_pairs")


def config_row(name, runs, first, paired, mqar_groups, args, device):
    """One config's row: runs are its (name, results, log) over seeds, first the Run of its first seed."""
    key, mean, half, n = quality(runs)
    model, ckpt = first.load_model(device)
    kv = model.cache_elems_per_seq(args.context) * 2 / args.context       # bf16, averaged over the context
    state = model.cache_state_elems() * 4
    acc, pairs = mqar_accuracy(mqar_groups, args.mqar_as.get(name, name))
    end = min(model.config.block_size, args.context)
    steps = min(args.steps, end - 1)   # the timed steps end at block_size: bigbird and learned positions stop there
    decode = decode_cost(model, end - steps, steps, device)["ms_per_token"]
    p = paired.get(name)
    return {"config": name, "attention": model.config.attention, "pos_encoding": model.config.pos_encoding,
            "params": model.num_params(), "n": n, "metric": key, "loss": mean, "loss_ci95_half": half,
            "delta": p and p["mean"], "delta_ci95": p and list(p["ci95"]), "verdict": p and p["verdict"],
            "mqar_acc": acc, "mqar_pairs": pairs,
            "extrapolation": extrapolation(first.path, ckpt, model, args, device),
            "context": args.context, "cache_bytes_per_token": kv, "cache_state_bytes": state,
            "bytes_per_seq": kv * args.context + state,
            "train_tokens_per_sec": compare.mean_std([s.get("tokens_per_sec") for _, s, _ in runs])[0],
            "decode_ms_per_token": decode, "decode_context": end - steps}


def fmt(value, spec, missing="n/a"):
    return missing if value is None else format(value, spec)


def table_lines(rows, ref):
    """The scorecard's table: one row per config; the MQAR column only where --mqar runs gave it."""
    mqar = any(r["mqar_acc"] is not None for r in rows)
    head = ["config", "attention", "n", "test loss ± 95%", f"Δ vs {ref} [95% CI]"] + (["MQAR acc (pairs)"] * mqar) + [
        "past L − sliding", f"cache B/token @ {rows[0]['context']:,} (bf16)", "state B (fp32)", "train tok/s",
        "decode ms/token"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        delta = "(reference)" if r["config"] == ref else (
            f"{stats.fmt_delta(r['delta'], r['delta_ci95'])} {r['verdict']}"
            if r["delta"] is not None else "undetermined (< 2 shared seeds)")
        acc = [f"{r['mqar_acc']:.3f} ({r['mqar_pairs']})" if r["mqar_acc"] is not None else "-"] * mqar
        cells = [r["config"], f"{r['attention']}, {r['pos_encoding']}", str(r["n"]),
                 f"{fmt(r['loss'], '.4f')} ± {fmt(r['loss_ci95_half'], '.4f', '-')}", delta, *acc,
                 fmt(r["extrapolation"], "+.3f"), f"{r['cache_bytes_per_token']:,.0f}", f"{r['cache_state_bytes']:,}",
                 fmt(r["train_tokens_per_sec"], ",.0f"), f"{r['decode_ms_per_token']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(rows, ref):
    lines = table_lines(rows, ref)
    lines += ["", f"Loss: {rows[0]['metric']} (best.pt, selected on val); Δ paired over shared seeds, Holm over "
              "the configs (tools.stats). Past L − sliding: loss at positions [L, F·L) minus the sliding-window "
              "loss at L (first seed; < 0 uses context past L; n/a where the model stops at L). Cache: bf16 bytes "
              "per token averaged over the context (a window's cache stops growing), state: fp32 bytes that do "
              "not grow. Speed: as trained (tokens/s) and measured now (decode: the median of the steps ending at "
              "block_size), on this machine."]
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        if r["loss"] is None:
            continue
        ax.errorbar(r["bytes_per_seq"], r["loss"], yerr=r["loss_ci95_half"] or 0, fmt="o", capsize=3)
        ax.annotate(r["config"], (r["bytes_per_seq"], r["loss"]), textcoords="offset points", xytext=(5, 5),
                    fontsize=8)
    ax.set_xscale("log")
    ax.set(xlabel=f"bytes kept per sequence at {rows[0]['context']:,} tokens (cache bf16 + state fp32)",
           ylabel=f"{rows[0]['metric']} (95% CI over seeds)", title="quality against memory kept")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def check_out(out):
    """One line and exit 2 when --out names a file (a missing folder is created)."""
    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"--out={out} is a file; give a folder (it is created if missing)")


def write_outputs(out, stem, text, rows, plot_fn):
    """The table to stdout, then OUT/<stem>.md and .json (atomic) and <stem>.png from plot_fn(rows, path)."""
    print(text, end="")
    os.makedirs(out, exist_ok=True)
    write_text_atomic(text, os.path.join(out, f"{stem}.md"))
    write_json_atomic(rows, os.path.join(out, f"{stem}.json"))
    plot_fn(rows, os.path.join(out, f"{stem}.png"))
    print(f"wrote {os.path.join(out, stem + '.md')}, .json and .png", file=sys.stderr)


def parse_args(argv):
    ap = OneLineParser(prog="python -m tools.scorecard", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="train.py out_dirs (seeds as -s<seed>)")
    ap.add_argument("--mqar", nargs="*", default=[], metavar="RUN_DIR", help="MQAR runs named like the configs")
    ap.add_argument("--mqar_as", action="append", default=[], metavar="CONFIG=NAME",
                    help="read CONFIG's recall from the --mqar runs of NAME (repeatable)")
    ap.add_argument("--context", type=int, default=4096, help="tokens the memory columns are stated at")
    ap.add_argument("--ext_factor", type=int, default=4, help="extrapolation windows of F x block_size")
    ap.add_argument("--steps", type=int, default=16, help="timed decoding steps")
    ap.add_argument("--split", default="test", choices=("val", "test"), help="the split of the extrapolation")
    ap.add_argument("--data_dir", help="folder holding <dataset>/ (default: each run's data_dir)")
    ap.add_argument("--margin", type=float, default=0.01, help="equivalence margin, nats (as tools.compare)")
    ap.add_argument("--out", default="scorecard", help="folder for scorecard.md, .json and .png (made if missing)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    for name in ("context", "ext_factor", "steps"):
        if getattr(args, name) < 1 or (name == "ext_factor" and args.ext_factor < 2):
            fail(f"--{name}={getattr(args, name)} must be at least {2 if name == 'ext_factor' else 1}")
    check_out(args.out)
    args.mqar_as = config_aliases(args.mqar_as)
    return args


def config_aliases(pairs):
    """{config: MQAR config name} from --mqar_as CONFIG=NAME; one line and exit 2 on any other form."""
    aliases = {}
    for pair in pairs:
        config, sep, name = pair.partition("=")
        if not (sep and config and name) or "=" in name:
            fail(f"--mqar_as {pair}: give CONFIG=NAME, e.g. --mqar_as mha=mha4")
        aliases[config] = name
    return aliases


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        loaded = [Run(d) for d in args.runs]
        groups = compare.group_runs([(r.name, r.results, r.log) for r in loaded])
        first = {name: next(r for r in loaded if compare.config_name(r.name) == name) for name in groups}
        mqar = {}
        for run in map(Run, args.mqar):
            mqar.setdefault(compare.config_name(run.name), []).append(run)
        paired = compare.paired_rows(groups, quality(next(iter(groups.values())))[0], args.margin)
        torch.manual_seed(0)
        rows = [config_row(name, runs, first[name], paired, mqar, args, args.device) for name, runs in groups.items()]
    except (RunError, CheckpointError) as e:
        fail(str(e))
    write_outputs(args.out, "scorecard", markdown(rows, next(iter(groups))), rows, plot)


if __name__ == "__main__":
    main()
