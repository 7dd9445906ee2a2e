"""docs/linear.md's tables: the linear-attention ladder (docs/results/ladder256, ladder256_fixed), whose
mha, gla and gla_bare are the fair study's runs (docs/results/fair256), with the positions, cache and
state bytes and parameters of each config from the code.
"""
import json
import os

from tools.tables.source import (
    CACHE_UNIT,
    cache_bytes,
    delta,
    md_table,
    mean_sd,
    model_of,
    results_dir,
    state_bytes,
    study,
    verdict,
)


def ladder_runs(root):
    """Per config: its losses (the fair study's for the reused runs), positions and decoding memory."""
    st, fair = study(root, "ladder256"), study(root, "fair256")
    rows = []
    for c, config in st["configs"].items():
        r = fair["runs"][c] if c in st["reused_from_fair256"] else st["runs"][c]
        m = model_of(config)
        rows.append([c, r["n"], m.config.pos_encoding, mean_sd(r["best_val"]), mean_sd(r["test"]),
                     f"{cache_bytes(m):,}", f"{state_bytes(m):,}"])
    return md_table(["config", "n", "positions", "best val (mean ± sd)", "test (mean ± sd)",
                     f"KV cache B/token ({CACHE_UNIT})", "constant state B (fp32)"], rows)


def ladder_paired(root):
    """Against mha: this study's verdicts (Holm over its 6 rows); the reused runs' Δ from the fair study."""
    st, fair = study(root, "ladder256"), study(root, "fair256")
    rows = []
    for c in st["paired"]["test"]:
        cells = [c]
        for split in ("test", "val"):
            mine = st["paired"][split][c]
            cells += [delta(fair["paired"][split][c] if c in st["reused_from_fair256"] else mine), verdict(mine)]
        rows.append(cells)
    return md_table(["config", "test Δ [95% CI]", "verdict", "val Δ [95% CI]", "verdict"], rows)


def ladder_rungs(root):
    rows = study(root, "ladder256")["rungs"]["rows"]
    return md_table(["step", "Δ [95% CI]", "p", "verdict"], [[r["step"], delta(r), f"{r['p']:.2g}", r["verdict"]]
                                                            for r in rows])


def ladder_bench(root):
    """tools.bench side by side, with each config's parameters (its default MLP) from the code."""
    st = study(root, "ladder256")
    configs = {**st["configs"], "linear_fixed": "config/ladder256/linear_fixed.py"}
    return md_table(["config", "params", "train tok/s", "decode tok/s, cache", "decode tok/s, no cache"],
                    [[c, f"{model_of(configs[c]).num_params() / 1e6:.2f}M", f"{r['train_tokens_per_sec']:,}",
                      f"{r['decode_tokens_per_sec']:.1f}", f"{r['decode_tokens_per_sec_no_cache']:.1f}"]
                     for c, r in st["bench"]["rows"].items()])


def delta_bench(root):
    """tools.bench's rows for the delta-rule rungs (docs/results/ladder256_delta/bench.json), one run side
    by side, each against mha's."""
    with open(os.path.join(results_dir(root, "ladder256_delta"), "bench.json")) as f:
        rows = json.load(f)
    ref = rows[0]
    return md_table(["config", "params", "train tok/s", "vs mha", "decode tok/s, cache", "vs mha",
                     "decode tok/s, no cache"],
                    [[r["variant"], f"{r['params'] / 1e6:.2f}M", f"{r['train_tokens_per_sec']:,.0f}",
                      f"{r['train_tokens_per_sec'] / ref['train_tokens_per_sec']:.2f}x",
                      f"{r['decode_tokens_per_sec']:.1f}",
                      f"{r['decode_tokens_per_sec'] / ref['decode_tokens_per_sec']:.2f}x",
                      f"{r['decode_tokens_per_sec_no_cache']:.1f}"] for r in rows])


def ladder_fixed(root):
    return md_table(["step", "Δ on test [95% CI]", "verdict"],
                    [[r["step"], delta(r), r["verdict"]] for r in study(root, "ladder256_fixed")["steps"]["rows"]])


TABLES = {
    "ladder256-runs": ladder_runs,
    "ladder256-paired": ladder_paired,
    "ladder256-rungs": ladder_rungs,
    "ladder256-bench": ladder_bench,
    "ladder256-fixed": ladder_fixed,
    "ladder256-delta-bench": delta_bench,
}
