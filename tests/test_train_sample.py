"""train.py and sample.py end to end on Tiny Shakespeare: loss goes down, files appear,
resume continues, greedy sampling is the same with and without the cache, and bad input
gives one line and exit status 2."""
import json
import os
import subprocess
import sys

import pytest
import torch

import train
from helpers import ATTENTIONS, POS_ENCODINGS, ROOT, assert_sampling_same_with_and_without_cache, train_args
from trainer.build import clip_grad_norm


def run_script(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_training_lowers_loss_writes_files_and_resumes(data_root, tmp_path):
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=40", "--eval_interval=20", "--attention=gqa", "--n_kv_head=2"))
    log = read_log(out)
    assert [r["iter"] for r in log] == [0, 20, 40]
    assert log[-1]["val_loss"] < log[0]["val_loss"] - 0.5
    for key in ("train_loss", "val_loss", "lr", "tokens_per_sec", "elapsed_s"):
        assert key in log[-1]
    summary = json.load(open(out / "summary.json"))
    for key in ("attention", "pos_encoding", "params", "best_val_loss", "final_val_loss", "iters",
                "tokens_per_sec", "peak_mem_bytes", "kv_cache_bytes_per_token", "wall_s"):
        assert key in summary
    assert summary["iters"] == 40 and summary["kv_cache_bytes_per_token"] == 2 * 2 * 8 * 2 * 4  # L*2*Hkv*D*fp32
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 40 and ckpt["model_args"]["attention"] == "gqa"

    train.main(train_args(data_root, out, "--max_iters=60", "--eval_interval=20", "--init_from=resume"))
    log = read_log(out)
    assert [r["iter"] for r in log] == [0, 20, 40, 60]
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 60


def test_resume_reproduces_an_uninterrupted_run(data_root, tmp_path):
    """Restored weights and optimizer, re-derived batches and dropout: 20+20 iterations == 40 in one go."""
    common = ("--eval_interval=20", "--attention=mqa", "--dropout=0.2")  # dropout: its masks must repeat too
    train.main(train_args(data_root, tmp_path / "a", "--max_iters=40", *common))
    train.main(train_args(data_root, tmp_path / "b", "--max_iters=20", *common))
    train.main(train_args(data_root, tmp_path / "b", "--max_iters=40", "--init_from=resume", *common))
    a, b = read_log(tmp_path / "a"), read_log(tmp_path / "b")
    assert abs(a[-1]["val_loss"] - b[-1]["val_loss"]) < 1e-5


def test_resume_may_change_the_chunk_length_but_not_the_model(data_root, tmp_path):
    """A deltanet run made at chunks of 32 resumes at 16 (the default moved; the same math), and its
    resumed loss stays that of the uninterrupted run at 32 to rounding; a model key still refuses."""
    common = ("--eval_interval=20", "--attention=deltanet", "--pos_encoding=none")
    train.main(train_args(data_root, tmp_path / "a", "--max_iters=40", "--delta_chunk=32", *common))
    train.main(train_args(data_root, tmp_path / "b", "--max_iters=20", "--delta_chunk=32", *common))
    train.main(train_args(data_root, tmp_path / "b", "--max_iters=40", "--init_from=resume", "--delta_chunk=16",
                          *common))
    assert torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["model_args"]["delta_chunk"] == 16
    assert abs(read_log(tmp_path / "a")[-1]["val_loss"] - read_log(tmp_path / "b")[-1]["val_loss"]) < 1e-3
    with pytest.raises(SystemExit):
        train.main(train_args(data_root, tmp_path / "b", "--max_iters=60", "--init_from=resume", "--delta_conv=2",
                              *common))


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("pos_encoding", POS_ENCODINGS)
def test_greedy_sample_same_with_and_without_cache(data_root, tmp_path, capsys, attention, pos_encoding):
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=80", "--eval_interval=80", f"--attention={attention}",
                          f"--n_kv_head={ATTENTIONS[attention]}", f"--pos_encoding={pos_encoding}"))
    assert_sampling_same_with_and_without_cache(out, capsys)


