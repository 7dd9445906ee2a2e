"""A trainer you can leave alone: kills at any moment (also mid-write), non-finite losses,
signals, two runs on one out_dir, bad settings and bad checkpoints, --help.

The reference for every resumed run is an uninterrupted run of the same settings: its losses
must come out equal, and the files in out_dir must read as if nothing had happened."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

import train
from helpers import ROOT, train_args
from trainer.build import Dist
from trainer.runfiles import BadStepWatch, NonFinite

COMMON = ("--eval_interval=10", "--log_interval=5", "--attention=gqa", "--n_kv_head=2", "--dropout=0.1")


def strict_json(path):
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")
    with open(path) as f:
        return json.loads(f.read(), parse_constant=refuse)


def read_log(out):
    with open(out / "log.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def reference_dir(data_root, tmp_path_factory):
    """An uninterrupted 40-iteration run: its folder."""
    out = tmp_path_factory.mktemp("reference")
    train.main(train_args(data_root, out, "--max_iters=40", *COMMON))
    return out


@pytest.fixture(scope="module")
def reference(reference_dir):
    return read_log(reference_dir)


def spawn(data_root, out, *extra, script="train.py"):
    args = [sys.executable, "-u", os.path.join(ROOT, script), *train_args(data_root, out, *COMMON, *extra)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SLOW_SAVE_S": "1.0"}
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def wait_for(proc, predicate, timeout=180):
    """Read the child's output lines until predicate(line) holds; returns the lines read."""
    lines, deadline = [], time.time() + timeout
    for line in proc.stdout:
        lines.append(line)
        if predicate(line) or time.time() > deadline:
            break
    return lines


def finish(proc):
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def assert_consistent(out, reference):
    log = read_log(out)
    iters = [r["iter"] for r in log]
    assert iters == sorted(set(iters)), iters                          # strictly increasing, no duplicates
    elapsed = [r["elapsed_s"] for r in log]
    assert elapsed == sorted(elapsed), elapsed                         # never runs backwards
    assert iters == [r["iter"] for r in reference]
    for a, b in zip(log, reference):
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-5 and abs(a["train_loss"] - b["train_loss"]) < 1e-5, (a, b)
    assert not [name for name in os.listdir(out) if name.endswith(".tmp")]
    assert not os.path.exists(out / "train.lock")


def test_sigkill_at_any_moment_then_resume_equals_uninterrupted(data_root, tmp_path, reference):
    out = tmp_path / "run"
    rng = random.Random(0)
    # 1: killed in the middle of its second ckpt.pt write (the first, at iter 10, is complete)
    proc = spawn(data_root, out, "--max_iters=40", script="tests/slow_save_train.py")
    saves = 0

    def second_save(line):
        nonlocal saves
        saves += line.startswith("SAVING ckpt.pt")
        return saves == 2
    wait_for(proc, second_save)
    proc.kill()
    finish(proc)
    assert any(name.endswith(".tmp") for name in os.listdir(out))     # a torn write was left behind
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 10
    # 2-4: killed at random moments after the run got going; each resume must load what it finds
    for _ in range(3):
        resumed = (out / "ckpt.pt").exists()
        proc = spawn(data_root, out, "--max_iters=40", *(["--init_from=resume"] if resumed else []),
                     script="tests/slow_save_train.py")
        wait_for(proc, lambda line: line.startswith(("iter ", "SAVING")))
        time.sleep(rng.uniform(0.0, 1.5))
        proc.kill()
        finish(proc)
        ckpt = torch.load(out / "ckpt.pt", weights_only=True)            # always loadable
        logged = [r["iter"] for r in read_log(out)] if (out / "log.jsonl").exists() else [0]
        assert ckpt["iter_num"] >= max(logged) - 10                      # at most one eval_interval lost
    code, text = finish(spawn(data_root, out, "--max_iters=40", "--init_from=resume"))
    assert code == 0, text[-2000:]
    assert_consistent(out, reference)
    summary = strict_json(out / "summary.json")
    assert summary["finished"] is True and summary["iters"] == 40
    assert summary["tokens"] == 40 * 8 * 32                              # cumulative over the segments
    assert summary["wall_s"] >= read_log(out)[-1]["elapsed_s"]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_saves_at_the_current_iteration_and_resumes_exactly(data_root, tmp_path, reference, sig, code):
    out = tmp_path / "run"
    proc = spawn(data_root, out, "--max_iters=40", script="tests/slow_save_train.py")  # slow: still running
    wait_for(proc, lambda line: line.startswith("iter 5/"))
    proc.send_signal(sig)
    rc, text = finish(proc)
    assert rc == code, text[-2000:]
    stopped = [line for line in text.splitlines() if line.startswith("stopped at iter")]
    assert len(stopped) == 1 and "Traceback" not in text, text[-2000:]
    at = int(stopped[0].split()[3])
    assert 5 <= at <= 40 and torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == at
    assert strict_json(out / "summary.json")["finished"] is False
    train.main(train_args(data_root, out, "--max_iters=40", "--init_from=resume", *COMMON))
    assert_consistent(out, reference)


