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
    assert len(zoology.TABLES["zoology-families"](str(tmp_path))) == 2   # no family cell stored: header only


def test_an_unsolved_seed_changes_the_count_and_the_answer_column(tmp_path):
    folder = stored_copy(tmp_path)
    path = folder / "mha-s2" / "test_eval.json"
    rows = json.loads(path.read_text())
    rows[0]["test_acc"] = 0.5
    path.write_text(json.dumps(rows))
    accs, _ = raw(folder, "mha")
    row = row_of(zoology.TABLES["zoology-anchor"](str(tmp_path)), "mha")
    assert row["solved (test acc >= 0.95)"] == f"{len(accs) - 1}/{len(accs)}"
    assert answer.recall(str(tmp_path), "mha") == f"{statistics.mean(accs):.2f} / - / -"
    assert answer.recall(str(tmp_path), "gla") == "- / - / -"
