"""tools.scorecard: every column equals its source computed here or read from the tool that
measures it (summaries, the cache formulas written out, tools.eval's own JSON, MQAR runs)."""
import json
import math
import statistics
import subprocess
import sys

import pytest

import train
from helpers import ROOT, train_args
from tools import eval as length_eval
from tools import scorecard

T_975_1 = 12.706  # Student's t, 97.5% quantile, 1 degree of freedom (textbook tables)


@pytest.fixture(scope="module")
def study(data_root, tmp_path_factory):
    """mha and gla, 2 seeds each (10 steps, block_size 32), and an MQAR run named like mha."""
    root = tmp_path_factory.mktemp("study")
    for name, extra in (("mha", []), ("gla", ["--attention=gla", "--gla_chunk=16"])):
        for seed in (1, 2):
            train.main(train_args(data_root, root / f"{name}-s{seed}", "--max_iters=10", "--eval_interval=10",
                                  f"--seed={seed}", *extra))
    return root


@pytest.fixture(scope="module")
def mqar_run(tmp_path_factory):
    """A few steps on a small MQAR set (2 pairs), in a folder named like the mha runs."""
    root = tmp_path_factory.mktemp("mqar")
    subprocess.run([sys.executable, f"{ROOT}/data/mqar/prepare.py", f"--out_dir={root / 'mqar'}", "--seq_len=16",
                    "--num_pairs=2", "--vocab_size=32", "--num_train=200", "--num_val=50", "--num_test=0"], check=True)
    train.main(["--dataset=mqar", f"--data_dir={root}", f"--out_dir={root / 'runs' / 'mha-s1'}", "--device=cpu",
                "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=8", "--max_iters=4",
                "--eval_interval=2", "--eval_iters=2", "--log_interval=2", "--compile=False"])
    return root / "runs" / "mha-s1"


def test_columns_equal_their_sources(study, data_root, tmp_path, mqar_run):
    runs = [str(study / f"{n}-s{s}") for n in ("mha", "gla") for s in (1, 2)]
    scorecard.main([*runs, "--mqar", str(mqar_run), "--mqar_as", "gla=mha", "--context=64", "--split=val",
                    f"--data_dir={data_root}", "--steps=2", "--out", str(tmp_path)])
    rows = {r["config"]: r for r in json.loads((tmp_path / "scorecard.json").read_text())}
    assert (tmp_path / "scorecard.png").stat().st_size > 1000 and "| mha |" in (tmp_path / "scorecard.md").read_text()
    for name in ("mha", "gla"):
        summaries = [json.loads((study / f"{name}-s{s}" / "summary.json").read_text()) for s in (1, 2)]
        losses = [s["best_val_loss"] for s in summaries]
        r = rows[name]
        assert r["metric"] == "best_val_loss" and r["loss"] == pytest.approx(statistics.fmean(losses))
        assert r["loss_ci95_half"] == pytest.approx(T_975_1 * statistics.stdev(losses) / math.sqrt(2), rel=1e-3)
        assert r["train_tokens_per_sec"] == pytest.approx(statistics.fmean(s["tokens_per_sec"] for s in summaries))
    # memory, from the formulas: 2 layers; mha K and V of 4 heads x 8 dims in bf16; gla a 4 x 8 x 8 fp32 state
    assert (rows["mha"]["cache_bytes_per_token"], rows["mha"]["cache_state_bytes"]) == (2 * 2 * 4 * 8 * 2, 0)
    assert (rows["gla"]["cache_bytes_per_token"], rows["gla"]["cache_state_bytes"]) == (0, 2 * 4 * 8 * 8 * 4)
    # quality's paired difference: the two seeds' gla - mha
    diffs = [json.loads((study / f"gla-s{s}" / "summary.json").read_text())["best_val_loss"]
             - json.loads((study / f"mha-s{s}" / "summary.json").read_text())["best_val_loss"] for s in (1, 2)]
    assert rows["gla"]["delta"] == pytest.approx(statistics.fmean(diffs)) and rows["mha"]["delta"] is None
    # extrapolation: tools.eval's buckets at 4L = 128 and its stride-16 loss at L = 32, for seed 1
    out = tmp_path / "eval.json"
    length_eval.main([str(study / "mha-s1"), "--lengths=128", "--per_position", "--stride=16",
                      f"--data_dir={data_root}", "--json", str(out), "--plot", str(tmp_path / "e.png")])
    windows, strided = json.loads(out.read_text())
    past = sum(b["loss"] * (b["end"] - b["start"]) for b in windows["buckets"] if b["start"] >= 32) / 96
    assert rows["mha"]["extrapolation"] == pytest.approx(past - strided["val_loss"], abs=1e-5)
    # recall: the MQAR run named mha-s1, read for gla too through --mqar_as gla=mha
    mqar = json.loads((mqar_run / "summary.json").read_text())
    for name in ("mha", "gla"):
        assert rows[name]["mqar_acc"] == mqar["best_val_acc"] and rows[name]["mqar_pairs"] == 2


def test_a_variant_that_stops_at_block_size(data_root, tmp_path):
    """bigbird decodes at most block_size tokens: the timed steps end there, and it has no
    extrapolation column (its layout is defined on block_size)."""
    run = tmp_path / "bigbird-s1"
    train.main(train_args(data_root, run, "--max_iters=2", "--eval_interval=2", "--attention=bigbird",
                          "--sparse_block=8"))
    scorecard.main([str(run), "--context=64", "--split=val", f"--data_dir={data_root}", "--steps=4",
                    "--out", str(tmp_path / "card")])
    row = json.loads((tmp_path / "card" / "scorecard.json").read_text())[0]
    assert row["decode_context"] == 32 - 4 and row["extrapolation"] is None and row["decode_ms_per_token"] > 0
