"""The loss studies' tables (docs/results.md, docs/sparse.md, docs/linear.md),
in the formats tools.compare and tools.scorecard print, from docs/results/<study>/table.json and the
configs built on the meta device (parameters, cache and state bytes, iterations, training FLOPs).
"""

from tools import budget, compare, scorecard
from tools.tables import zoology
from tools.tables.source import (
    cache_bytes,
    delta,
    keys_of,
    md_table,
    mean_sd,
    model_of,
    state_bytes,
    study,
    verdict,
)


def config_of(st, name):
    """(config file, overrides) a study ran a config with: the sweep's overrides, then its plan's."""
    if "plan" in st:
        entry = st["plan"]["configs"][name]
        return entry["config"], tuple(st["sweep_overrides"] + entry["overrides"])
    return st["configs"][name], tuple(st.get("sweep_overrides", []))


def model(st, name):
    config, overrides = config_of(st, name)
    return model_of(config, overrides, st.get("vocab_size", 65))


def group_stats(st, name):
    """tools.compare's numbers of one config's row: the runs' from the file, the rest from the code."""
    r, m = st["runs"][name], model(st, name)
    keys = keys_of(*config_of(st, name))
    n = r["n"]

    def stat(key, scale=1):
        mean, sd = r.get(key) or (None, None)
        return (None if mean is None else mean * scale, None if sd is None else sd * scale, n)
    flops = st.get("plan", {}).get("configs", {}).get(name, {}).get("flops_per_token")
    return {"n": n, "attention": m.config.attention, "pos_encoding": m.config.pos_encoding, "params": m.num_params(),
            "kv_cache_bytes_per_token": cache_bytes(m), "cache_state_bytes": state_bytes(m),
            "best_val_loss": stat("best_val"), "final_val_loss": stat("final_val"), "test_loss": stat("test"),
            "tokens_per_sec": stat("tokens_per_sec"), "peak_mem_bytes": stat("peak_mem_mib", 2 ** 20),
            "wall_s": (r.get("wall_s"), None, n), "iters": (keys["max_iters"], None, n),
            "train_flops": (flops and flops * budget.tokens_per_iter(keys) * keys["max_iters"], None, n)}


def delta_best(st, name, ref):
    """The Δ best val column: the paired val mean where the study has one (the same difference of means,
    unrounded), else the difference the docs stated."""
    if name == ref:
        return "(reference)"
    paired = st.get("paired", {}).get("val", {}).get(name)
    return f"{paired['mean'] if paired else st['runs'][name]['delta_best_val']:+.4f}"


def runs_table(name):
    def table(root):
        st = study(root, name)
        ref = next(iter(st["runs"]))
        return compare.runs_header(ref) + [compare.table_row(c, group_stats(st, c), delta_best(st, c, ref))
                                           for c in st["runs"]]
    return table


def paired_table(name, split):
    return lambda root: compare.paired_table(study(root, name)["paired"][split])


def plan_table(name):
    def table(root):
        st = study(root, name)
        configs = st["plan"]["configs"]
        return compare.plan_table({c: {**e, "params": model(st, c).num_params()} for c, e in configs.items()})
    return table


def fair256_params(root):
    """What each config's attention costs in parameters, and the MLP width that matched them to mha's."""
    st = study(root, "fair256")
    rows = []
    for c, e in st["plan"]["configs"].items():
        plain, matched = model_of(e["config"]), model(st, c)
        rows.append([c, f"{sum(p.numel() for p in plain.h[0].attn.parameters()):,}", f"{plain.num_params():,}",
                     keys_of(*config_of(st, c))["mlp_hidden"] or "4 x n_embd", f"{matched.num_params():,}"])
    return md_table(["config", "attention params per layer", "params as configured", "mlp_hidden matched",
                     "params matched"], rows)


# The scorecard's recall column: Zoology's MQAR model at 64-token rows, width 64, RECALL_PAIRS pairs
# (tools/tables/zoology.py: mha reads the anchor's 4-head mha4); configs the families lack get "-".
RECALL_PAIRS = 8


def recall_accuracy(root, configs):
    """{config: (accuracy, pairs)} of the configs stored in Zoology's cell of RECALL_PAIRS pairs."""
    accs = {c: zoology.test_accuracy(root, c, RECALL_PAIRS) for c in configs}
    return {c: (a, RECALL_PAIRS) for c, a in accs.items() if a is not None}


def scorecard_rows(st, recall):
    """tools.scorecard's rows of the fair study: the file's numbers, the cache and state from the code,
    recall from Zoology's cells (recall_accuracy)."""
    card, rows = st["scorecard"], []
    for c, sc in card["rows"].items():
        m, r, p = model(st, c), st["runs"][c], st["paired"]["test"].get(c)
        acc, pairs = recall.get(c, (None, None))
        rows.append({"config": c, "attention": m.config.attention, "pos_encoding": m.config.pos_encoding,
                     "n": r["n"], "metric": "test_loss", "loss": r["test"][0], "loss_ci95_half": sc["test_ci95_half"],
                     "delta": p and p["mean"], "delta_ci95": p and p["ci95"], "verdict": p and p["verdict"],
                     "mqar_acc": acc, "mqar_pairs": pairs, "extrapolation": sc["extrapolation"],
                     "context": card["context"],
                     "cache_bytes_per_token": cache_bytes(m, card["context"]), "cache_state_bytes": state_bytes(m),
                     "train_tokens_per_sec": r["tokens_per_sec"][0], "decode_ms_per_token": sc["decode_ms_per_token"]})
    return rows


def fair256_scorecard(root):
    st = study(root, "fair256")
    return scorecard.table_lines(scorecard_rows(st, recall_accuracy(root, st["runs"])), "mha")


def sparse512_results(root):
    st = study(root, "sparse512")
    test, val = st["paired"]["test"], st["paired"]["val"]
    return md_table(["config", "test loss (mean ± std)", "Δ test [95% CI]", "verdict", "Δ best val [95% CI]",
                     "verdict on val"],
                    [[c, mean_sd(r["test"]), delta(test.get(c)), verdict(test.get(c)), delta(val.get(c)),
                      verdict(val.get(c))] for c, r in st["runs"].items()])


TABLES = {
    "fair256-params": fair256_params,
    "fair256-paired-test": paired_table("fair256", "test"),
    "fair256-scorecard": fair256_scorecard,
    "sparse512-results": sparse512_results,
}
