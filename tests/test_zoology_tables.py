"""docs/recall.md's Zoology tables and the answer table's recall column, against the stored JSON read
directly: solved k/n counts test accuracy >= 0.95, the median step to val 0.99 over the seeds that got
there, the chosen rate starred; an edited test accuracy moves every cell it feeds."""
import json
import shutil
import statistics
from pathlib import Path

from tools.tables import answer, zoology

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "docs" / "results" / "zoology" / "anchor-w64-p4"


def stored_copy(tmp_path):
    dst = tmp_path / "docs" / "results" / "zoology" / "anchor-w64-p4"
    shutil.copytree(STORED, dst)
    return dst


def raw(folder, config):
    """(test accuracies, steps to val 0.99) of a config's seed runs, from the files themselves."""
    accs, steps = [], []
    for run in sorted(folder.glob(f"{config}-s*")):
        accs.append(json.loads((run / "test_eval.json").read_text())[0]["test_acc"])
        reached = json.loads((run / "summary.json").read_text()).get("target_reached_iter")
        if reached is not None:
            steps.append(reached)
    return accs, steps


def row_of(table, config):
    head = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in table[2:]]
    return next(r for r in rows if r["config"] == config)


def test_the_anchor_row_is_the_stored_runs(tmp_path):
    folder = stored_copy(tmp_path)
    accs, steps = raw(folder, "mha")
    row = row_of(zoology.TABLES["zoology-anchor"](str(tmp_path)), "mha")
    assert row["test acc (seeds)"] == ", ".join(f"{a:.3f}" for a in accs)
    assert row["solved (test acc >= 0.95)"] == f"{sum(a >= 0.95 for a in accs)}/{len(accs)}"
    assert row["median step to val 0.99"] == f"{statistics.median(steps):,.0f}"
    rate = json.loads((folder / "plan.json").read_text())["configs"]["mha"]["learning_rate"]
    starred = [k for k, v in row.items() if v.endswith(" *")]
    assert starred == [f"lr {zoology.rate_label(rate)}"]
    # a probe that missed val 0.99 never reads as 0.99
    assert zoology.grid_cell({"target_reached_iter": None, "best_val_acc": 0.9899}, chosen=False) == "- (0.98)"
    assert len(zoology.TABLES["zoology-families"](str(tmp_path))) == 2   # no family cell stored: header only


def test_an_unsolved_seed_changes_the_count_and_the_answer_column(tmp_path):
    folder = stored_copy(tmp_path)
    for config in ("mha", "mha4"):
        path = folder / f"{config}-s2" / "test_eval.json"
        rows = json.loads(path.read_text())
        rows[0]["test_acc"] = 0.5
        path.write_text(json.dumps(rows))
    accs, _ = raw(folder, "mha")
    row = row_of(zoology.TABLES["zoology-anchor"](str(tmp_path)), "mha")
    assert row["solved (test acc >= 0.95)"] == f"{len(accs) - 1}/{len(accs)}"
    # the answer's MHA row is the 4-head anchor (every family has 4 query heads)
    assert answer.recall(str(tmp_path), "mha") == f"{statistics.mean(raw(folder, 'mha4')[0]):.2f} / - / -"
    assert answer.recall(str(tmp_path), "gla") == "- / - / -"


def group(config, pairs, acc, n=1, width=64):
    """One of tools.recall's groups (recall.json), with only what the table reads."""
    return {"config": config, "width": width, "row_len": 64, "pairs": pairs, "n": n, "acc": acc,
            "acc_interval": [acc, acc], "solved": int(acc >= 0.95) * n, "steps": None, "reached": 0,
            "params": 1000 + len(config), "bytes_per_seq": 10 * len(config), "learning_rates": [0.01],
            "rates_tried": 1}


def test_the_study_table_puts_each_cell_beside_the_older_setups(tmp_path):
    """zoology-study-w64: per pair count, Zoology's cell then the older setup's (docs/results/recall/study),
    each read from its own recall.json; '-' where the older setup has no such config."""
    new = [group("gla", 8, 0.91), group("mha4", 8, 0.99, n=3), group("chance", 8, 0.125),
           group("mha4", 8, 0.97, n=3, width=128)]
    old = [group("gla", 8, 0.42), group("chance", 8, 0.125), group("gla", 4, 0.33), group("gla", 8, 0.5, width=128)]
    for study, groups in (("zoology", new), ("recall", old)):
        path = tmp_path / "docs" / "results" / study / "study" / "recall.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(groups))
    table = zoology.TABLES["zoology-study-w64"](str(tmp_path))
    gla, mha4 = row_of(table, "gla"), row_of(table, "mha4")
    assert gla["8 pairs"].startswith("0.910; 0/1") and gla["8 pairs, older setup"].startswith("0.420; 0/1")
    assert mha4["8 pairs"].startswith("0.990 [0.990, 0.990]; 3/3") and mha4["8 pairs, older setup"] == "-"
    assert gla["params"] == "1,003" and gla["bytes kept / sequence"] == "30"
    assert "4 pairs" not in table[0]   # the older setup's other cells are not columns of their own
    assert row_of(table, "chance (from the files)")["8 pairs"] == "0.125"
    # the width-128 table holds the configs that ran at 128, each beside the older setup's at 128
    wide = zoology.TABLES["zoology-study-w128"](str(tmp_path))
    assert row_of(wide, "mha4")["8 pairs"].startswith("0.970 [0.970, 0.970]; 3/3")
    assert "gla" not in [r.split("|")[1].strip() for r in wide[2:]]
    assert row_of(table, "mha4")["8 pairs"].startswith("0.990")   # width 64's table keeps its own cell
