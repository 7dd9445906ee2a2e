"""plan.py: its numbers equal what the models report and allocate when built for real, match
independent closed forms at large sizes (DeepSeek-V2's MLA cache among them), and bad input
is one line with exit status 2."""
import glob
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from attention.bigbird import build_layout, selected_block_counts
from helpers import ROOT
from model import GPT, GPTConfig
from tools import plan
from tools.bench import cache_bytes
from trainer.settings import MODEL_KEYS, parse_keys

NOT_VARIANTS = ("base", "gpt2", "finetune", "uptrain")  # bases, GPT-2-sized and pretrained runs (as bench.py)
VARIANT_CONFIGS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "config/*.py"))
                         if not any(word in p for word in NOT_VARIANTS))
SEVEN_B = ["--n_layer=32", "--n_head=32", "--n_embd=4096", "--block_size=4096"]


def run_plan(tmp_path, *argv):
    """plan.main in-process -> its JSON rows."""
    out = tmp_path / "plan.json"
    plan.main([arg if arg.startswith("--") else os.path.join(ROOT, arg) for arg in argv] + ["--json", str(out)])
    return json.loads(out.read_text())


def real_model(path, *overrides, vocab_size=65):
    cfg = parse_keys([os.path.join(ROOT, path), *overrides])
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab_size, **{k: cfg[k] for k in MODEL_KEYS}))


def test_variant_configs_are_all_here():
    names = {os.path.basename(p)[:-3] for p in VARIANT_CONFIGS}
    assert {"mha", "gqa", "mqa", "mla", "bigbird", "gla", "linear", "learned", "alibi"} <= names


def test_params_flops_and_cache_equal_the_real_small_models(tmp_path):
    """Every variant at its CPU size, built for real: parameters, attention FLOPs, and the bytes
    of the caches init_caches allocates (bench.py's measurement), at two cache dtypes."""
    context = 40  # not a multiple of BigBird's 8-token blocks, below block_size 64
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rows = run_plan(tmp_path, *VARIANT_CONFIGS, f"--context={context}", "--vocab_size=65", f"--dtype={dtype_name}")
        assert [r["variant"] for r in rows] == [os.path.basename(p)[:-3] for p in VARIANT_CONFIGS]
        for path, row in zip(VARIANT_CONFIGS, rows):
            model = real_model(path)
            assert row["params"] == model.num_params(), path
            assert row["attn_params"] == sum(p.numel() for b in model.h for p in b.attn.parameters()), path
            assert row["train_flops_per_token"] == model.flops_per_token(context), path
            assert row["vocab_size"] == 65
            allocated = cache_bytes(model, context, dtype)
            assert row["kv_cache_bytes_per_seq"] + row["cache_state_bytes"] == allocated, path
            # per token: the slope of allocated bytes against length, as bench.py measures it, at a
            # length below swa's 32-token window (past it, its cache stops growing)
            slope = cache_bytes(model, 17, dtype) - cache_bytes(model, 16, dtype)
            assert row["kv_cache_bytes_per_token"] == slope, path
            batch = sum(c.nbytes() for c in model.init_caches(3, context, dtype=dtype))
            assert batch == 3 * allocated


def test_default_run_at_block_size_matches_the_model_counts(tmp_path):
    """At context = block_size the planner's FLOPs are exactly what the run logs (as computed) and what
    its MFU uses (PaLM's count)."""
    rows = run_plan(tmp_path, *VARIANT_CONFIGS, "--context=64", "--vocab_size=65")
    for path, row in zip(VARIANT_CONFIGS, rows):
        model = real_model(path)
        assert row["train_flops_per_token"] == model.flops_per_token(), path
        assert row["palm_flops_per_token"] == model.flops_per_token_palm(), path


