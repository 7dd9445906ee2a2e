"""bench.py and compare.py produce what the README promises (the JSON keys, the report files)."""
import json
import os
import subprocess
import sys

import train
from helpers import ROOT, train_args

BENCH_KEYS = ("variant", "params", "train_tokens_per_sec", "decode_tokens_per_sec",
              "decode_tokens_per_sec_no_cache", "kv_cache_bytes_per_token",
              "kv_cache_bytes_per_token_formula", "device")


def test_bench_reports_every_variant_with_measured_cache(tmp_path):
    out = tmp_path / "bench.json"
    tiny = ["--set=--n_layer=2", "--set=--n_embd=32", "--set=--batch_size=2"]
    r = subprocess.run([sys.executable, "-m", "tools.bench", "config/mha.py", "config/gqa.py", "config/mqa.py",
                        "--json", str(out), "--repeats=1", "--context=8", "--decode_tokens=4", *tiny],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert [row["variant"] for row in rows] == ["mha", "gqa", "mqa"]
    for row in rows:
        assert all(key in row for key in BENCH_KEYS)
        assert row["kv_cache_bytes_per_token"] == row["kv_cache_bytes_per_token_formula"]
    d_h, fp32 = 32 // 4, 4   # config/*: 4 heads; gqa: 2 KV heads
    assert [row["kv_cache_bytes_per_token"] for row in rows] == [2 * n * d_h * 2 * fp32 for n in (4, 2, 1)]
    assert sum(line.startswith("| ") for line in r.stdout.splitlines()) == 4  # header + 3 rows


def test_bench_measures_a_hybrid_per_layer(tmp_path):
    """gla,mha: only the mha layer caches per token (K and V, 4 heads of 8, fp32); the gla
    layer keeps a constant (4, 8, 8) fp32 state."""
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "tools.bench", "config/gla.py", "--set=--attention=gla,mha",
                        "--set=--n_layer=2", "--set=--n_embd=32", "--set=--batch_size=2", "--json", str(out),
                        "--repeats=1", "--context=8", "--decode_tokens=4"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    row, = json.loads(out.read_text())
    assert row["attention"] == "gla,mha"
    assert row["kv_cache_bytes_per_token"] == row["kv_cache_bytes_per_token_formula"] == 2 * 4 * 8 * 4
    assert row["cache_constant_bytes"] == 4 * 8 * 8 * 4


def test_compare_writes_report(data_root, tmp_path):
    for name in ("a", "b"):
        train.main(train_args(data_root, tmp_path / name, "--max_iters=4", "--eval_interval=2"))
    r = subprocess.run([sys.executable, "-m", "tools.compare", str(tmp_path / "a"), str(tmp_path / "b"),
                        "--out", str(tmp_path / "rep")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "| a |" in report and "| b |" in report
    assert os.path.getsize(tmp_path / "rep" / "report.png") > 1000
    r = subprocess.run([sys.executable, "-m", "tools.compare", str(tmp_path / "missing")], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