def test_non_finite_loss_stops_with_3_and_keeps_the_last_good_checkpoint(data_root, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=20", *COMMON))
    good = torch.load(out / "ckpt.pt", weights_only=True)
    original = train.Trainer.train_step

    def poisoned(self, *args):
        result = original(self, *args)
        if self.iter_num >= 23:  # from here on the weights and the loss are NaN
            with torch.no_grad():
                next(self.raw.parameters()).fill_(float("nan"))
            return (*result[:3], result[3] * float("nan"), result[4])
        return result
    monkeypatch.setattr(train.Trainer, "train_step", poisoned)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        train.main(train_args(data_root, out, "--max_iters=40", "--init_from=resume", *COMMON))
    assert stop.value.code == 3
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "iter 23" in errors[0] and "learning_rate" in errors[0], errors
    kept = torch.load(out / "ckpt.pt", weights_only=True)
    assert kept["iter_num"] == 20 and all(torch.isfinite(t).all() for t in kept["model"].values())
    assert all(torch.equal(kept["model"][k], good["model"][k]) for k in good["model"])
    summary = strict_json(out / "summary.json")
    assert summary["finished"] is False and summary["stopped"] == "non-finite loss"


def test_best_weights_kept_and_sampled_by_default(reference_dir, reference, capsys):
    import sample
    best = torch.load(reference_dir / "best.pt", weights_only=True)
    later = [r for r in reference if r["iter"] > 0]
    assert best["iter_num"] == min(later, key=lambda r: r["val_loss"])["iter"]
    assert "optimizer" not in best and set(best["model"]) == set(torch.load(reference_dir / "ckpt.pt",
                                                                             weights_only=True)["model"])
    outputs = {}
    for which in ("best", "last", None):
        capsys.readouterr()
        sample.main([f"--out_dir={reference_dir}", "--temperature=0", "--max_new_tokens=20", "--start=ROMEO:",
                     *([f"--ckpt={which}"] if which else [])])
        outputs[which] = capsys.readouterr().out
    assert outputs[None] == outputs["best"]  # best.pt is the default
    capsys.readouterr()
    sample.main([f"--out_dir={reference_dir}", "--temperature=0", "--max_new_tokens=3", "--start=\n\n",
                 "--top_k=1"])
    out, err = capsys.readouterr()
    assert (not out.replace("-", "").strip()) == ("only whitespace" in err)  # the note comes exactly when due


def test_fp16_skipped_steps_stop_only_when_they_persist():
    watch = BadStepWatch("cpu", fp16=True, patience=5)
    finite, inf = torch.tensor(1.0), torch.tensor(float("inf"))
    for it in range(4):
        watch.update(it, finite, inf)          # 4 overflowing steps in a row: GradScaler skips them
    watch.update(4, finite, finite)            # a good step resets the count
    for it in range(5, 9):
        watch.update(it, finite, inf)
    watch.check(Dist("cpu"))                   # still fine: never 5 in a row
    watch.update(9, finite, inf)               # the 5th in a row
    with pytest.raises(NonFinite, match="iter 9"):
        watch.check(Dist("cpu"))
    strict = BadStepWatch("cpu", fp16=False)
    strict.update(0, finite, inf)              # without fp16 one non-finite norm is enough
    with pytest.raises(NonFinite, match="iter 0"):
        strict.check(Dist("cpu"))


def test_second_run_on_the_same_out_dir_is_refused(data_root, tmp_path):
    out = tmp_path / "run"
    first = spawn(data_root, out, "--max_iters=60", script="tests/slow_save_train.py")  # 1 s per save
    wait_for(first, lambda line: line.startswith("iter 5/"))
    r = subprocess.run([sys.executable, "train.py", *train_args(data_root, out, "--max_iters=60", *COMMON)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"pid {first.pid}" in r.stderr and "in use" in r.stderr
    code, text = finish(first)
    assert code == 0, text[-2000:]
    assert [row["iter"] for row in read_log(out)] == list(range(0, 61, 10))
    assert not os.path.exists(out / "train.lock")


def test_lock_of_a_dead_process_is_taken_over(data_root, tmp_path, capsys):
    import socket
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / "train.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": 0}))
    train.main(train_args(data_root, out, "--max_iters=2", "--eval_interval=2"))
    assert "taking over" in capsys.readouterr().err
    assert not os.path.exists(out / "train.lock") and read_log(out)[-1]["iter"] == 2