def test_softmax_attention_flops_count_the_causal_half_and_the_step_time_palms(tmp_path):
    """Independent counts: 12 * layers * heads * head_dim per causal (query, key) pair, T(T+1)/2 pairs
    over T tokens; the step time at an MFU bills PaLM's 12 * L * H * D * T (every key)."""
    T = 4096
    rows = run_plan(tmp_path, "config/mha.py", "config/gqa.py", "config/mqa.py", *SEVEN_B, f"--context={T}",
                    "--mfu=0.5", "--peak_tflops=1000")
    for row in rows:
        assert row["attn_flops_per_token"] == 12 * 32 * 32 * 128 * (T * (T + 1) // 2) / T
        palm = 6 * row["params"] + 12 * 32 * 32 * 128 * T
        assert row["palm_flops_per_token"] == palm
        assert row["train_step_s"] == pytest.approx(T * palm / (1000e12 * 0.5))


def test_bigbird_keys_per_query_from_the_drawn_layout(tmp_path):
    """Keys per query = the most blocks any query block of the real (drawn) layout selects,
    times the block; the planner builds on meta without drawing."""
    overrides = ["--sparse_block=8", "--sparse_window=2", "--sparse_global=1", "--sparse_random=2"]
    row, = run_plan(tmp_path, "config/bigbird.py", *overrides, "--context=64", "--vocab_size=65")
    model = real_model("config/bigbird.py", *overrides)
    most = max(int(b.attn.layout.sum(dim=1).max()) for b in model.h)
    assert row["keys_per_query"] == most * 8 == 40   # window 2 + global 1 + random 2 blocks


@pytest.mark.parametrize("n_blocks,window,n_global,n_random", [(8, 2, 1, 1), (16, 3, 2, 3), (5, 1, 0, 0),
                                                               (9, 4, 6, 2), (6, 8, 8, 5), (12, 1, 3, 20)])
def test_selected_block_counts_equal_the_drawn_layout(n_blocks, window, n_global, n_random):
    layout = build_layout(n_blocks, window, n_global, n_random, torch.Generator().manual_seed(3))
    assert selected_block_counts(n_blocks, window, n_global, n_random) == layout.sum(dim=1).tolist()


def closed_form_params(C, L, H, Hkv, V, learned_positions=0):
    """GPT-2 layout without biases: tied embedding, per layer 2 LayerNorms, qkv + out, 4x MLP."""
    D = C // H
    attn = C * (H + 2 * Hkv) * D + H * D * C
    return V * C + learned_positions * C + L * (2 * C + attn + 8 * C * C) + C, L * attn


@pytest.mark.parametrize("path,n_kv_head,learned", [("config/mha.py", 32, 0), ("config/gqa.py", 2, 0),
                                                     ("config/mqa.py", 1, 0), ("config/learned.py", 32, 4096)])
def test_params_at_7b_equal_the_closed_form(tmp_path, path, n_kv_head, learned):
    row, = run_plan(tmp_path, path, *SEVEN_B, "--context=4096")
    assert (row["params"], row["attn_params"]) == closed_form_params(4096, 32, 32, n_kv_head, 50304, learned)
    with torch.device("meta"):   # and the meta-built model's own count
        assert row["params"] == real_model(path, *SEVEN_B, vocab_size=50304).num_params()


def test_deepseek_v2_attention_shapes_cache_576_per_token_per_layer(tmp_path):
    """DeepSeek-V2 (arXiv:2405.04434, Table 1 and section 3.1.2): d_c = 512, d_h^R = 64, so MLA
    caches (d_c + d_h^R) = 576 elements per token per layer, whatever the width and heads."""
    shapes = ["--n_embd=5120", "--n_head=128", "--kv_lora_rank=512", "--rope_head_dim=64", "--q_lora_rank=1536",
              "--attention=mla", "--n_layer=60", "--block_size=4096"]
    row, = run_plan(tmp_path, "config/mla.py", *shapes, "--context=4096", "--dtype=bf16")
    assert row["kv_cache_bytes_per_token"] == (512 + 64) * 60 * 2
    C, H, d_h, q_rank, d_c, d_r = 5120, 128, 40, 1536, 512, 64
    attn = (C * q_rank + q_rank + q_rank * H * (d_h + d_r)      # q_down, q_norm, q_up
            + C * (d_c + d_r) + d_c + 2 * d_c * H * d_h + H * d_h * C)  # kv_down, kv_norm, k_up, v_up, c_proj
    assert row["attn_params"] == 60 * attn


def test_decode_batch_and_bounds_follow_memory_and_bandwidth(tmp_path):
    """MHA at 7B shape in bf16: max batch, memory-bound tokens/s and step time by hand."""
    row, = run_plan(tmp_path, "config/mha.py", *SEVEN_B, "--context=4096", "--batch=8", "--memory=80GiB",
                    "--bandwidth=3350GB/s", "--peak_tflops=989", "--mfu=0.5")
    weights = closed_form_params(4096, 32, 32, 32, 50304)[0] * 2
    per_seq = 4096 * 2 * 32 * 4096 * 2                  # context x (K and V) x layers x width x bf16
    assert row["max_decode_batch"] == math.floor((80 * 2 ** 30 - weights) / per_seq)
    assert row["decode_tokens_per_sec_bound"] == pytest.approx(8 * 3350e9 / (weights + 8 * per_seq))
    flops = 6 * weights / 2 + 12 * 32 * 4096 * 4096
    assert row["train_step_s"] == pytest.approx(8 * 4096 * flops / (989e12 * 0.5))
    row, = run_plan(tmp_path, "config/mha.py", *SEVEN_B, "--context=4096", "--batch=1000")
    assert row["decode_tokens_per_sec_bound"] is None   # the batch asked for does not fit


def test_gla_state_is_constant_and_fp32(tmp_path):
    short, = run_plan(tmp_path, "config/gla.py", *SEVEN_B, "--context=1024", "--dtype=bf16")
    long, = run_plan(tmp_path, "config/gla.py", *SEVEN_B, "--context=4096", "--dtype=bf16")
    assert short["kv_cache_bytes_per_token"] == long["kv_cache_bytes_per_token"] == 0
    state = 32 * 32 * 128 * 128 * 4                      # layers x heads x d_h x d_h x fp32
    assert short["cache_state_bytes"] == long["cache_state_bytes"] == state
    weights = long["params"] * 2
    assert long["max_decode_batch"] == (80e9 - weights) // state
    # each step reads the weights and reads and writes each sequence's state
    assert long["decode_tokens_per_sec_bound"] == pytest.approx(3.35e12 / (weights + 2 * state))


def test_json_has_the_design_keys_and_table_has_a_row_per_config(tmp_path, capsys):
    rows = run_plan(tmp_path, "config/mha.py", "config/gla.py", "--context=64")
    keys = ("variant", "attention", "params", "attn_params", "train_flops_per_token", "kv_cache_bytes_per_token",
            "cache_state_bytes", "max_decode_batch", "decode_tokens_per_sec_bound", "vocab_size")
    assert all(key in row for row in rows for key in keys)
    assert rows[0]["vocab_size"] == 50304
    out = capsys.readouterr().out
    assert sum(line.startswith("| ") for line in out.splitlines()) == 3 and "Assumptions" in out


@pytest.mark.parametrize("flag,text,value", [("memory", "80GB", 80e9), ("memory", "80GiB", 80 * 2 ** 30),
                                             ("memory", "80", 80e9), ("memory", "1.5e3MB", 1.5e9),
                                             ("bandwidth", "4.8TB/s", 4.8e12), ("bandwidth", "3350GB/s", 3.35e12),
                                             ("bandwidth", "4.8", 4.8e12), ("peak_tflops", "989", 989e12),
                                             ("peak_tflops", "1.979PFLOP/s", 1.979e15)])
def test_units(flag, text, value):
    assert plan.parse_quantity(flag, text) == pytest.approx(value)


@pytest.mark.parametrize("argv,words", [
    (["config/mha.py", "--context=64", "--n_layr=3"], "unknown key 'n_layr'"),
    (["config/mha.py", "--context=64", *SEVEN_B, "--memory=10GB"], "weights alone take"),
    (["config/learned.py", "--context=128"], "block_size=64"),
    (["config/bigbird.py", "--context=65"], "set --block_size=65"),
    (["config/mha.py", "--context=64", "--memory=80XB"], "--memory='80XB'"),
    (["config/mha.py", "--context=64", "--bandwidth=4.8TB"], "--bandwidth='4.8TB'"),
    (["config/mha.py", "--context=64", "--peak_tflops=fast"], "--peak_tflops='fast'"),
    (["config/mha.py", "--context=64", "--dtype=int4"], "--dtype='int4'"),
    (["config/mha.py"], "--context=N is required"),
    (["--context=64"], "no config files"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words):
    r = subprocess.run([sys.executable, "-m", "tools.plan", *argv], check=False, cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.splitlines()) == 1 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


def test_sparse_costs_against_context(tmp_path):
    """Closed forms written here: swa's cache stops at its window and it reads the window; MoBA
    keeps every key but reads its own block and moba_topk chosen ones; dense reads everything."""
    width = ["--n_layer=2", "--n_head=4", "--n_embd=128", "--block_size=4096", "--vocab_size=65"]
    per_token = 2 * 2 * 128 * 2                                        # layers x (K, V) x n_embd x bf16
    for context in (512, 4096):
        mha, = run_plan(tmp_path, "config/mha.py", *width, f"--context={context}")
        swa, = run_plan(tmp_path, "config/swa.py", *width, "--sliding_window=256", f"--context={context}")
        moba, = run_plan(tmp_path, "config/moba.py", *width, "--sparse_block=64", "--moba_topk=3",
                         f"--context={context}")
        assert mha["kv_cache_bytes_per_seq"] == moba["kv_cache_bytes_per_seq"] == per_token * context
        assert swa["kv_cache_bytes_per_seq"] == per_token * 256
        assert (mha["keys_per_query"], swa["keys_per_query"], moba["keys_per_query"]) == (context, 256, 256)
        assert swa["max_decode_batch"] > mha["max_decode_batch"] * (context // 256) * 0.99


def test_planner_flags_and_model_overrides_are_split_in_order():
    raw, configs, overrides = plan.split_argv(["config/mha.py", "--n_layer=4", "config/gqa.py", "--context", "128",
                                               "--memory=40GB", "--json", "p.json", "--n_embd=64"])
    assert configs == ["config/mha.py", "config/gqa.py"] and overrides == ["--n_layer=4", "--n_embd=64"]
    assert (raw["context"], raw["memory"], raw["json"], raw["batch"]) == ("128", "40GB", "p.json", "1")


def test_a_variants_own_key_shared_by_several_configs_reaches_only_its_owners():
    """tools.plan gives every config the same overrides: --sparse_block=64 builds bigbird's blocks of 64
    and leaves mha as its config file has it (train.py alone would refuse the key under mha)."""
    from tools.plan import build_planned_model
    opts = {"vocab_size": 65, "context": 256, "dtype": torch.bfloat16, "memory": 2**40}
    shared = ["--sparse_block=64", "--block_size=256"]
    bigbird = build_planned_model("config/bigbird.py", shared, opts)
    mha = build_planned_model("config/mha.py", shared, opts)
    assert bigbird.config.sparse_block == 64 and bigbird.config.block_size == 256
    assert mha.config.sparse_block == GPTConfig.sparse_block and mha.config.block_size == 256


STUDY_CONFIGS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "config/*/*.py")))


@pytest.mark.parametrize("path", STUDY_CONFIGS)
def test_every_study_config_parses_and_builds(path):
    """The configs the studies run (config/<study>/*.py, includes and all) give a model: a typo in one
    would otherwise surface hours into a sweep."""
    cfg = parse_keys([os.path.join(ROOT, path)])
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=512, **{k: cfg[k] for k in MODEL_KEYS}))
    assert model.num_params() > 0 and len(model.config.attention_plan) == cfg["n_layer"]
