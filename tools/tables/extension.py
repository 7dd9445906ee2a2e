"""docs/rope.md's extension study at L = 256 (docs/results/ext256/): RoPE (stretched by each scaling)
and ALiBi trained at 256, 3 seeds, evaluated at 1x-8x L by tools.eval (--stride, --per_position) and
probed by tools.passkey; the JSON as those tools wrote it.

A row is a setting, "base10k [yarn x4]" (its seeds' runs grouped); each model's own sliding window is
the eval's stride row of the same setting: every token predicted from 192-256 tokens before it.
"""
import json
import os
import re

from tools import compare, stats
from tools.tables.source import md_table, results_dir

LABEL = re.compile(r"^(?P<config>.+)-s(?P<seed>\d+)(?P<setting> \[.+\])?$")
MARGIN = 0.01


def read(root, name):
    with open(os.path.join(results_dir(root, "ext256"), name)) as f:
        return json.load(f)


def settings(rows):
    """{setting label: {seed: [rows]}} in order of first appearance."""
    out = {}
    for r in rows:
        m = LABEL.match(r["run"])
        label = m["config"] + (m["setting"] or "")
        out.setdefault(label, {}).setdefault(int(m["seed"]), []).append(r)
    return out


def mean_sd(values):
    """tools.compare's cell: mean ± sample std over the seeds."""
    return compare.fmt_ms(compare.mean_std(values), ".4f")


def loss_at(rows, length):
    """One run's test loss at length (non-overlapping windows), or with length None its sliding window."""
    return next(r["test_loss"] for r in rows if ("stride" in r) == (length is None) and length in (None, r["length"]))


def regime_text(r):
    """A yarn row's regime (RoPE.yarn_regime, as tools.eval wrote it): the fastest pair's turns over L against
    beta_fast, the slowest's against beta_slow, and the bands the ramp makes; '' for other rows."""
    if r is None:
        return ""
    k = r["by_ramp"]
    return (f"pair 0: {r['turns_fastest']:.1f} turns (β_fast {r['beta_fast']:g}), last: {r['turns_slowest']:.3f} "
            f"(β_slow {r['beta_slow']:g}); {k['kept']} kept / {k['ramped']} ramped / {k['interpolated']} "
            f"interpolated: {r['regime']}")


def loss_table(factor):
    """Test loss at each length (non-overlapping windows), mean ± sd over seeds, and the own sliding window."""
    def table(root):
        groups = settings(read(root, f"eval_x{factor}.json"))
        lengths = sorted({r["length"] for seeds in groups.values() for rs in seeds.values() for r in rs
                          if "stride" not in r})
        out = []
        for label, seeds in groups.items():
            cells = [mean_sd([loss_at(rs, n) for rs in seeds.values()]) for n in [*lengths, None]]
            regime = next((r["yarn_regime"] for rs in seeds.values() for r in rs if "yarn_regime" in r), None)
            out.append([label, len(seeds), *cells, regime_text(regime)])
        return md_table(["setting", "seeds", *(f"L={n}" for n in lengths), "own sliding window at 256 (stride 64)",
                         "YaRN's regime at L"], out)
    return table


def past_table(factor):
    """At the longest length, each range of positions past L minus the setting's own sliding window, paired
    by seed (95% t interval): below zero, the tokens far into the window gain from context past L."""
    def table(root):
        groups = settings(read(root, f"eval_x{factor}.json"))
        out, ranges = [], None
        for label, seeds in groups.items():
            diffs = {}
            for rs in seeds.values():
                longest = max((r for r in rs if "stride" not in r), key=lambda r: r["length"])
                window = next(r["test_loss"] for r in rs if "stride" in r)
                for b in longest["buckets"]:
                    if b["start"] >= longest["block_size"]:
                        diffs.setdefault((b["start"], b["end"]), []).append(b["loss"] - window)
            ranges = list(diffs)
            cells = []
            for d in diffs.values():
                p = stats.paired(d, MARGIN)
                cells.append(stats.fmt_delta(p["mean"], p["ci95"], 3) if p else f"{d[0]:+.3f}")
            out.append([label, *cells])
        return md_table(["setting", *(f"[{a}, {b}) − own window" for a, b in ranges)], out)
    return table


def passkey_table(root):
    """Exact-match passkey accuracy per setting and multiple of L, the seeds' trials pooled, 95% Wilson interval."""
    groups = settings(read(root, "passkey.json"))
    multiples = sorted({r["multiple"] for seeds in groups.values() for rs in seeds.values() for r in rs})
    out = []
    for label, seeds in groups.items():
        cells = []
        for m in multiples:
            rs = [r for rows in seeds.values() for r in rows if r["multiple"] == m]
            if any(r["hits"] is None for r in rs):
                cells.append("n/a")
                continue
            hits, n = sum(r["hits"] for r in rs), sum(r["trials"] for r in rs)
            lo, hi = stats.wilson(hits, n)
            cells.append(f"{hits}/{n} = {hits / n:.2f} [{lo:.2f}, {hi:.2f}]")
        out.append([label, *cells])
    return md_table(["setting", *(f"{m:g}x L" for m in multiples)], out)


TABLES = {
    "ext256-x4-loss": loss_table(4),
    "ext256-passkey": passkey_table,
}