@pytest.mark.parametrize("args,words", [
    (["--no_such_key=1"], "unknown key"),
    (["--batch_size=big"], "wrong type"),
    (["--batch_size=1.5"], "wrong type"),
    (["--attention=gqa", "--n_head=4", "--n_kv_head=3"], "n_kv_head"),
    (["--attention=flash"], "unknown attention"),
    (["--pos_encoding=sinusoid"], "unknown pos_encoding"),
    (["--dataset=nope"], "dataset 'nope' is missing"),
    (["--dataset=shakespeare_char", "--data_dir=/nonexistent"], "python data/shakespeare_char/prepare.py"),
    (["config/does_not_exist.py"], "not found"),
    (["--out_dir=/dev/null/sub"], "cannot create out_dir"),
    (["--strategy=zero3"], "choose ddp or fsdp"),
])
def test_train_rejects_bad_input_in_one_line(data_root, tmp_path, args, words):
    r = run_script("train.py", "config/gqa.py", f"--data_dir={data_root}", f"--out_dir={tmp_path}", *args)
    assert r.returncode == 2
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "log.jsonl")  # no work started


def test_config_file_with_unknown_key_is_refused(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("n_layers = 4\n")
    r = run_script("train.py", str(bad))
    assert r.returncode == 2 and "unknown key 'n_layers'" in r.stderr


def test_sample_rejects_prompt_outside_vocabulary(data_root, tmp_path):
    train.main(train_args(data_root, tmp_path, "--max_iters=1", "--eval_interval=1"))
    r = run_script("sample.py", f"--out_dir={tmp_path}", "--start=caf\u00e9")
    assert r.returncode == 2 and "not in the model's vocabulary" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""
    r = run_script("sample.py", f"--out_dir={tmp_path / 'missing'}")
    assert r.returncode == 2 and "not found" in r.stderr
    for bad in ("--top_p=1.5", "--num_samples=0", "--temperature=-1", "--seed=x"):
        r = run_script("sample.py", f"--out_dir={tmp_path}", bad)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", bad
    if not torch.cuda.is_available():
        r = run_script("sample.py", f"--out_dir={tmp_path}", "--device=cuda")
        assert r.returncode == 2 and "CUDA is not available" in r.stderr


def torchrun(data_root, out, *extra):
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "train.py", *train_args(data_root, out, "--eval_interval=10", "--gradient_accumulation_steps=2",
                                                *extra)],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    # the whole of stderr: a rank's crash (its signal, its traceback) shows among every rank's lines
    assert r.returncode == 0, f"torchrun exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return read_log(out)


def test_ddp_and_fsdp_on_cpu_with_torchrun(data_root, tmp_path):
    """Two ranks over gloo. DDP: per-rank batches, gradient sync, rank-0-only logging and
    checkpoints. FSDP (sharded weights, gradients and AdamW state; clipping on, grad_clip=1)
    computes the same run as DDP: 10 iterations + resume + 10 equal DDP's 20 bit for bit;
    its checkpoint samples in one process."""
    ddp = torchrun(data_root, tmp_path / "ddp", "--max_iters=20")
    assert [row["iter"] for row in ddp] == [0, 10, 20]          # written once, by rank 0
    # the ranks share out the 5 evaluation windows (3 + 2): the same loss as one process
    one = tmp_path / "one"
    train.main(train_args(data_root, one, "--max_iters=0", "--eval_interval=10", "--gradient_accumulation_steps=2"))
    assert abs(read_log(one)[0]["val_loss"] - ddp[0]["val_loss"]) < 1e-5
    assert ddp[-1]["val_loss"] < ddp[0]["val_loss"] - 0.5
    assert torch.load(tmp_path / "ddp" / "ckpt.pt", weights_only=True)["iter_num"] == 20

    torchrun(data_root, tmp_path / "fsdp", "--max_iters=10", "--strategy=fsdp")
    fsdp = torchrun(data_root, tmp_path / "fsdp", "--max_iters=20", "--strategy=fsdp", "--init_from=resume")
    assert [row["iter"] for row in fsdp] == [0, 10, 20]
    # The same arithmetic in both (the clip's global norm is summed in float64, so the shard
    # order cannot change its float32 value): equal to the last bit on any one machine. A
    # tolerance would not help: at lr 1e-2 one ulp of difference grows to ~1e-3 in 20 steps.
    for a, b in zip(ddp, fsdp):
        assert (a["val_loss"], a["train_loss"]) == (b["val_loss"], b["train_loss"]), (a, b)
    r = run_script("sample.py", f"--out_dir={tmp_path / 'fsdp'}", "--max_new_tokens=5", "--device=cpu")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


