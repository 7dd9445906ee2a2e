"""eval.py: loss at other context lengths equals a direct computation; impossible lengths are n/a.
Also the long-context benchmark suite runs end to end at tiny sizes."""
import json
import math
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest
import torch

import train
from helpers import ROOT, run_cli, train_args
from model import GPT, GPTConfig
from tools import eval as length_eval


@pytest.fixture(scope="module")
def runs(data_root, tmp_path_factory):
    """Tiny RoPE, ALiBi and learned-position runs (block_size 32), trained a few steps."""
    root = tmp_path_factory.mktemp("runs")
    for pos in ("rope", "alibi", "learned"):
        train.main(train_args(data_root, root / pos, "--max_iters=10", "--eval_interval=10", f"--pos_encoding={pos}"))
    return root


def direct_loss(run_dir, data_root, length, max_tokens):
    """Mean next-token cross-entropy over non-overlapping windows, one window at a time, from
    the raw val.bin and the checkpoint's weights (float64 log-softmax)."""
    ckpt = torch.load(os.path.join(run_dir, "ckpt.pt"), map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    tokens = np.fromfile(os.path.join(data_root, "shakespeare_char", "val.bin"), dtype=np.uint16)[:max_tokens]
    losses = []
    with torch.no_grad():
        for start in range(0, len(tokens) - length, length):
            window = torch.from_numpy(tokens[start:start + length + 1].astype(np.int64))
            logits, _ = model(window[None, :-1])
            logp = logits[0].double().log_softmax(-1)
            losses.append(-logp[torch.arange(length), window[1:]].mean().item())
    return float(np.mean(losses))


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_eval_at_1x_matches_direct_computation_and_4x_is_finite(runs, data_root, tmp_path, capsys, pos):
    out = tmp_path / "eval.json"
    length_eval.main([str(runs / pos), "--lengths=32,128", "--json", str(out), "--plot", str(tmp_path / "e.png"),
                      "--ckpt=last", "--max_tokens=3000", "--batch_size=5", f"--data_dir={data_root}"])
    rows = json.loads(out.read_text())
    assert [r["length"] for r in rows] == [32, 128]
    assert set(rows[0]) == {"run", "attention", "pos_encoding", "rope_scaling", "rope_factor", "block_size", "length",
                            "val_loss"}
    assert rows[0]["pos_encoding"] == pos and rows[0]["block_size"] == 32
    assert rows[0]["val_loss"] == pytest.approx(direct_loss(runs / pos, data_root, 32, 3000), abs=1e-5)
    assert math.isfinite(rows[1]["val_loss"]) and rows[1]["val_loss"] < math.log(65) + 1
    assert f"| {pos} |" in capsys.readouterr().out
    assert (tmp_path / "e.png").stat().st_size > 1000


def model_and_tokens(run_dir, data_root, max_tokens):
    ckpt = torch.load(os.path.join(run_dir, "ckpt.pt"), map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    tokens = np.fromfile(os.path.join(data_root, "shakespeare_char", "val.bin"), dtype=np.uint16)[:max_tokens]
    return model.eval(), torch.from_numpy(tokens.astype(np.int64))


def test_per_position_buckets_equal_a_direct_computation(runs, data_root, tmp_path):
    """Windows of 128 on a block_size-32 run: buckets [0, 32), [32, 64), [64, 128), each the mean
    over every window of the losses at those positions, from float64 log-softmax one window at a time."""
    out = tmp_path / "eval.json"
    length_eval.main([str(runs / "rope"), "--lengths=128", "--per_position", "--json", str(out), "--plot",
                      str(tmp_path / "e.png"), "--ckpt=last", "--max_tokens=1500", f"--data_dir={data_root}"])
    row, = json.loads(out.read_text())
    model, tokens = model_and_tokens(runs / "rope", data_root, 1500)
    per_window = []
    with torch.no_grad():
        for start in range(0, len(tokens) - 128, 128):
            window = tokens[start:start + 129]
            logp = model(window[None, :-1])[0][0].double().log_softmax(-1)
            per_window.append(-logp[torch.arange(128), window[1:]])
    losses = torch.stack(per_window)                                  # (windows, 128)
    expected = [(0, 32), (32, 64), (64, 128)]
    assert [(b["start"], b["end"]) for b in row["buckets"]] == expected
    for b, (lo, hi) in zip(row["buckets"], expected):
        assert b["loss"] == pytest.approx(losses[:, lo:hi].mean().item(), abs=1e-5)
    assert row["val_loss"] == pytest.approx(losses.mean().item(), abs=1e-5)


@pytest.mark.parametrize("stride", [32, 12, 1])
def test_stride_loss_equals_one_forward_per_target(runs, data_root, tmp_path, stride):
    """Each target t gets the context of the window that scores it: tokens s..t-1 with s = 0 while
    t <= L, else the first multiple of the stride with s + L >= t; one forward per target here."""
    out, L, n = tmp_path / "eval.json", 32, 300
    length_eval.main([str(runs / "alibi"), "--lengths=32", f"--stride={stride}", "--json", str(out), "--plot",
                      str(tmp_path / "e.png"), "--ckpt=last", f"--max_tokens={n}", f"--data_dir={data_root}"])
    plain, strided = json.loads(out.read_text())
    assert strided["stride"] == stride and strided["length"] == L and "stride" not in plain
    model, tokens = model_and_tokens(runs / "alibi", data_root, n)
    last_start = (n - L - 1) // stride * stride
    losses = []
    with torch.no_grad():
        for t in range(1, last_start + L + 1):
            s = 0 if t <= L else -(-(t - L) // stride) * stride
            logp = model(tokens[None, s:t])[0][0, -1].double().log_softmax(-1)
            losses.append(-logp[tokens[t]].item())
    assert strided["val_loss"] == pytest.approx(float(np.mean(losses)), abs=1e-5)
    if stride == 32:  # windows side by side: the plain evaluation over the same targets
        assert strided["val_loss"] == pytest.approx(plain["val_loss"], abs=1e-5)


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_a_window_of_one_key_equals_each_token_alone(runs, data_root, tmp_path, pos):
    """--window=1 on an MHA run: every query sees itself only, in every layer, so each token's loss is
    that of the trained model run on the token alone (relative positions: the same scores at any
    offset), one forward per token here; the row as trained stays as it was."""
    out, n = tmp_path / "eval.json", 400
    length_eval.main([str(runs / pos), "--lengths=32", "--window=1", "--json", str(out), "--plot",
                      str(tmp_path / "e.png"), "--ckpt=last", f"--max_tokens={n}", f"--data_dir={data_root}"])
    plain, windowed = json.loads(out.read_text())
    assert "window" not in plain and windowed["window"] == 1 and windowed["attention"] == "swa"
    assert windowed["run"] == f"{plain['run']} [window 1]"
    assert plain["val_loss"] == pytest.approx(direct_loss(runs / pos, data_root, 32, n), abs=1e-5)
    model, tokens = model_and_tokens(runs / pos, data_root, n)
    with torch.no_grad():
        logp = torch.cat([model(tokens[None, t:t + 1])[0][0].double().log_softmax(-1)
                          for t in range((n - 1) // 32 * 32)])
    alone = -logp[torch.arange(len(logp)), tokens[1:len(logp) + 1]].mean().item()
    assert windowed["val_loss"] == pytest.approx(alone, abs=1e-5)
    assert abs(windowed["val_loss"] - plain["val_loss"]) > 1e-3   # the window changed what the model sees


def test_a_window_on_a_run_without_softmax_is_refused(data_root, tmp_path):
    train.main(train_args(data_root, tmp_path / "gla", "--max_iters=1", "--eval_interval=1", "--attention=gla"))
    code, out, err = run_cli(["-m", "tools.eval", str(tmp_path / "gla"), "--lengths=16", "--window=4",
                              f"--data_dir={data_root}", f"--plot={tmp_path / 'never.png'}", "--max_tokens=500"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "attention=gla" in err, err
    assert out == "" and not (tmp_path / "never.png").exists()


def test_learned_positions_are_na_beyond_block_size(runs, data_root, tmp_path, capsys):
    out = tmp_path / "eval.json"
    length_eval.main([str(runs / "learned"), "--lengths=16,64", "--json", str(out), "--plot", str(tmp_path / "e.png"),
                      "--max_tokens=2000", f"--data_dir={data_root}"])
    rows = json.loads(out.read_text())
    assert rows[0]["val_loss"] is not None and rows[1]["val_loss"] is None
    table = capsys.readouterr().out
    assert "n/a (1)" in table and "(1) learned positions stop at block_size=32" in table
    r = subprocess.run([sys.executable, "-m", "tools.eval", str(runs / "learned"), "--lengths=64,128",
                        f"--data_dir={data_root}", "--plot", str(tmp_path / "never.png")],
                       cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "block_size=32" in r.stderr
    assert not (tmp_path / "never.png").exists()


def test_plot_goes_with_the_outputs_never_the_working_folder(runs, data_root, tmp_path, monkeypatch):
    """Without --plot the figure goes beside --json (its name, .png), else into the first run's folder."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    common = ["--lengths=32", "--max_tokens=500", f"--data_dir={data_root}"]
    length_eval.main([str(runs / "rope"), "--json", str(tmp_path / "lengths.json"), *common])
    assert (tmp_path / "lengths.png").stat().st_size > 1000
    length_eval.main([str(runs / "rope"), *common])
    assert (runs / "rope" / "eval.png").stat().st_size > 1000
    os.remove(runs / "rope" / "eval.png")
    assert not os.listdir(work)


@pytest.mark.parametrize("flags,words", [
    (["--per_position", "--stride=1000"], "--stride=1000 is above the block_size=32 of"),
    (["--stride=33"], "--stride=33 is above the block_size=32 of"),
    (["--rope_scaling=pi", "--rope_factor=4"], "no run uses it")])
def test_flags_a_run_cannot_take_are_refused_before_any_work(runs, data_root, tmp_path, flags, words):
    """A stride past block_size was n/a in one path and refused in another; a RoPE scaling of a
    learned-position run evaluated it unscaled without a word: both refused up front now."""
    plot = tmp_path / "never.png"
    code, out, err = run_cli(["-m", "tools.eval", str(runs / "learned"), *(["--lengths=16"] if "--stride=33" in flags
                              else []), *flags, f"--data_dir={data_root}", f"--plot={plot}", "--max_tokens=500"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert out == "" and not plot.exists()


def test_a_rope_scaling_over_mixed_runs_says_which_stay_as_trained(runs, data_root, tmp_path):
    out = tmp_path / "eval.json"
    code, _, err = run_cli(["-m", "tools.eval", str(runs / "rope"), str(runs / "alibi"), "--lengths=32",
                            "--rope_scaling=pi", "--rope_factor=2", f"--data_dir={data_root}", "--max_tokens=500",
                            f"--plot={tmp_path / 'e.png'}", f"--json={out}"])
    assert code == 0, err
    assert "note: --rope_scaling applies to RoPE runs only" in err and "alibi (pos_encoding=alibi)" in err
    rows = json.loads(out.read_text())
    assert [(r["pos_encoding"], r["rope_scaling"]) for r in rows] == [("rope", "pi"), ("alibi", "none")]


def test_cpu_benchmark_runs_tiny(tmp_path):
    out = tmp_path / "cpu.json"
    r = subprocess.run([sys.executable, "-m", "tools.bench", "--suite=cpu", "config/mha.py", "config/gla.py", "--quick",
                        "--threads=1", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert [(s["dtype"], s["compile"], s["threads"]) for s in res["train_ms_per_step"]] == \
        [("float32", "off", 1), ("bfloat16", "off", 1)]
    assert all(s["mha"] > 0 and s["gla"] > 0 for s in res["train_ms_per_step"])
    assert [row["variant"] for row in res["decode"]] == ["mha", "gla"]
    assert all(e["ms_per_token"] > 0 for row in res["decode"] for e in row["decode"])
    assert [line.split(" ")[1] for line in r.stdout.splitlines() if line.startswith(("| mha", "| gla"))] == \
        ["mha", "gla"] * 3   # a training, a page-fault and a decoding table, a row per config
    assert all(k["page_faults"] >= 0 and k["sys_ms"] >= 0 for s in res["train_kernel_per_step"] for k in s.values())
    for rounds, step in zip(res["train_ms_per_round"], res["train_ms_per_step"]):
        # each setting's median is its rounds' median; its cell shows the range of the rounds' paired ratios
        assert len(rounds["gla"]) == res["rounds"] and statistics.median(rounds["gla"]) == step["gla"]
        ratios = [m / g for m, g in zip(rounds["mha"], rounds["gla"])]
        assert f"({step['mha'] / step['gla']:.2f}; {min(ratios):.2f}-{max(ratios):.2f})" in r.stdout
    ms = {s["dtype"]: s["mha"] for s in res["train_ms_per_step"]}
    verdict = "pass --dtype=bfloat16" if ms["float32"] > ms["bfloat16"] else "keep float32"
    assert f"bf16 autocast trains mha at {ms['float32'] / ms['bfloat16']:.2f}x fp32's tokens/s with 1 thread(s): " \
        f"{verdict}" in r.stdout


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ops_benchmark_counts_what_the_layers_call(tmp_path, dtype):
    """MHA's layer calls SDPA's CPU flash kernel once forward and once backward per step (under autocast
    too); deltanet's never does, and runs more ATen ops than MHA's."""
    out = tmp_path / "ops.json"
    r = subprocess.run([sys.executable, "-m", "tools.bench", "--suite=ops", "config/mha.py", "config/deltanet.py",
                        "--quick", "--top=100", f"--dtype={dtype}", "--json", str(out)], cwd=ROOT,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    results = json.loads(out.read_text())
    layers = results["layers"]
    assert results["dtype"] == dtype and f"forward + backward, {dtype}," in r.stdout

    def calls(config, op):
        return sum(t["calls"] for t in layers[config]["top"] if t["op"] == op)
    assert calls("mha", "_scaled_dot_product_flash_attention_for_cpu") == 1
    assert calls("mha", "_scaled_dot_product_flash_attention_for_cpu_backward") == 1
    assert calls("deltanet", "_scaled_dot_product_flash_attention_for_cpu") == 0
    assert layers["deltanet"]["ops_per_step"] > layers["mha"]["ops_per_step"] > 0
    assert all(sum(t["ms"] for t in r["top"]) <= r["ms_in_ops"] + 1e-9 for r in layers.values())


def fake_nanogpt(tmp_path):
    """A stand-in nanoGPT (its console format, and a check that it got our tokens and a meta.pkl)."""
    fake = tmp_path / "nanoGPT"
    (fake / "config").mkdir(parents=True)
    (fake / "config" / "train_shakespeare_char.py").write_text("")
    (fake / "model.py").write_text("")
    (fake / "configurator.py").write_text("")
    (fake / "train.py").write_text(
        "import os, pickle, numpy as np\n"
        "meta = pickle.load(open('data/shakespeare_char/meta.pkl', 'rb'))\n"
        "n = len(np.memmap('data/shakespeare_char/train.bin', dtype=np.uint16, mode='r'))\n"
        "assert meta['vocab_size'] == 65 and n > 1000 and os.environ['OMP_NUM_THREADS'] == '1'\n"
        "for i in range(31): print(f'iter {i}: loss 3.0, time {10 + i % 2}.00ms, mfu -100.00%')\n"
        "print('step 30: train loss 3.0000, val loss 3.1000')\n")
    return fake


def run_nanogpt_suite(tmp_path, data_root, *flags):
    out, fake = tmp_path / "n.json", fake_nanogpt(tmp_path)
    r = subprocess.run([sys.executable, "-m", "tools.bench", "--suite=nanogpt", f"--nanogpt_dir={fake}",
                        f"--data_dir={data_root}", *flags, "--json", str(out)], cwd=ROOT, capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout, json.loads(out.read_text())


def test_nanogpt_benchmark_runs_both_on_the_same_data(tmp_path, data_root):
    _, results = run_nanogpt_suite(tmp_path, data_root, "--quick")
    nano, ours = results["rows"]
    assert nano["setting"] == "nanoGPT" and nano["ms_per_iter"] == [10.5] and nano["val_loss"] == [3.1]
    assert ours["setting"] == "ours --dtype=float32" and ours["ms_per_iter"][0] > 0 and 0 < ours["val_loss"][0] < 5


def test_nanogpt_benchmark_seed_per_round_trains_ours_on_another_seed_each_round(tmp_path, data_root):
    """The spread of ours' val losses is seed noise: round r trains seed 1337 + r (another init, other batches)."""
    stdout, results = run_nanogpt_suite(tmp_path, data_root, "--iters=12", "--repeats=2", "--seed_per_round")
    nano, ours = results["rows"]
    assert nano["val_loss"] == [3.1, 3.1] and len(set(ours["val_loss"])) == 2
    assert "± sd; ours: seed 1337 + round" in stdout


def test_longctx_benchmark_runs_tiny(tmp_path):
    out = tmp_path / "lc.json"
    r = subprocess.run([sys.executable, "-m", "tools.bench", "--suite=longctx", "config/mha.py", "config/gla.py",
                        "--quick",
                        "--train_lens=32,64", "--contexts=16,48", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert [row["variant"] for row in rows] == ["mha", "gla"]
    for row in rows:
        assert [e["T"] for e in row["train"]] == [32, 64] and all(e["tokens_per_sec"] > 0 for e in row["train"])
        assert [e["context"] for e in row["decode"]] == [16, 48]
    mha, gla = rows
    # MHA's cache grows with the context (2 x n_embd fp32 per token per layer, 1 layer); GLA's is its state
    assert mha["decode"][1]["cache_bytes"] - mha["decode"][0]["cache_bytes"] == 32 * 2 * 32 * 4
    assert gla["decode"][0]["cache_bytes"] == gla["decode"][1]["cache_bytes"] == gla["cache_state_bytes"] > 0
    assert "(constant state)" in r.stdout
    assert sum(line.startswith("| ") for line in r.stdout.splitlines()) == 3  # header + 2 variants
