"""Positions and lengths: docs/results.md's train-short-test-long tables, docs/positions.md's five
encodings and docs/rope.md's base and stretching studies, from docs/results/{ext64, positions750,
ropebase64, ropebase256, ropestretch64}; Men et al.'s bound on RoPE's base from the code
(tools.analyze.rope_base_lower_bound at the configs' head dim and base).
"""
import functools
import glob
import json
import os

from attention.positional import RoPE
from tools import analyze, stats
from tools.tables.source import delta, fmt_sci, md_table, model_of, results_dir, study, verdict
from tools.tables.stored import MARGIN

ROPE_CONFIG = "config/ropebase/base10k.py"   # the base studies' model (config/mha.py at base 1e4)
rope_base_lower_bound = functools.cache(analyze.rope_base_lower_bound)   # one search per (head dim, context)


def head_dim():
    cfg = model_of(ROPE_CONFIG).config
    return cfg.n_embd // cfg.n_head


def ext_vs_rope(root):
    st = study(root, "ext64")
    rows = st["vs_rope"]["rows"].items()
    return md_table(["model − RoPE", *(f"L={n}" for n in st["lengths"])],
                    [[st["models"][m]["short"], *(delta(c, 3) for c in cells)] for m, cells in rows])


def ext_per_position(root):
    st = study(root, "ext64")["per_position"]
    labels = study(root, "ext64")["models"]
    return md_table(["model", "sliding window (mean)", *st["ranges"]],
                    [[labels[m]["label"], f"{r['sliding']:.4f}", *(delta(c, 3) for c in r["ranges"])]
                     for m, r in st["rows"].items()])


EXT_LATER = "ext64_fox_nsa"   # fox and nsa on ext64's recipe: their runs and tools.eval's JSON per seed
EXT_LATER_LABELS = {"fox": "FoX, none", "nsa": "NSA, RoPE"}


def range_label(start, end, L):
    """[0, L), [L, 2L), [2L, 4L) ...: a bucket of positions in multiples of the trained length L."""
    def mult(x):
        return "0" if x == 0 else "L" if x == L else f"{x // L}L"
    return f"[{mult(start)}, {mult(end)})"


def ext_later_per_position(root):
    """ext64-per-position's columns for the runs of docs/results/ext64_fox_nsa/: per model, the mean
    sliding-window test loss at L and each range of the longest windows minus the run's own sliding-window
    loss, paired over the seeds (eval-s<seed>.json, one per seed, each holding every model's rows)."""
    diffs, sliding, ranges = {}, {}, []
    for path in sorted(glob.glob(os.path.join(results_dir(root, EXT_LATER), "eval-s*.json"))):
        with open(path) as f:
            rows = json.load(f)
        for model in dict.fromkeys(r["run"].rsplit("-s", 1)[0] for r in rows):
            mine = [r for r in rows if r["run"].rsplit("-s", 1)[0] == model]
            window = next(r["test_loss"] for r in mine if "stride" in r)
            longest = max((r for r in mine if r.get("buckets")), key=lambda r: r["length"])
            ranges = [range_label(b["start"], b["end"], longest["block_size"]) for b in longest["buckets"]]
            sliding.setdefault(model, []).append(window)
            for i, b in enumerate(longest["buckets"]):
                diffs.setdefault(model, {}).setdefault(i, []).append(b["loss"] - window)
    return md_table(["model", "sliding window (mean)", *ranges],
                    [[EXT_LATER_LABELS.get(m, m), f"{sum(sliding[m]) / len(sliding[m]):.4f}",
                      *(delta(stats.paired(diffs[m][i], MARGIN), 3) for i in range(len(ranges)))] for m in diffs])


def fmt_shift(x):
    """A shift-invariance value: 0, 2.1e-6 (fp32 rounding), or 0.90."""
    if x == 0:
        return "0"
    return fmt_sci(x, 1) if x < 0.01 else f"{x:.2f}"


def positions750(root):
    st = study(root, "positions750")
    rows = [[p, f"{r['val_loss']:.3f}", ", ".join(f"{v:.1f}" for v in r["near_far"]), fmt_shift(r["shift_invariance"]),
             f"{r['same_token_ratio']:.2f} ({', '.join(f'{v:.2f}' for v in r['same_token_layers'])})"]
            for p, r in st["rows"].items()]
    uniform = st["uniform_near_far"]
    return md_table(["pos_encoding", "val loss @750", f"near/far weight, layers 0-3 (uniform: {uniform})",
                     "shift invariance", "same-token ratio (per layer)"], rows)


def rope_bound(root):
    lengths = (64, 256, 1024)
    return md_table(["head dim", *(f"L = {n}" for n in lengths)],
                    [[head_dim(), *(f"{round(rope_base_lower_bound(head_dim(), n)):,}" for n in lengths)]])


def yarn_regime(context):
    """RoPE.yarn_regime of the base studies' model (d_h, base) trained at `context`, default betas."""
    return RoPE(model_of(ROPE_CONFIG).config.rope_base, "yarn", 4.0, context).yarn_regime(head_dim())


def yarn_label(model, context):
    """A stretching row's name, with YaRN's regime at the trained length beside a yarn row."""
    return f"{model} ({yarn_regime(context)['regime']})" if model.startswith("yarn") else model


def base_paired(name, lengths):
    """Each base against 1e4, per length: Δ [95% CI] and, where the study decided one, its verdict."""
    def table(root):
        st = study(root, name)
        head, rows = ["rope_base"], []
        for n in lengths:
            head += [f"test L={n}"] + (["verdict"] if "verdict" in next(iter(st["paired"].values()))[str(n)] else [])
        for b, p in st["paired"].items():
            cells = [f"{int(b):,}"]
            for n in lengths:
                cells += [delta(p[str(n)], 3)] + ([verdict(p[str(n)])] if "verdict" in p[str(n)] else [])
            rows.append(cells)
        return md_table(head, rows)
    return table


def stretch_zero4(root):
    """Seeds 1-3 at evaluation time: the unscaled model's mean and ALiBi's Δ are the ext64 study's."""
    ext, rows = study(root, "ext64"), study(root, "ropestretch64")["zero_shot_x4_vs_none"]["rows"]
    out = []
    for i, n in enumerate(ext["lengths"]):
        out.append([n, f"{ext['test_loss']['rows']['rope'][i][0]:.4f}", *(delta(rows[s][str(n)], 3) for s in rows),
                    delta(ext["vs_rope"]["rows"]["alibi"][i], 3)])
    context = study(root, "ropebase64")["context"]
    return md_table(["L", "none (mean)", *(yarn_label(m, context) for m in rows), "ALiBi"], out)


def stretch_finetune3(root):
    rows = dict(study(root, "ropestretch64")["finetune_vs_none"]["rows"])
    none, context = rows.pop("none_mean"), study(root, "ropebase64")["context"]
    return md_table(["L", "none (mean)", *(yarn_label(m, context) for m in rows)],
                    [[n, f"{m:.4f}", *(delta(rows[s][n], 3) for s in rows)] for n, m in none.items()])


TABLES = {
    "ext64-vs-rope": ext_vs_rope,
    "ext64-per-position": ext_per_position,
    "ext64-fox-nsa-per-position": ext_later_per_position,
    "positions750": positions750,
    "rope-bound": rope_bound,
    "ropebase64-paired": base_paired("ropebase64", (64, 1024)),
    "ropebase256-paired": base_paired("ropebase256", (256, 1024, 4096)),
    "ropestretch64-x4": stretch_zero4,
    "ropestretch64-finetune": stretch_finetune3,
}
