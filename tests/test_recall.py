"""tools.recall: each cell equals the runs' own accuracies (test where evaluated, else best val),
grouped by config, width and the row length and pairs their dataset holds; bytes kept equal the
cache and state formulas written out; steps to solve are the runs' own; chance comes from the files."""
import json
import math
import os
import shutil
import statistics
import subprocess
import sys

import numpy as np
import pytest
import torch

import train
from helpers import ROOT, train_args
from tools import eval as length_eval
from tools import reach, recall
from tools.tables import store
from trainer.rundir import Run


def mqar_data(root, pairs):
    subprocess.run([sys.executable, f"{ROOT}/data/mqar/prepare.py", f"--out_dir={root / f'p{pairs}'}", "--seq_len=16",
                    f"--num_pairs={pairs}", "--vocab_size=32", "--num_train=200", "--num_val=40", "--num_test=40"],
                   check=True)


def mqar_run(root, pairs, name, *extra):
    """40 steps: past chance, so the accuracies (and their paired differences) are not all zero."""
    out = root / "runs" / f"p{pairs}" / name
    train.main([f"--dataset=p{pairs}", f"--data_dir={root}", f"--out_dir={out}", "--device=cpu", "--n_layer=1",
                "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=16", "--max_iters=40",
                "--eval_interval=20", "--eval_iters=2", "--log_interval=20", "--learning_rate=1e-2",
                "--lr_decay_iters=40", "--warmup_iters=5", "--compile=False", *extra])
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """mha at 2 pairs (2 seeds) and 3 pairs (1 seed, evaluated on test), gla at 2 pairs (2 seeds), a
    run at 2 pairs that stops at its first evaluation past 1% accuracy, and swa (a window of 4) at 2 pairs."""
    root = tmp_path_factory.mktemp("recall")
    for pairs in (2, 3):
        mqar_data(root, pairs)
    runs = [mqar_run(root, 2, f"mha-s{s}", f"--seed={s}") for s in (1, 2)]
    runs.append(mqar_run(root, 3, "mha-s1"))
    runs += [mqar_run(root, 2, f"gla-s{s}", f"--seed={s}", "--attention=gla", "--gla_chunk=16") for s in (1, 2)]
    runs.append(mqar_run(root, 2, "stop-s1", "--stop_val_acc=0.01", "--eval_interval=10"))
    runs.append(mqar_run(root, 2, "swa-s1", "--attention=swa", "--sliding_window=4"))
    length_eval.main([str(runs[2]), "--split=test", "--lengths=16", "--json", str(runs[2] / "test_eval.json"),
                      "--plot", str(root / "e.png")])
    return runs


def kept(run_dirs, root):
    """Copies of the run folders as docs/results keeps them: summary.json and test_eval.json, no checkpoint;
    the settings hold a key of a variant these runs do not use away from today's default, as runs saved
    before a default changed do (delta_chunk was 64)."""
    out = []
    for d in run_dirs:
        copy = root / d.parent.name / d.name
        copy.mkdir(parents=True)
        if (d / "test_eval.json").exists():
            shutil.copy(d / "test_eval.json", copy / "test_eval.json")
        summary = json.loads((d / "summary.json").read_text())
        summary["settings"]["delta_chunk"] = 64
        (copy / "summary.json").write_text(json.dumps(summary))
        out.append(copy)
    return out


@pytest.mark.parametrize("files", ["with checkpoints", "kept without checkpoints"])
def test_cells_equal_the_runs(study, tmp_path, files):
    runs = study if files == "with checkpoints" else kept(study, tmp_path / "kept")
    recall.main([*map(str, runs[:5]), str(runs[0]), "--out", str(tmp_path)])   # a folder given twice counts once
    groups = {(g["config"], g["pairs"]): g for g in json.loads((tmp_path / "recall.json").read_text())}
    assert set(groups) == {("mha", 2), ("mha", 3), ("gla", 2), ("chance", 2), ("chance", 3)}
    assert {g["width"] for g in groups.values()} == {16, None} and {g["row_len"] for g in groups.values()} == {16}
    summary = [json.loads((d / "summary.json").read_text()) for d in study]
    two = groups[("mha", 2)]
    accs = [summary[0]["best_val_acc"], summary[1]["best_val_acc"]]
    assert two["n"] == 2 and two["metric"] == ["best_val_acc"]
    assert two["acc"] == pytest.approx(statistics.fmean(accs))
    assert two["acc_interval"] == [min(accs), max(accs)]   # below 3 seeds: min-max
    three = groups[("mha", 3)]   # the test evaluation is preferred over the val accuracy
    test_acc = json.loads((runs[2] / "test_eval.json").read_text())[0]["test_acc"]
    assert three["metric"] == ["test_acc"] and three["acc"] == pytest.approx(test_acc)
    # bytes kept after one row of 16 tokens, 1 layer: mha K and V of 2 heads x 8 dims in bf16;
    # gla no cache and a 2 heads x 8 x 8 fp32 state
    assert two["bytes_per_seq"] == 16 * 2 * 2 * 8 * 2
    assert groups[("gla", 2)]["bytes_per_seq"] == 2 * 8 * 8 * 4
    # gla against mha (the first config) at 2 pairs, paired by seed: the mean of the two differences
    diffs = [summary[3 + i]["best_val_acc"] - summary[i]["best_val_acc"] for i in (0, 1)]
    assert groups[("gla", 2)]["delta"] == pytest.approx(statistics.fmean(diffs)) and diffs[0] != diffs[1]
    assert two["delta"] is None and three["delta"] is None   # mha is the reference
    text = (tmp_path / "recall.md").read_text()
    assert "| mha |" in text and "2 pairs" in text and (tmp_path / "recall.png").stat().st_size > 1000