def test_torchrun_bad_input_said_once(data_root, tmp_path):
    """A config error under torchrun: one line from rank 0, not one per rank."""
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "train.py", *train_args(data_root, tmp_path, "--gradient_accumulation_steps=3")],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode != 0 and len(errors) == 1 and "multiple of the 2 ranks" in errors[0], r.stderr[-2000:]


def test_clip_grad_norm_equals_torch_clip():
    """clip_grad_norm (float64 sum) against torch.nn.utils.clip_grad_norm_ (float32):
    the same norm and the same clipped gradients to float32 rounding, above and below the cap."""
    torch.manual_seed(0)
    for scale, max_norm in ((10.0, 1.0), (0.01, 1.0)):
        grads = [torch.randn(33, 17) * scale, torch.randn(5) * scale]
        ours = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        ref = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        norm = clip_grad_norm(ours, max_norm)
        ref_norm = torch.nn.utils.clip_grad_norm_(ref, max_norm)
        torch.testing.assert_close(norm, ref_norm, rtol=1e-6, atol=0)
        for p, q in zip(ours, ref):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-9)
        assert (torch.cat([p.grad.flatten() for p in ours]).norm() <= max_norm * (1 + 1e-6)) or scale < 1


def test_one_metrics_dict_feeds_log_summary_and_wandb(data_root, tmp_path, monkeypatch, capsys):
    """Each evaluation's metrics dict is the log.jsonl line, the wandb row (at its step) and,
    for the last one, summary.json's last_eval; the console's eval line prints its losses."""
    import types
    logged, summary_updates, init = [], {}, {}
    fake = types.SimpleNamespace(init=init.update, finish=lambda: None,
                                 log=lambda row, step: logged.append((step, dict(row))),
                                 summary=types.SimpleNamespace(update=summary_updates.update))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_MODE", "offline")  # no key here: train.py refuses without one or this
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=20", "--eval_interval=10", "--wandb_log=True"))
    log = read_log(out)
    assert [r["iter"] for r in log] == [0, 10, 20]
    evals = [(step, row) for step, row in logged if "val_loss" in row]
    assert [(r["iter"], r) for r in log] == evals               # wandb got exactly the logged dicts
    # and between evaluations, at every log_interval (10 here), the console line's loss, lr and speed
    steps = [(step, row) for step, row in logged if "val_loss" not in row]
    assert [step for step, _ in steps] == [10, 20] and all(set(row) == {"train/loss", "train/lr",
                                                                        "train/tokens_per_sec"} for _, row in steps)
    assert [step for step, _ in logged] == sorted(step for step, _ in logged)  # wandb's steps never go back
    assert init["config"]["config_files"] == [train_args(data_root, out)[0]] and init["config"]["n_layer"] == 2
    summary = json.load(open(out / "summary.json"))
    assert summary["last_eval"] == log[-1] == summary_updates["last_eval"]
    assert summary["final_val_loss"] == log[-1]["val_loss"] and summary["tokens_per_sec"] == log[-1]["tokens_per_sec"]
    console = capsys.readouterr().out
    for r in log:
        assert f"eval {r['iter']}: train {r['train_loss']:.4f}, val {r['val_loss']:.4f}" in console
    for step, row in steps:
        assert f"iter {step}/20 | loss {row['train/loss']:.4f} | lr {row['train/lr']:.2e} | " in console
