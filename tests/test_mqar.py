"""MQAR (data/mqar/prepare.py) and datasets of aligned examples in training: the generator's
answers checked by parsing each row here, its refusals, and loss and accuracy counted on exactly the
marked positions (against a computation by hand from the checkpoint)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import train
from helpers import ROOT
from model import GPT, GPTConfig
from tools import eval as length_eval

PREPARE = os.path.join(ROOT, "data", "mqar", "prepare.py")


def prepare(out_dir, *flags):
    return subprocess.run([sys.executable, PREPARE, f"--out_dir={out_dir}", *flags], capture_output=True, text=True)


def rows(out_dir, split, seq_len):
    x = np.fromfile(os.path.join(out_dir, f"{split}.bin"), dtype=np.uint16).reshape(-1, seq_len)
    y = np.fromfile(os.path.join(out_dir, f"{split}.targets.bin"), dtype=np.int32).reshape(-1, seq_len)
    return x.astype(np.int64), y.astype(np.int64)


def test_every_query_asks_a_key_of_its_row_and_its_answer_is_never_in_the_input(tmp_path):
    """Zoology's layout, parsed here: distinct keys and values in two halves, each key queried once
    after the pairs, the query holds the key alone and no value of the row appears after the pairs."""
    r = prepare(tmp_path, "--seq_len=48", "--num_pairs=6", "--vocab_size=40", "--num_train=300", "--num_val=20",
                "--num_test=20", "--seed=3")
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert (meta["format"], meta["row_len"], meta["ignore_index"], meta["vocab_size"]) == ("examples", 48, -1, 40)
    for split in ("train", "val", "test"):
        x, y = rows(tmp_path, split, 48)
        assert len(x) == meta[f"{split}_examples"]
        for xi, yi in zip(x, y):
            keys, values = xi[0:12:2], xi[1:12:2]
            assert len(set(keys.tolist())) == 6 and len(set(values.tolist())) == 6          # both drawn distinct
            assert keys.min() >= 1 and keys.max() < 20 <= values.min() and values.max() < 40
            pairs = dict(zip(keys.tolist(), values.tolist()))
            counted = np.flatnonzero(yi != -1)
            assert len(counted) == 6 and counted.min() >= 12                          # one query per key, after
            assert sorted(xi[counted].tolist()) == sorted(keys.tolist())
            assert sorted(xi[xi < 20].tolist()) == sorted(keys.tolist() * 2)            # keys nowhere else
            assert not set(xi[12:].tolist()) & set(values.tolist())                    # no answer after the pairs
            for q in counted:
                assert yi[q] == pairs[xi[q]]


def binding_free_guesses(x, y, num_pairs, rng):
    """Accuracies of strategies that never read which value was paired with which key, on every
    query of the files (x, y: rows): (a) the token after the query (the old layout's leak); (b) a
    uniform guess among the row's values not yet seen after the pairs (the old files' shortcut:
    0.70-0.76 at 2 pairs), (c) the value of the pair whose position matches the query's rank."""
    hits = {"next token": [], "unseen values": [], "pair by rank": []}
    ctx = 2 * num_pairs
    for xi, yi in zip(x, y):
        values = xi[1:ctx:2].tolist()
        for rank, q in enumerate(np.flatnonzero(yi != -1)):
            hits["next token"].append(q + 1 < len(xi) and xi[q + 1] == yi[q])
            unseen = [v for v in values if v not in xi[ctx:q + 1].tolist()]
            hits["unseen values"].append(rng.choice(unseen) == yi[q] if unseen else False)
            hits["pair by rank"].append(values[rank] == yi[q])
    return {name: float(np.mean(h)) for name, h in hits.items()}, len(hits["next token"])


