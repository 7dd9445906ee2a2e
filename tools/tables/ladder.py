"""docs/linear.md's tables: the linear-attention ladder (docs/results/ladder256, ladder256_fixed), whose
mha, gla and gla_bare are the fair study's runs (docs/results/fair256), with the positions, cache and
state bytes and parameters of each config from the code.
"""

from tools.tables.source import (
    delta,
    md_table,
    study,
    verdict,
)


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


def ladder_fixed(root):
    return md_table(["step", "Δ on test [95% CI]", "verdict"],
                    [[r["step"], delta(r), r["verdict"]] for r in study(root, "ladder256_fixed")["steps"]["rows"]])


TABLES = {
    "ladder256-paired": ladder_paired,
    "ladder256-rungs": ladder_rungs,
    "ladder256-fixed": ladder_fixed,
}
