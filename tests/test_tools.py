"""bench.py and compare.py produce what the README promises (the JSON keys, the report files)."""
import json
import os
import subprocess
import sys

import pytest
import torch

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


def tool_modules():
    """tools.X and tools.benchmarks.X for every file that defines main() and runs it as a script."""
    import ast
    names = []
    for folder, package in (("tools", "tools"), (os.path.join("tools", "benchmarks"), "tools.benchmarks")):
        for file in sorted(os.listdir(os.path.join(ROOT, folder))):
            if not file.endswith(".py") or file == "__init__.py":
                continue
            with open(os.path.join(ROOT, folder, file)) as f:
                tree = ast.parse(f.read())
            has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
            runs_main = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
            if has_main and runs_main:
                names.append(f"{package}.{file[:-3]}")
    return names


# Runs every module as `python -m NAME --help` would (runpy, import-time code included), each in turn
# in one child process: one torch import for all of them.
HELP_RUNNER = """
import contextlib, io, json, runpy, sys
results = {}
for name in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [name, "--help"]
    code = "returned without exiting"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code or 0
    results[name] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(results))
"""


def test_every_tool_prints_help_and_exits_0():
    modules = tool_modules()
    assert {"tools.sweep", "tools.plan", "tools.compile_check", "tools.compare", "tools.benchmarks.mla"} <= set(modules)
    r = subprocess.run([sys.executable, "-c", HELP_RUNNER, *modules], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout.strip().splitlines()[-1])
    for name in modules:
        got = results[name]
        assert got["code"] == 0 and got["stdout"].startswith("usage:"), (name, got)
        assert "--help" in got["stdout"] and "Traceback" not in got["stderr"], (name, got)