@pytest.mark.parametrize("num_pairs", [2, 4])
def test_nothing_that_ignores_the_binding_beats_chance(tmp_path, num_pairs):
    """On the written files a binding-free strategy scores 1/P within sampling error (4 standard
    errors of a Bernoulli(1/P) mean), and the answer never follows its query."""
    assert prepare(tmp_path, "--seq_len=32", f"--num_pairs={num_pairs}", "--vocab_size=64", "--num_train=3000",
                   "--num_val=10", "--num_test=0", "--seed=5").returncode == 0
    x, y = rows(tmp_path, "train", 32)
    accuracy, n = binding_free_guesses(x, y, num_pairs, np.random.default_rng(0))
    chance = 1 / num_pairs
    assert accuracy["next token"] == 0
    for name in ("unseen values", "pair by rank"):
        assert abs(accuracy[name] - chance) < 4 * (chance * (1 - chance) / n) ** 0.5, (name, accuracy)


def test_seeded_files_repeat_and_seeds_differ(tmp_path):
    flags = ["--seq_len=32", "--num_pairs=4", "--vocab_size=64", "--num_train=50", "--num_val=10", "--num_test=0"]
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert prepare(tmp_path / name, *flags, f"--seed={seed}").returncode == 0
    read = {n: (tmp_path / n / "train.bin").read_bytes() + (tmp_path / n / "train.targets.bin").read_bytes()
            for n in "abc"}
    assert read["a"] == read["b"] != read["c"]
    assert not (tmp_path / "a" / "test.bin").exists()


@pytest.mark.parametrize("flags,words", [
    (["--seq_len=32", "--num_pairs=9"], "do not fit in --seq_len=32"),
    (["--vocab_size=12", "--num_pairs=8"], "holds 5 keys"),
    (["--vocab_size=20", "--num_pairs=10", "--seq_len=64"], "one filler token"),
    (["--seed=-1"], "--seed=-1 must be in [0, 2**32)"),
    (["--num_train=1e12"], "GiB free"),
    (["--power_a=0"], "--power_a=0.0 must be in (0, 1]"),
    (["--num_pairs=0"], "--num_pairs=0 must be at least 1"),
])
def test_bad_parameters_are_one_line(tmp_path, flags, words):
    r = prepare(tmp_path / "out", *flags)
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out" / "meta.json").exists()


def read_log(out_dir):
    return [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]


def hand_dataset(root):
    """A dataset of examples written here: 64 training rows and one validation row of 16 tokens,
    3 counted targets in it (the others -1)."""
    folder = root / "hand"
    folder.mkdir()
    g = np.random.default_rng(0)
    for split, n in (("train", 64), ("val", 1)):
        x = g.integers(0, 20, (n, 16))
        y = np.full((n, 16), -1)
        y[:, [5, 9, 15]] = g.integers(0, 20, (n, 3))
        x.astype(np.uint16).tofile(folder / f"{split}.bin")
        y.astype(np.int32).tofile(folder / f"{split}.targets.bin")
    (folder / "meta.json").write_text(json.dumps({"vocab_size": 20, "dtype": "uint16", "tokenizer": "none",
                                                  "format": "examples", "row_len": 16, "ignore_index": -1}))
    return folder


def tiny_run(root, out, *extra):
    return train.main(["--dataset=hand", f"--data_dir={root}", f"--out_dir={out}", "--device=cpu", "--n_layer=1",
                       "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--eval_iters=3",
                       "--log_interval=1", "--compile=False", *extra])


def test_loss_and_accuracy_count_exactly_the_marked_targets(tmp_path):
    """The single validation row is every evaluation window, so the logged val loss and accuracy are
    that row's, computed here from the checkpoint over positions 5, 9 and 15 only."""
    folder = hand_dataset(tmp_path)
    tiny_run(tmp_path, tmp_path / "run", "--max_iters=1", "--eval_interval=1")
    last = read_log(tmp_path / "run")[-1]
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    x = torch.from_numpy(np.fromfile(folder / "val.bin", dtype=np.uint16).astype(np.int64))
    y = np.fromfile(folder / "val.targets.bin", dtype=np.int32)
    with torch.no_grad():
        logp = model.eval()(x[None])[0][0].double().log_softmax(-1)
    marked = [5, 9, 15]
    assert last["val_loss"] == pytest.approx(-np.mean([logp[t, y[t]].item() for t in marked]), abs=1e-5)
    assert last["val_acc"] == pytest.approx(np.mean([logp[t].argmax().item() == y[t] for t in marked]), abs=1e-6)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 <= summary["best_val_acc"] <= 1 and summary["final_val_acc"] == last["val_acc"]
    # tools.eval reads the same rows: the one validation row at its length, other lengths n/a
    out = tmp_path / "eval.json"
    length_eval.main([str(tmp_path / "run"), "--ckpt=last", "--lengths=16,32", f"--data_dir={tmp_path}",
                      "--json", str(out), "--plot", str(tmp_path / "e.png")])
    at16, at32 = json.loads(out.read_text())
    assert at16["val_loss"] == pytest.approx(last["val_loss"], abs=1e-5) and at16["val_acc"] == last["val_acc"]
    assert at32["val_loss"] is None