def write_checkpoints(base, good):
    """name -> path of a bad checkpoint: each way a file can be wrong."""
    ckpt = torch.load(good, weights_only=True)
    raw = good.read_bytes()
    marker = base / "code_ran"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    cases = {"empty": b"", "truncated": raw[:len(raw) // 2], "random": os.urandom(4096)}
    paths = {}
    for name, data in cases.items():
        (base / name).mkdir()
        (base / name / "ckpt.pt").write_bytes(data)
    (base / "code").mkdir()
    torch.save({**ckpt, "model": Exploit()}, base / "code" / "ckpt.pt")
    for name, change in {"nokeys": lambda c: c.pop("model"),
                         "variant": lambda c: c["model_args"].update(attention="flash9"),
                         "negiter": lambda c: c.update(iter_num=-5),  # resumed, it trained iterations -5..3
                         "nanbest": lambda c: c.update(best_val_loss=float("nan"))}.items():  # best.pt never again
        (base / name).mkdir()
        copy = torch.load(good, weights_only=True)
        change(copy)
        torch.save(copy, base / name / "ckpt.pt")
    for name in [*cases, "code", "nokeys", "variant", "negiter", "nanbest"]:
        paths[name] = base / name
    assert ckpt["iter_num"] == 2
    return paths, marker


BAD_CHECKPOINT_WORDS = {"empty": "is empty", "truncated": "truncated or not a checkpoint",
                        "random": "not a", "code": "weights-only loader", "nokeys": "lacks model",
                        "variant": "unknown attention", "negiter": "iter_num=-5 is negative",
                        "nanbest": "best_val_loss=nan is not a loss"}


def run_main(main, args, capsys):
    """main(args) in this process (no interpreter start-up): -> (exit status, stdout, stderr)."""
    capsys.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_bad_checkpoints_one_line_in_train_and_sample(data_root, tmp_path, capsys):
    import sample
    good = tmp_path / "good"
    train.main(train_args(data_root, good, "--max_iters=2", "--eval_interval=2"))
    paths, marker = write_checkpoints(tmp_path, good / "ckpt.pt")
    for name, folder in paths.items():
        for main, args in ((train.main, train_args(data_root, folder, "--init_from=resume", "--max_iters=4")),
                           (sample.main, [f"--out_dir={folder}", "--ckpt=last", "--max_new_tokens=3"])):
            code, out, err = run_main(main, args, capsys)
            assert code == 2, (name, main.__module__, err[-1500:])
            assert len(err.strip().splitlines()) == 1 and BAD_CHECKPOINT_WORDS[name] in err, (name, err)
            assert "ckpt.pt" in err and out == "", (name, out)
    assert not marker.exists()  # the code-carrying checkpoint never ran


def test_resume_refuses_other_model_keys_and_other_vocabularies(data_root, tmp_path):
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=2", "--eval_interval=2"))
    r = subprocess.run([sys.executable, "train.py", *train_args(data_root, out, "--init_from=resume", "--max_iters=4",
                                                                "--attention=mla", "--n_layer=3")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "attention='mla' (checkpoint: 'mha')" in r.stderr and "n_layer=3 (checkpoint: 2)" in r.stderr
    other = tmp_path / "data2" / "shakespeare_char"
    other.mkdir(parents=True)
    for name in ("train.bin", "val.bin"):
        (other / name).write_bytes((data_root / "shakespeare_char" / name).read_bytes())
    meta = json.loads((data_root / "shakespeare_char" / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "vocab_size": 100, "chars": meta["chars"] + ["?"] * 35}))
    args = train_args(data_root, out, "--init_from=resume", "--max_iters=4", f"--data_dir={other.parent}")
    r = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "vocab_size=65" in r.stderr and "100" in r.stderr, r.stderr


def bad_setting_cases(tmp_path, data_root):
    syntax = tmp_path / "syntax.py"
    syntax.write_text("n_layer = 2\nbatch_size = = 3\n")
    nometa = tmp_path / "nometa" / "d"
    nometa.mkdir(parents=True)
    for name in ("train.bin", "val.bin"):
        (nometa / name).write_bytes((data_root / "shakespeare_char" / name).read_bytes())
    (nometa / "meta.json").write_text(json.dumps({"dtype": "uint16"}))
    cases = [(["--learning_rate=-1e-3"], "learning_rate"), (["--beta1=2"], "beta1"), (["--max_iters=-5"], "max_iters"),
             (["--warmup_iters=-10"], "warmup_iters"), (["--weight_decay=-1"], "weight_decay"),
             (["--grad_clip=-1"], "grad_clip"), (["--seed=99999999999999999999"], "seed"),
             (["--device=foo"], "device='foo'"), (["--eval_only=True"], "init_from=resume"),
             ([str(syntax)], "syntax.py, line 2"), ([f"--data_dir={nometa.parent}", "--dataset=d"], "meta.json"),
             (["--dtype=float16"], "float16 needs CUDA"), (["--n_layr=3"], "did you mean 'n_layer'")]
    if not torch.backends.mps.is_available():
        cases.append((["--device=mps"], "MPS"))
    return cases


def test_bad_settings_are_refused_in_one_line_before_any_work(data_root, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("the float16 case is refused only off CUDA")
    for args, words in bad_setting_cases(tmp_path, data_root):
        out = tmp_path / "out"
        code, _, err = run_main(train.main, [*train_args(data_root, out), *args], capsys)
        assert code == 2, (args, err[-1500:])
        assert len(err.strip().splitlines()) == 1 and words in err, (args, err)
        assert not (out / "log.jsonl").exists()
    r = subprocess.run([sys.executable, "train.py", *train_args(data_root, tmp_path / "out"), "--beta1=2"],
                       cwd=ROOT, capture_output=True, text=True)  # and from the command line, as users see it
    assert r.returncode == 2 and r.stderr.startswith("error: beta1=2") and len(r.stderr.splitlines()) == 1


def test_help_lists_every_key_with_its_comment():
    r = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0
    for key in ("--learning_rate=", "--attention=", "--always_save_checkpoint=", "--n_kv_head="):
        assert key in r.stdout
    assert "clip the global gradient norm" in r.stdout  # the comment where grad_clip is defined
    lines = r.stdout.splitlines()
    assert "  # wandb" in lines                             # a section title on its own line
    # after a config file: its values (config/gqa.py sets n_kv_head = 2 and out_dir = "out-gqa")
    r = subprocess.run([sys.executable, "train.py", "config/gqa.py", "--help"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0 and "--n_kv_head=2 " in r.stdout and "--out_dir='out-gqa'" in r.stdout


def test_bfloat16_on_cpu_really_computes_in_bfloat16(data_root, tmp_path):
    runs = {}
    for dtype in ("float32", "bfloat16"):
        train.main(train_args(data_root, tmp_path / dtype, "--max_iters=4", "--eval_interval=4", f"--dtype={dtype}"))
        runs[dtype] = read_log(tmp_path / dtype)[-1]["train_loss"]
        assert strict_json(tmp_path / dtype / "summary.json")["dtype"] == dtype
    assert runs["float32"] != runs["bfloat16"] and abs(runs["float32"] - runs["bfloat16"]) < 0.1


def test_dtype_auto_stays_float32_on_cpus():
    """bf16 autocast is opt-in on CPUs, bf16 units or not (docs/speed.md: they do not tell whether it is faster)."""
    from trainer import settings
    assert settings.resolve_dtype("auto", "cpu") == settings.resolve_dtype("auto", "mps") == "float32"
    assert settings.resolve_dtype("bfloat16", "cpu") == "bfloat16"   # an explicit dtype is kept


def test_resume_keeps_the_dtype_the_run_trained_in(data_root, tmp_path):
    """dtype=auto depends on the machine: a run trained in bfloat16 and resumed without --dtype stays bfloat16
    (auto alone would say float32 on a CPU), and its checkpoint says which dtype it trained in."""
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=2", "--eval_interval=2", "--dtype=bfloat16"))
    assert torch.load(out / "ckpt.pt", weights_only=False)["dtype"] == "bfloat16"
    train.main(train_args(data_root, out, "--max_iters=4", "--eval_interval=2", "--init_from=resume"))
    assert strict_json(out / "summary.json")["dtype"] == "bfloat16"
    train.main(train_args(data_root, out, "--max_iters=6", "--eval_interval=2", "--init_from=resume",
                          "--dtype=float32"))   # an explicit dtype wins
    assert strict_json(out / "summary.json")["dtype"] == "float32"


def child_pids(pid):
    """Processes whose parent is pid (from /proc; Linux)."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the ranks through /proc")
def test_torchrun_a_signal_to_one_rank_stops_every_rank_at_the_same_iteration(data_root, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "tests/slow_save_train.py", *train_args(data_root, out, *COMMON, "--max_iters=40",
                                                   "--gradient_accumulation_steps=2")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "SLOW_SAVE_S": "1.0", "PYTHONUNBUFFERED": "1"})
    wait_for(proc, lambda line: line.startswith("iter 5/"))
    ranks = child_pids(proc.pid)
    assert len(ranks) == 2, ranks
    os.kill(max(ranks), signal.SIGTERM)  # one rank only, as a node-local preemption would
    _, text = finish(proc)
    stopped = [line for line in text.splitlines() if line.startswith("stopped at iter")]
    assert len(stopped) == 1, text[-3000:]
    at = int(stopped[0].split()[3])
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == at
    assert strict_json(out / "summary.json")["stopped"] == "SIGTERM"