def test_decode_benchmark_runs_tiny(tmp_path):
    """The decode suite's --quick smoke test: its JSON and tables, no speeds asserted."""
    out = tmp_path / "decode.json"
    r = subprocess.run([sys.executable, "-m", "tools.bench", "--suite=decode", "config/mha.py", "config/gla.py",
                        "--quick", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    mha, gla = result["variants"]
    assert (mha["variant"], gla["variant"]) == ("mha", "gla")
    for row in (mha, gla):
        assert [e["context"] for e in row["decode"]] == [16, 48]
        assert all(e["ms_per_token"] > 0 for e in row["decode"]) and row["last_over_first"] > 0
    # MHA's cache grows with the context (K and V of width 32, fp32, 1 layer, for 48 - 16 tokens); GLA's is its state
    assert mha["decode"][1]["cache_bytes"] - mha["decode"][0]["cache_bytes"] == 32 * 2 * 32 * 4
    assert gla["decode"][0]["cache_bytes"] == gla["decode"][1]["cache_bytes"] == gla["cache_state_bytes"] > 0
    hf = result["hf_llama"]
    if "error" not in hf:  # transformers installed: the same shape on both sides
        assert (hf["attention"], hf["n_layer"], hf["n_embd"], hf["n_kv_head"]) == ("gqa", 1, 32, 2)
        assert hf["ms_per_token"] > 0 and hf["hf_ms_per_token"] > 0 and abs(hf["params"] - hf["hf_params"]) < 100
    assert "Hugging Face" in r.stdout and sum(line.startswith("| ") for line in r.stdout.splitlines()) >= 3 + 3


def test_decode_benchmark_matches_parameters_when_asked(tmp_path):
    """--match=params: every variant's parameters within tools/budget.py's tolerance of the first
    config's, by its MLP width, where at its own width GLA carries more (its gate projections)."""
    from tools import budget
    from tools.benchmarks import decode
    from trainer.settings import MODEL_KEYS, parse_keys
    out = tmp_path / "decode.json"
    decode.main(["config/mha.py", "config/gla.py", "config/deltanet.py", "--quick", "--match=params", "--rounds=1",
                 "--json", str(out)])
    rows = json.loads(out.read_text())["variants"]
    quick = parse_keys(["config/gla.py", *decode.QUICK_WIDTH])
    own = budget.meta_model({k: quick[k] for k in MODEL_KEYS}, 65).num_params()
    assert own > rows[0]["params"] * (1 + budget.PARAMS_TOLERANCE)          # unmatched, GLA is larger
    for row in rows[1:]:
        assert abs(row["params"] - rows[0]["params"]) <= budget.PARAMS_TOLERANCE * rows[0]["params"], row


def test_decode_benchmark_matches_parameters_with_learned_positions(tmp_path):
    """Learned positions' table grows with the block_size the suite builds for its longest context: the
    first config's parameters are counted at that size too, so the match holds (at block_size 64 the
    reference would lack 400 - 64 rows of 32 positions' weights, a sixth of this tiny model)."""
    from tools import budget
    from tools.benchmarks import decode
    out, gqa_learned = tmp_path / "decode.json", tmp_path / "gqa_learned.py"
    gqa_learned.write_text(f'include("{ROOT}/config/gqa.py")\npos_encoding = "learned"\n')
    decode.main(["config/learned.py", str(gqa_learned), "--quick", "--match=params", "--rounds=1", "--contexts=400",
                 "--json", str(out)])
    mha, gqa = json.loads(out.read_text())["variants"]
    assert (mha["pos_encoding"], gqa["pos_encoding"], gqa["attention"]) == ("learned", "learned", "gqa")
    assert abs(gqa["params"] - mha["params"]) <= budget.PARAMS_TOLERANCE * mha["params"]


def test_gla_paths_benchmark_names_the_path_chunk_gla_takes(tmp_path, monkeypatch):
    """The gla suite's paths section (--quick): the path it reports for each decay rate is the one
    chunk_gla takes (spied on), and only the paths exact at that rate are timed; no speeds asserted."""
    from attn_kernels import gla_chunked
    from tools.benchmarks import gla as gla_suite
    taken = []
    real_sub, real_scores = gla_chunked._factored_through_sub_chunks, gla_chunked._intra_chunk_scores
    monkeypatch.setattr(gla_chunked, "_intra_chunk_scores", lambda *a: taken.append("sub") or real_scores(*a))
    monkeypatch.setattr(gla_chunked, "_factored_through_sub_chunks",
                        lambda *a: taken.append("factored") or real_sub(*a))
    out = tmp_path / "paths.json"
    gla_suite.main(["--quick", "--only=paths", "--rates=0.05,8,100", "--json", str(out)])
    rows = json.loads(out.read_text())["paths"]
    assert [r["taken"] for r in rows] == ["one matmul", "sub-chunks factored", "pairwise diagonal"]
    assert [[p for p in gla_suite.PATHS if p in r] for r in rows] == [list(gla_suite.PATHS), list(gla_suite.PATHS)[1:],
                                                                      list(gla_suite.PATHS)[2:]]
    spied = {"one matmul": [], "sub-chunks factored": ["sub", "factored"], "pairwise diagonal": ["sub"]}
    for rate, path in ((0.05, "one matmul"), (8.0, "sub-chunks factored"), (100.0, "pairwise diagonal")):
        taken.clear()   # the same shape and draw of decays at the default bounds, as training runs them
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2, 2, 16, 8, generator=gen) for _ in range(3))
        gla_chunked.chunk_gla(q, k, v, -rate * torch.rand(2, 2, 16, 8, generator=gen), chunk_size=16)
        assert taken == spied[path]


class Widened(torch.nn.Module):
    """One class, built at several widths: as the suites' models of one GPT class share its code objects."""

    def __init__(self, width):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


def test_compiling_runs_every_model_of_a_suite_compiled():
    """dynamo keeps compiled entries per code object, so a suite's models of one class share one
    recompile_limit (8), past which a frame runs eagerly without an error and the suite would time eager
    steps as compiled. Under harness.compiling, each of 10 models gets its own compiled graph (backend
    "eager": dynamo's capture without Inductor's C++ build), and a process past the limit raises."""
    from torch._dynamo.exc import FailOnRecompileLimitHit
    from torch._dynamo.utils import counters

    from tools.benchmarks.harness import compiling
    models, limit = 10, torch._dynamo.config.recompile_limit

    def compile_each(n):
        for width in range(4, 4 + n):
            torch.compile(Widened(width), backend="eager")(torch.randn(2, width))
    with compiling(models):
        counters.clear()
        compile_each(models)
        assert counters["stats"]["unique_graphs"] == models
    with compiling(1), pytest.raises(FailOnRecompileLimitHit):
        compile_each(9)
    assert torch._dynamo.config.recompile_limit == limit   # restored