def test_without_out_the_outputs_go_to_a_folder_of_their_own(study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # never recall.md / .json / .png loose in the working folder
    recall.main([str(study[0])])
    assert os.listdir(tmp_path) == ["recall"]
    assert sorted(os.listdir(tmp_path / "recall")) == ["recall.json", "recall.md", "recall.png"]


def test_solved_counts_the_seeds_at_the_threshold(study, tmp_path):
    """--solved=a: the seeds of a group at accuracy >= a, counted from the runs' own summaries."""
    accs = sorted(json.loads((d / "summary.json").read_text())["best_val_acc"] for d in study[:2])   # mha, 2 pairs
    assert accs[0] < accs[1]   # two seeds that differ: the middle threshold splits them
    cases = [(accs[0], 2), ((accs[0] + accs[1]) / 2, 1)] + ([(accs[1] + 1e-6, 0)] if accs[1] < 1 - 1e-6 else [])
    for threshold, want in cases:
        recall.main([*map(str, study[:2]), "--out", str(tmp_path), f"--solved={threshold!r}"])
        group, = [g for g in json.loads((tmp_path / "recall.json").read_text()) if g["config"] != "chance"]
        assert group["solved"] == want
        assert f"solved {want}/2" in (tmp_path / "recall.md").read_text()
    proc = subprocess.run([sys.executable, "-m", "tools.recall", str(study[0]), "--solved=95"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--solved=95 is an accuracy" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_refuses_a_text_run(tmp_path, data_root):
    out = tmp_path / "mha-s1"
    train.main(train_args(data_root, out, "--max_iters=2", "--eval_interval=2"))
    proc = subprocess.run([sys.executable, "-m", "tools.recall", str(out), "--out", str(tmp_path / "r")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "not trained on an MQAR dataset" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_chance_comes_from_the_files_and_steps_from_the_runs(study, tmp_path):
    """Zoology's layout draws a row's values distinct: guessing among them scores 1/P, here 1/2 and 1/3
    (what the files hold, counted by tools.recall); the stopping run's steps are its target_reached_iter."""
    recall.main([*map(str, study), "--out", str(tmp_path)])
    groups = {(g["config"], g["pairs"]): g for g in json.loads((tmp_path / "recall.json").read_text())}
    assert groups[("chance", 2)]["acc"] == pytest.approx(1 / 2) and groups[("chance", 3)]["acc"] == pytest.approx(1 / 3)
    stop = json.loads((study[5] / "summary.json").read_text())
    assert stop["target_reached_iter"] is not None
    assert groups[("stop", 2)]["steps"] == stop["target_reached_iter"] and groups[("stop", 2)]["reached"] == 1
    assert groups[("mha", 2)]["steps"] is None and groups[("mha", 2)]["reached"] == 0
    assert "| chance (from the files) |" in (tmp_path / "recall.md").read_text()


@pytest.mark.parametrize("fault", ["dataset gone", "settings of another model"])
def test_a_kept_run_it_cannot_rebuild_is_refused_in_one_line(study, tmp_path, fault):
    run, = kept(study[:1], tmp_path / "kept")
    summary = json.loads((run / "summary.json").read_text())
    if fault == "dataset gone":
        summary["settings"]["data_dir"] = str(tmp_path / "nowhere")
    else:
        summary["settings"]["n_embd"] = 32
    (run / "summary.json").write_text(json.dumps(summary))
    proc = subprocess.run([sys.executable, "-m", "tools.recall", str(run), "--out", str(tmp_path / "r")],
                          cwd=ROOT, capture_output=True, text=True)
    want = "meta.json is missing" if fault == "dataset gone" else "give the run folder with its checkpoint"
    assert proc.returncode == 2 and want in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_pairs_a_window_leaves_out_are_counted_from_the_files(study, tmp_path):
    """One layer with a window of 4: a query reaches its pair iff its key and value are among its last 4
    tokens, counted here from the test files; dense attention reaches every pair and gets no row."""
    recall.main([str(study[0]), str(study[6]), "--out", str(tmp_path)])
    groups = {g["config"]: g for g in json.loads((tmp_path / "recall.json").read_text())}
    x = np.fromfile(study[6].parent.parent.parent / "p2" / "test.bin", dtype=np.uint16).reshape(-1, 16)
    y = np.fromfile(study[6].parent.parent.parent / "p2" / "test.targets.bin", dtype=np.int32).reshape(-1, 16)
    inside = [q - list(row).index(row[q]) < 4 and q - list(row).index(answers[q]) < 4
              for row, answers in zip(x, y) for q in np.flatnonzero(answers != -1)]
    assert 0 < sum(inside) < len(inside)
    assert groups["swa"]["reach"]["field"] == pytest.approx(np.mean(inside))
    # what the window costs the trained run: its accuracy on the queries inside and outside, from its
    # own predictions (argmax of the logits at each query) split by the window counted above
    model, _ = Run(str(study[6])).load_model("cpu")
    with torch.no_grad():
        pred = model(torch.from_numpy(x.astype(np.int64)))[0].argmax(-1).numpy()
    right = np.array([pred[r, q] == y[r, q] for r in range(len(y)) for q in np.flatnonzero(y[r] != -1)])
    inside = np.array(inside)
    assert groups["swa"]["reach"]["acc_direct"] == pytest.approx(right[inside].mean())
    assert groups["swa"]["reach"]["acc_outside"] == pytest.approx(right[~inside].mean())
    assert groups["swa"]["reach"]["acc_indirect"] is None          # one layer: in the window is a direct read
    dense = groups["mha"]["reach"]
    assert {k: dense[k] for k in ("field", "direct", "ceiling")} == {"field": 1, "direct": 1, "ceiling": 1}
    assert dense["acc_indirect"] is None and dense["acc_outside"] is None   # every query is read directly
    assert (study[6] / "reach.json").exists() and not (study[0] / "reach.json").exists()
    text = (tmp_path / "recall.md").read_text()
    table = text[text.index("Queries the pattern lets reach"):]
    assert "| swa | " in table and "| mha | " not in table


def test_a_content_chosen_reach_is_kept_with_the_run(study, tmp_path):
    """MoBA's reach is observed on the trained model (tools.reach on best.pt, counted here directly) and
    written to the run's reach.json, so the folder kept without checkpoints (tools.tables.store copies
    that file) reports the same counts; kept without it, nothing can be counted: content-chosen."""
    root = study[0].parent.parent.parent
    run = mqar_run(root, 2, "moba-s1", "--attention=moba", "--sparse_block=4", "--moba_topk=1")
    model, _ = Run(str(run)).load_model("cpu")
    want = reach.reach(model, str(root / "p2"), 16, observe=True, accuracy=True)
    assert want["field"] is not None and want["acc_direct"] is not None
    recall.main([str(run), "--out", str(tmp_path / "trained")])
    assert json.loads((run / "reach.json").read_text()) == want
    store.store(str(run.parent), "kept", configs=["moba"], root=str(tmp_path))
    stored = tmp_path / "docs" / "results" / "kept" / "moba-s1"
    assert (stored / "reach.json").exists() and not list(stored.glob("*.pt"))
    lost = kept([run], tmp_path / "no-reach")[0]   # summary and test evaluation only
    for folder, counts in ((stored, want), (lost, dict.fromkeys(("field", "direct", "ceiling")))):
        recall.main([str(folder), "--out", str(tmp_path / folder.parent.name)])
        group, = [g for g in json.loads((tmp_path / folder.parent.name / "recall.json").read_text())
                  if g["config"] == "moba"]
        assert group["reach"] == (pytest.approx(counts) if counts["field"] is not None else counts)


def test_a_seed_run_at_two_rates_counts_once_by_its_val_accuracy(study, tmp_path):
    """The same config, cell and seed at two learning rates: the run of the better best val accuracy is
    the cell's, even where the other's test accuracy is higher (selection on val, report on test)."""
    first, second = kept([study[0]], tmp_path / "a") + kept([study[0]], tmp_path / "b")
    for folder, lr, val, test in ((first, 3e-3, 0.40, 0.90), (second, 1e-3, 0.80, 0.70)):
        summary = json.loads((folder / "summary.json").read_text())
        summary.update(learning_rate=lr, best_val_acc=val, test_acc=test)
        (folder / "summary.json").write_text(json.dumps(summary))
    recall.main([str(first), str(second), "--out", str(tmp_path / "out")])
    (group,) = [g for g in json.loads((tmp_path / "out" / "recall.json").read_text()) if g["config"] == "mha"]
    assert group["n"] == 1 and group["acc"] == pytest.approx(0.70)
    assert group["learning_rates"] == [1e-3] and group["rates_tried"] == 2
    assert "at 0.001 (chosen on val of 2 rates)" in (tmp_path / "out" / "recall.md").read_text()


def test_the_interval_is_the_t_interval_cut_to_accuracys_range():
    """From 3 seeds the 95% t interval of the mean (t_{0.975, 2} = 4.303), cut to [0, 1]: seeds split
    between solved and chance would otherwise put it past both ends."""
    def t95(values):
        half = 4.302652729911275 * statistics.stdev(values) / math.sqrt(len(values))
        return statistics.fmean(values) - half, statistics.fmean(values) + half
    close = [0.970, 0.975, 0.978]
    assert recall.interval(close) == pytest.approx(t95(close))
    split = [0.958, 0.238, 0.921]
    assert t95(split)[0] < 0 and t95(split)[1] > 1
    assert recall.interval(split) == (0.0, 1.0)