def test_examples_need_block_size_equal_to_the_row(tmp_path):
    hand_dataset(tmp_path)
    r = subprocess.run([sys.executable, "train.py", "--dataset=hand", f"--data_dir={tmp_path}", "--device=cpu",
                        f"--out_dir={tmp_path / 'run'}", "--block_size=8"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "set block_size=16" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_softmax_attention_learns_mqar_and_a_short_window_cannot(tmp_path):
    """Measured (docs/recall.md): 2 layers of width 64 reach 0.95 accuracy on 16-token rows with 2
    pairs within 500 steps of 64 rows. A sliding window of 2 tokens, same budget, cannot reach the
    pairs from most queries (its 2 layers see 3 tokens back): the accuracy must stay far below.
    stop_val_acc ends the softmax run at the first evaluation that reaches it, as its log shows."""
    assert prepare(tmp_path / "mqar", "--seq_len=16", "--num_pairs=2", "--vocab_size=32", "--num_train=20000",
                   "--num_val=500", "--num_test=0").returncode == 0
    summary = {}
    for name, extra in (("mha", ["--stop_val_acc=0.95"]), ("swa", ["--attention=swa", "--sliding_window=2"])):
        train.main(["--dataset=mqar", f"--data_dir={tmp_path}", f"--out_dir={tmp_path / name}", "--device=cpu",
                    "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=16", "--batch_size=64",
                    "--learning_rate=3e-3", "--min_lr=3e-4", "--weight_decay=0", "--warmup_iters=100",
                    "--max_iters=500", "--lr_decay_iters=500", "--eval_interval=50", "--eval_iters=8",
                    "--log_interval=500", "--compile=False", *extra])
        summary[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert summary["mha"]["final_val_acc"] >= 0.95, summary["mha"]
    assert summary["swa"]["final_val_acc"] <= 0.75, summary["swa"]
    first = next(e["iter"] for e in read_log(tmp_path / "mha") if e["val_acc"] >= 0.95)
    mha = summary["mha"]
    assert mha["target_reached_iter"] == mha["iters"] == first < 500 and mha["finished"] is True
    assert summary["swa"]["target_reached_iter"] is None and summary["swa"]["iters"] == 500


def test_stop_val_acc_is_refused_on_text_and_outside_zero_one(tmp_path):
    hand_dataset(tmp_path)
    for flag, words in (("--stop_val_acc=1.5", "must be in [0, 1]"), ("--stop_val_acc=-0.1", "must be in [0, 1]")):
        r = subprocess.run([sys.executable, "train.py", "--dataset=hand", f"--data_dir={tmp_path}", "--device=cpu",
                            f"--out_dir={tmp_path / 'run'}", "--block_size=16", flag], cwd=ROOT, capture_output=True,
                           text=True)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    text = tmp_path / "text"
    text.mkdir()
    np.arange(100, dtype=np.uint16).tofile(text / "train.bin")
    np.arange(100, dtype=np.uint16).tofile(text / "val.bin")
    (text / "meta.json").write_text(json.dumps({"vocab_size": 100, "dtype": "uint16", "tokenizer": "none"}))
    r = subprocess.run([sys.executable, "train.py", "--dataset=text", f"--data_dir={tmp_path}", "--device=cpu",
                        f"--out_dir={tmp_path / 'run'}", "--block_size=16", "--stop_val_acc=0.9"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "has no accuracy" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "run").exists()
