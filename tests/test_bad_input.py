"""Bad input through the command line, as a user types it: exit 2, at most 3 lines, no
traceback, a line naming the problem, before any work (no run folder made).
The scripts run in this process (helpers.run_cli: the same argv and __main__ path, without
a fresh torch import each, so a loaded machine makes no check time out); one row also runs
as a real subprocess, with a timeout scaled to this machine (helpers.cli_timeout)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT, cli_timeout, run_cli

BASE = "config/base_shakespeare_char.py"

# (script and flags, words the one line must hold); {data} and {tmp} are filled per test
TABLE = [
    (["train.py", BASE, "--min_lr=1"], "min_lr=1.0 is above learning_rate"),
    (["train.py", BASE, "--weight_decay=1e40"], "learning_rate * weight_decay"),
    (["train.py", BASE, "--n_layer=1000000"], "does not fit in memory"),
    (["train.py", BASE, "--batch_size=10000000"], "does not fit in memory"),
    (["train.py", BASE, "--rope_base=0"], "rope_base=0.0 must be"),
    (["train.py", BASE, "--rope_scaling=linear"], "unknown rope_scaling"),
    (["train.py", BASE, "--rope_scaling=yarn", "--rope_factor=4", "--rope_beta_fast=1"], "rope_beta_fast=1.0"),
    (["train.py", BASE, "--rope_fraction=2"], "rope_fraction=2.0 must be in [0, 1]"),
    (["train.py", BASE, "--rope_scaling=yarn", "--rope_factor=4", "--rope_original_context=-1"],
     "rope_original_context=-1 must be at least 1"),
    (["train.py", BASE, "--rope_scaling=yarn", "--rope_factor=1e308"],
     "rope_factor=1e+308 must be >= 1 and at most 1024"),
    (["train.py", BASE, "--rope_scaling=pi", "--rope_factor=1025"], "rope_factor=1025.0 must be >= 1 and at most 1024"),
    (["train.py", BASE, "--dataset=dirbin"], "train.bin in"),
    (["train.py", BASE, "--pos_encoding=alibi", "--rope_factor=2"], "needs pos_encoding=rope"),
    (["train.py", BASE, "--wandb_log=True"], "wandb_log=True"),
    (["train.py", "config/swa.py", "--sliding_window=0"], "sliding_window=0 must be at least 1"),
    (["train.py", "config/swa.py", "--pos_encoding=learned"], "attention=swa decodes any length"),
    (["train.py", BASE, "--sliding_window=16"], "reset it to its default on the command line: --sliding_window=256"),
    (["train.py", "config/swa_mha.py", "--attention=gla,gla,gla,mha"], "sliding_window=32 is set but no variant"),
    (["train.py", "config/moba.py", "--moba_topk=0"], "moba_topk=0 must be at least 1"),
    (["train.py", BASE, "--attention=swa,mha"], "plans 2 layers but n_layer=4"),
    (["train.py", BASE, "--attention=swa,mha,rnn,mha"], "unknown attention='rnn' in the plan"),
    (["train.py", "config/moba.py", "--sparse_block=128"], "sparse_block=128 must be between 1 and block_size=64"),
    (["train.py", "{tmp}/notutf8.py"], "is not UTF-8 text"),
    (["train.py", "{tmp}/exits.py"], "called sys.exit(5)"),
    (["train.py", "{tmp}/interrupts.py"], "KeyboardInterrupt"),
    (["train.py", "{tmp}/intdir.py"], "out_dir=5 has the wrong type"),
    (["sample.py", "--out_dir={tmp}", "--temperature=inf"], "finite --temperature"),
    (["sample.py", "--out_dir={tmp}", "--temperature=nan"], "finite --temperature"),
    (["-m", "tools.eval", "{tmp}", "--max_tokens=0"], "--max_tokens=0 must be at least 2"),
    (["-m", "tools.eval", "{tmp}", "--max_tokens=-100"], "--max_tokens=-100"),
    (["-m", "tools.eval", "{tmp}", "--device=foo"], "device='foo'"),
    (["-m", "tools.eval", "{tmp}", "--rope_factor=4"], "go with --rope_scaling"),
    (["-m", "tools.analyze", "{tmp}", "--device=cuda:7"], "device=cuda:7"),
    (["-m", "tools.plan", BASE, "--n_layer=10000000", "--context=1024"], "n_layer=10000000 is more than"),
    (["-m", "tools.bench", BASE, "--decode_tokens=0"], "--decode_tokens=0 must be at least 1"),
    (["-m", "tools.bench", BASE, "--repeats=0"], "--repeats=0 must be at least 1"),
    (["-m", "tools.bench", BASE, "--device=foo"], "device='foo'"),
    (["-m", "tools.sweep", BASE, "--seeds=1,-1", "--out={tmp}/sweep"], "every seed must be in [0, 2**32)"),
    (["sample.py", "--out_dir={tmp}", "--seed=1180591620717411303424"], "--seed=1180591620717411303424"),
    (["sample.py", "--out_dir={tmp}", "--start=FILE:{tmp}"], "is a folder"),
    (["sample.py", "--out_dir={tmp}", "--start=FILE:/dev/zero"], "not a regular file"),
    (["sample.py", "--out_dir={tmp}", "--start=FILE:{tmp}/notutf8.py"], "is not UTF-8 text"),
    (["-m", "tools.analyze", "{tmp}", "--length=1"], "--length 0 (block_size) or at least 2"),
    (["-m", "tools.eval", "{tmp}", "--json={tmp}/missing/e.json"], "does not exist"),
    (["-m", "tools.eval", "{tmp}", "--plot={tmp}"], "is a folder"),
    (["-m", "tools.compare", "{tmp}", "--out={tmp}/notutf8.py"], "is a file, not a folder"),
    (["-m", "tools.scorecard", "{tmp}", "--mqar_as", "mha"], "--mqar_as mha: give CONFIG=NAME"),
    (["-m", "tools.bench", "--suite=mla", "--json={tmp}/missing/b.json"], "does not exist"),
    (["-m", "tools.bench", "--suite=cpu", "--dtypes=float8"], "--dtypes=float8: choose from bfloat16, float32"),
    (["-m", "tools.bench", "--suite=cpu", "--contexts=4k"], "--contexts and --threads are comma-separated"),
    (["-m", "tools.bench", "--suite=ops", "config/mha.py", "--steps=0"], "--threads, --steps and --top must be"),
    (["-m", "tools.bench", "--suite=ops", "config/no_such.py"], "no_such.py"),
    (["-m", "tools.bench", "--suite=decode", "--contexts=0"], "argument --contexts: '0' must be comma-separated"),
    (["-m", "tools.bench", "--suite=decode", "--threads=-1"], "argument --threads: -1 must be at least 0"),
    (["-m", "tools.bench", "--suite=longctx", "--steps=0"], "argument --steps: 0 must be at least 1"),
    (["-m", "tools.bench", "--suite=mla", "--contexts=4k"], "argument --contexts: '4k' must be comma-separated"),
    (["-m", "tools.bench", "--suite=mla", "--impls=flash"], "--impls: unknown 'flash'; choose from auto"),
    (["-m", "tools.bench", "--suite=bigbird", "--heads=x"], "argument --heads: 'x' is not a whole number"),
    (["-m", "tools.bench", "--suite=gla", "--only=decoding"], "--only: unknown section 'decoding'"),
    (["-m", "tools.bench", "--suite=gla", "--rates=-1"], "argument --rates: '-1' must be comma-separated numbers"),
    (["-m", "tools.bench", "--suite=kernel_gla", "--quick", "--chunk=0"], "argument --chunk: 0 must be at least 1"),
    (["-m", "tools.bench", "--suite=data", "--corpus_mb=0"], "argument --corpus_mb: 0 must be at least 1"),
    (["-m", "tools.plan", "config/gqa.py", "--context=64", "--json={tmp}"], "is a folder; give a file name"),
    (["-m", "tools.sweep", "config/mha.py", "--seeds=1", "--out=/proc/xx"], "cannot write in /proc"),
    (["-m", "tools.sweep", "config/mha.py", "--seeds=1", "--out={tmp}/notutf8.py"], "is a file, not a folder"),
]

CONFIG_FILES = {"notutf8.py": b"out_dir = '\xff\xfe'\n", "exits.py": b"import sys\nsys.exit(5)\n",
                "interrupts.py": b"raise KeyboardInterrupt\n", "intdir.py": b"out_dir = 5\n"}


@pytest.mark.parametrize("argv,words", TABLE, ids=[" ".join(a[1:] if a[0] == "-m" else a)[:60] for a, _ in TABLE])
def test_bad_input_is_one_line_and_exit_2(argv, words, data_root, tmp_path):
    for name, content in CONFIG_FILES.items():
        (tmp_path / name).write_bytes(content)
    argv = [a.format(tmp=tmp_path) for a in argv]
    if argv[0] == "train.py":
        if "--dataset=dirbin" in argv:  # a dataset whose train.bin is a folder
            shutil.copytree(os.path.join(data_root, "shakespeare_char"), tmp_path / "data" / "dirbin")
            os.remove(tmp_path / "data" / "dirbin" / "train.bin")
            os.mkdir(tmp_path / "data" / "dirbin" / "train.bin")
            data_root = tmp_path / "data"
        argv += [f"--data_dir={data_root}", f"--out_dir={tmp_path}/run", "--device=cpu"]
    env = {k: None for k in os.environ if k.startswith("WANDB")} | {"HOME": str(tmp_path)}
    code, _, err = run_cli(argv, env)
    assert_refused(code, err, words)
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def assert_refused(code, err, words, max_lines=3):
    lines = err.strip().splitlines()
    assert code == 2 and 1 <= len(lines) <= max_lines and "Traceback" not in err, err
    assert words in err, err


def test_a_refusal_as_a_real_subprocess(data_root, tmp_path):
    """The in-process runs above stand for `python ...`: one row checked the real way."""
    r = subprocess.run([sys.executable, "train.py", BASE, "--min_lr=1", f"--data_dir={data_root}", "--device=cpu",
                        f"--out_dir={tmp_path}/run"], cwd=ROOT, capture_output=True, text=True, timeout=cli_timeout())
    assert_refused(r.returncode, r.stderr, "min_lr=1.0 is above learning_rate", max_lines=1)
    assert not (tmp_path / "run").exists()


def test_token_ids_beyond_vocab_size_are_refused_before_training(data_root, tmp_path):
    """A meta.json that lies (fewer characters than the ids in the .bin files)."""
    data = tmp_path / "data" / "shakespeare_char"
    shutil.copytree(os.path.join(data_root, "shakespeare_char"), data)
    meta = json.loads((data / "meta.json").read_text())
    meta["vocab_size"], meta["chars"] = 40, meta["chars"][:40]
    (data / "meta.json").write_text(json.dumps(meta))
    code, _, err = run_cli(["train.py", BASE, f"--data_dir={tmp_path / 'data'}", "--device=cpu",
                            f"--out_dir={tmp_path}/run"])
    assert_refused(code, err, "token id", max_lines=1)
    assert "vocab_size=40" in err
    assert not (tmp_path / "run").exists()


def test_a_binary_file_is_not_a_corpus(tmp_path):
    (tmp_path / "zeros.txt").write_bytes(b"\x00" * 100_000)
    code, _, err = run_cli(["data/shakespeare_char/prepare.py", f"--input={tmp_path / 'zeros.txt'}",
                            f"--out_dir={tmp_path / 'out'}"])
    assert_refused(code, err, "NUL bytes", max_lines=1)
    assert not (tmp_path / "out" / "train.bin").exists()


@pytest.mark.parametrize("summary,log,words", [
    ({"attention": "mha", "params": "many"}, [], "params='many' is not a number"),
    ({"attention": "mha"}, [{"iter": 0, "val_loss": "abc", "elapsed_s": 1.0}], "val_loss='abc' is not a number"),
    ({"attention": "mha"}, [{"iter": "zero", "val_loss": 1.0}], "iter='zero' is not a number"),
    ({"attention": "mha"}, [{"iter": 0, "val_loss": float("inf"), "elapsed_s": 1.0}], "val_loss=inf is not finite"),
    ({"attention": "mha", "best_val_loss": float("nan")}, [], "best_val_loss=nan is not finite"),
    ({"attention": "mha", "best_val_loss": -5}, [], "best_val_loss=-5 is below 0")])
def test_compare_refuses_a_malformed_run_folder(tmp_path, summary, log, words):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    code, _, err = run_cli(["-m", "tools.compare", str(run), f"--out={tmp_path / 'rep'}"])
    assert_refused(code, err, words, max_lines=1)


@pytest.mark.parametrize("plan", [[1, 2], {"configs": {"mha": 3}}, {"configs": {}, "inputs": []}])
def test_compare_refuses_json_that_is_not_a_plan(tmp_path, plan):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"attention": "mha", "best_val_loss": 1.5}))
    (run / "log.jsonl").write_text(json.dumps({"iter": 0, "val_loss": 1.5, "elapsed_s": 1.0}) + "\n")
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    code, _, err = run_cli(["-m", "tools.compare", str(run), f"--plan={tmp_path / 'plan.json'}",
                            f"--out={tmp_path / 'rep'}"])
    assert_refused(code, err, "is JSON but not a sweep's plan", max_lines=1)


@pytest.mark.parametrize("content,words", [
    ("text", "is truncated or not a checkpoint"),
    ({"model": {}, "model_args": {}, "iter_num": "abc"}, "iter_num='abc' is not a number"),
    ({"model": {}, "model_args": {}, "iter_num": -5}, "iter_num=-5 is negative"),
    ({"model": {}, "model_args": {}, "best_val_loss": float("nan")}, "best_val_loss=nan is not a loss"),
    ({"model": {}, "model_args": {}, "best_val_loss": -5.0}, "best_val_loss=-5.0 is not a loss"),
    ({"model": {"wte.weight": "nan"}, "model_args": {}}, "holds non-finite weights (wte.weight")])
@pytest.mark.parametrize("tool", [["sample.py", "--out_dir={run}", "--ckpt=last"],
                                  ["-m", "tools.analyze", "{run}", "--ckpt=last"],
                                  ["-m", "tools.eval", "{run}", "--ckpt=last"]])
def test_a_bad_checkpoint_is_one_line_in_every_reader(tmp_path, content, words, tool):
    import torch
    run = tmp_path / "run"
    run.mkdir()
    if content == "text":
        (run / "ckpt.pt").write_text("hello, this is not a checkpoint\n")
    else:
        if content["model"]:
            content["model"] = {"wte.weight": torch.tensor([[0.0, float("nan")]])}
        torch.save(content, run / "ckpt.pt")
    code, _, err = run_cli([a.format(run=run) for a in tool])
    assert_refused(code, err, words, max_lines=1)


@pytest.mark.parametrize("lr,wd", [(50, 0.1), (1e300, 0.1), (0.5, 3.0), (1.0, 1.0)])
def test_the_weight_decay_advice_keeps_the_bound_it_states(lr, wd, data_root, tmp_path):
    """learning_rate * weight_decay >= 1 is refused; every value the line suggests must pass that check."""
    import re
    code, _, err = run_cli(["train.py", BASE, f"--learning_rate={lr}", f"--weight_decay={wd}", "--min_lr=0",
                            f"--data_dir={data_root}", f"--out_dir={tmp_path}/run", "--device=cpu"])
    assert_refused(code, err, "learning_rate * weight_decay", max_lines=1)
    bound = float(re.search(r"weight_decay below ([0-9.e+-]+)", err).group(1))
    assert bound == pytest.approx(1 / lr, rel=1e-5)
    lr_example = re.search(r"lower it \(e\.g\. ([0-9.e+-]+)\)", err)
    wd_example = re.search(r"weight_decay below [0-9.e+-]+ \(e\.g\. ([0-9.e+-]+)\)", err)
    assert lr_example or wd_example, err
    assert not lr_example or float(lr_example.group(1)) * wd < 1, err
    assert not wd_example or float(wd_example.group(1)) < bound, err
