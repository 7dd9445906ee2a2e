"""The run folder is the user's: nothing in it is lost or silently replaced. Each test here is a
way a run folder lost data before (a user's .tmp file, a scratch run over a finished one, a
resume on another vocabulary, a signal during a diverging step, a kill during the first
checkpoint, a sweep or compare mixing settings, two processes taking the lock at once)."""
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import train
from helpers import ROOT, cli_timeout, train_args
from trainer.runfiles import RunLock

COMMON = ("--eval_interval=10", "--log_interval=5")


def run_cli(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT, capture_output=True,
                          text=True)


def one_line(r, *words):
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert all(w in err[0] for w in words), err[0]


def test_only_the_runs_own_temporary_files_are_removed(data_root, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.tmp").write_text("a user's notes")
    (out / "scratch.tmp").mkdir()                     # a folder named *.tmp: left alone, no crash
    (out / "ckpt.pt.tmp").write_bytes(b"half a checkpoint from a killed run")
    train.main(train_args(data_root, out, "--max_iters=2", "--eval_interval=2"))
    assert (out / "notes.tmp").read_text() == "a user's notes" and (out / "scratch.tmp").is_dir()
    assert not (out / "ckpt.pt.tmp").exists() and not (out / "train.lock").exists()


def test_a_scratch_run_into_a_finished_run_is_refused_until_overwrite(data_root, tmp_path):
    out = tmp_path / "run"
    args = train_args(data_root, out, "--max_iters=20", *COMMON)
    train.main(args)
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()}
    r = run_cli(*train_args(data_root, out, "--max_iters=10", *COMMON))    # the crash-recovery reflex
    one_line(r, "already holds a run", "--init_from=resume", "--overwrite=True")
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()} == before
    train.main(train_args(data_root, out, "--max_iters=10", *COMMON, "--overwrite=True"))
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 10


def test_resume_on_another_character_mapping_is_refused(data_root, tmp_path):
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=10", *COMMON))
    other = tmp_path / "data" / "shakespeare_char"
    other.mkdir(parents=True)
    meta = json.loads((data_root / "shakespeare_char" / "meta.json").read_text())
    for split in ("train", "val"):
        (other / f"{split}.bin").write_bytes((data_root / "shakespeare_char" / f"{split}.bin").read_bytes())
    (other / "meta.json").write_text(json.dumps({**meta, "chars": meta["chars"][::-1]}))  # same size, other ids
    r = run_cli(*train_args(tmp_path / "data", out, "--max_iters=20", *COMMON, "--init_from=resume"))
    one_line(r, "other characters", "resume on the dataset it was trained on")
    (other / "meta.json").write_text(json.dumps({**meta, "chars": meta["chars"][:-1]}))  # 64 chars, vocab 65
    r = run_cli(*train_args(tmp_path / "data", tmp_path / "fresh", "--max_iters=2", *COMMON))
    one_line(r, "chars list has 64 entries", "vocab_size is 65")


def test_a_signal_during_a_diverging_step_keeps_the_last_good_checkpoint(data_root, tmp_path, capsys,
                                                                         monkeypatch):
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=20", *COMMON))
    good = torch.load(out / "ckpt.pt", weights_only=True)
    original = train.Trainer.train_step

    def diverging(self, *args):
        result = original(self, *args)
        if self.iter_num == 23:  # the step blows the weights up (still finite) while SIGTERM arrives
            with torch.no_grad():
                self.raw.wte.weight.mul_(1e38)   # max |w| ~1e37: finite, but the next forward overflows
            assert all(torch.isfinite(p).all() for p in self.raw.parameters())
            os.kill(os.getpid(), signal.SIGTERM)
        return result
    monkeypatch.setattr(train.Trainer, "train_step", diverging)
    with pytest.raises(SystemExit) as stop:
        train.main(train_args(data_root, out, "--max_iters=40", "--init_from=resume", *COMMON))
    assert stop.value.code == 3
    kept = torch.load(out / "ckpt.pt", weights_only=True)
    assert kept["iter_num"] == 20 and all(torch.equal(kept["model"][k], good["model"][k]) for k in good["model"])


def test_a_kill_during_the_first_checkpoint_leaves_a_run_that_says_what_to_do(data_root, tmp_path):
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=10", *COMMON))
    (out / "ckpt.pt").rename(out / "ckpt.pt.tmp")  # what a SIGKILL while writing the first ckpt.pt leaves
    r = run_cli(*train_args(data_root, out, "--max_iters=20", *COMMON, "--init_from=resume"))
    one_line(r, "best.pt is there", "--overwrite=True")
    train.main(train_args(data_root, out, "--max_iters=10", *COMMON, "--init_from=scratch", "--overwrite=True"))
    assert not (out / "ckpt.pt.tmp").exists() and (out / "ckpt.pt").exists()


SWEEP_TINY = ["--device=cpu", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4",
              "--eval_iters=2", "--eval_interval=5", "--log_interval=5", "--warmup_iters=1", "--max_iters=5",
              "--lr_decay_iters=5"]


def tiny_sweep(out, data_root):
    """A function running tools.sweep on config/mha.py, seed 1, tiny, into out (extra flags its arguments)."""
    def sweep(*extra):
        return subprocess.run([sys.executable, "-m", "tools.sweep", "config/mha.py", "--seeds=1", f"--out={out}",
                               f"--data_dir={data_root}", *SWEEP_TINY, *extra], cwd=ROOT, capture_output=True,
                              text=True)
    return sweep


def test_sweep_reads_dtype_auto_as_the_dtype_the_run_resolved(data_root, tmp_path):
    """A run made with dtype=auto counts as made in the dtype it resolved to: pinning that dtype in the
    config later keeps the run; pinning the other one is refused."""
    out = tmp_path / "sw"
    sweep = tiny_sweep(out, data_root)
    assert sweep().returncode == 0
    resolved = json.loads((out / "mha-s1" / "summary.json").read_text())["dtype"]
    other = "bfloat16" if resolved == "float32" else "float32"
    (out / "plan.json").unlink()     # the plan's own inputs would refuse any change of overrides first
    assert sweep(f"--dtype={resolved}").returncode == 0
    (out / "plan.json").unlink()
    one_line(sweep(f"--dtype={other}"), "mha-s1 was trained with other settings", f"dtype: '{resolved}' vs '{other}'")


def test_sweep_and_compare_never_mix_runs_made_with_other_settings(data_root, tmp_path, capsys):
    out = tmp_path / "sw"
    sweep = tiny_sweep(out, data_root)
    assert sweep().returncode == 0
    r = sweep("--learning_rate=3e-3")
    one_line(r, "sweep made with other settings", "overrides differ")
    (out / "plan.json").unlink()     # a folder from before plan.json: the run's own record still refuses
    r = sweep("--learning_rate=3e-3")
    one_line(r, "mha-s1 was trained with other settings", "learning_rate")
    other = tmp_path / "other" / "mha-s2"
    train.main(train_args(data_root, other, "--max_iters=5", "--eval_interval=5", "--seed=2"))
    from tools import compare
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        compare.main([str(out / "mha-s1"), str(other), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--allow_mixed" in err[0]
    compare.main([str(out / "mha-s1"), str(other), "--out", str(tmp_path / "rep"), "--allow_mixed"])
    assert "| mha | 2 |" in (tmp_path / "rep" / "report.md").read_text()


def _contend(folder, barrier, overlaps, wins):
    """One contender: take the lock, hold it briefly while checking nobody else holds it."""
    lock = RunLock(folder)
    barrier.wait()
    try:
        lock.acquire()
    except Exception:
        return
    marker = os.path.join(folder, "holder")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        with overlaps.get_lock():
            overlaps.value += 1
        lock.release()
        return
    with wins.get_lock():
        wins.value += 1
    time.sleep(0.002)
    os.close(fd)
    os.remove(marker)
    lock.release()


@pytest.mark.parametrize("stale", [False, True])
def test_lock_has_one_holder_under_hundreds_of_simultaneous_acquisitions(tmp_path, stale):
    """200 processes released at once (after a barrier) try to take one out_dir's lock; with
    stale=True a dead process's lock is there first, so all of them race to take it over."""
    import socket
    folder = str(tmp_path)
    if stale:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        (tmp_path / "train.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    ctx = multiprocessing.get_context("fork")
    n = 200
    barrier, overlaps, wins = ctx.Barrier(n), ctx.Value("i", 0), ctx.Value("i", 0)
    procs = [ctx.Process(target=_contend, args=(folder, barrier, overlaps, wins)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert overlaps.value == 0 and wins.value >= 1
    assert not (tmp_path / "train.lock").exists() and not (tmp_path / "train.lock.tmp").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 300 kB tmpfs (room for the first checkpoint files, not for all of them); skipped where
    this machine does not let the tests mount one."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()[:80] or 'not permitted'})")
    yield mnt
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_full_disk_at_a_checkpoint_stops_in_one_line_and_keeps_the_last_files(data_root, small_disk):
    out = small_disk / "run"
    r = run_cli(*train_args(data_root, out, "--max_iters=40", "--eval_iters=2", *COMMON))
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and err[-1].startswith("error: cannot write"), r.stderr
    assert "the disk is full" in err[-1] or "No space left" in err[-1]
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")] and not (out / "train.lock").exists()
    for name in ("best.pt", "ckpt.pt"):  # whatever was written whole is still loadable
        if (out / name).exists():
            torch.load(out / name, weights_only=True)


def child_pids(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_prepare_workers_die_with_a_killed_parent(tmp_path):
    """kill -9 of data/text/prepare.py leaves no worker running (they had stayed forever)."""
    big = tmp_path / "big.txt"
    text = open(os.environ["TINYSHAKESPEARE_INPUT"]).read() if os.environ.get("TINYSHAKESPEARE_INPUT") else \
        "the quick brown fox jumps over the lazy dog\n" * 25_000
    big.write_text(text * 30)
    proc = subprocess.Popen([sys.executable, "data/text/prepare.py", f"--input={big}", "--tokenizer=char",
                             f"--out_dir={tmp_path / 'out'}", "--num_proc=2"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while len(child_pids(proc.pid)) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    workers = child_pids(proc.pid)
    if proc.poll() is not None or len(workers) < 2:
        pytest.skip("prepare finished before its workers could be seen")
    time.sleep(1.0)  # let the workers pass their initializer
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while any(os.path.exists(f"/proc/{w}") and open(f"/proc/{w}/stat").read().split()[2] != "Z" for w in workers) \
            and time.time() < deadline:
        time.sleep(0.1)
    alive = [w for w in workers if os.path.exists(f"/proc/{w}") and open(f"/proc/{w}/stat").read().split()[2] != "Z"]
    assert not alive, f"workers {alive} outlived their parent"


def test_prepare_on_a_full_disk_is_one_line_and_leaves_nothing(small_disk, shakespeare_input):
    out = small_disk / "sc"
    r = subprocess.run([sys.executable, "data/shakespeare_char/prepare.py",
                        f"--input={shakespeare_input}", f"--out_dir={out}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=cli_timeout())
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(err) == 1 and "cannot write to" in err[0]
    assert not out.exists()


def test_run_reads_each_file_of_a_folder_and_the_checkpoint_header_without_its_weights(data_root, tmp_path):
    from model import GPT
    from trainer.checkpoint import CheckpointError
    from trainer.rundir import Run, RunError
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=4", "--eval_interval=2"))
    run = Run(out)
    assert run.name == "run" and run.summary == json.loads((out / "summary.json").read_text())
    assert run.log == [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    saved = torch.load(out / "best.pt", weights_only=True)
    assert run.header() == {k: v for k, v in saved.items() if k != "model"}
    assert (run.model_args, run.config, run.meta) == (saved["model_args"], saved["config"], saved["meta"])
    assert "optimizer" not in run.header("last") and run.header("last")["iter_num"] == 4
    model, ckpt = run.load_model("cpu")                      # trainer.checkpoint.load_model's order
    assert isinstance(model, GPT) and ckpt["iter_num"] == saved["iter_num"]
    assert all(torch.equal(model.state_dict()[k], w) for k, w in saved["model"].items())
    assert run.test_eval == {} and run.results == run.summary
    (out / "test_eval.json").write_text(json.dumps([{"run": "run", "test_loss": None},
                                                    {"run": "run", "test_loss": 1.25, "test_acc": 0.5}]))
    assert Run(out).results == {**run.summary, "test_loss": 1.25, "test_acc": 0.5}
    (out / "test_eval.json").write_text('{"test_loss": 1.0}')
    with pytest.raises(RunError, match="test_eval.json is not tools.eval's JSON"):
        Run(out).results
    # the header does not read the weights: a NaN weight stops the checked load, not the header
    saved["model"] = {k: torch.full_like(w, float("nan")) if w.is_floating_point() else w
                      for k, w in saved["model"].items()}
    torch.save(saved, out / "best.pt")
    assert Run(out).config == saved["config"]
    with pytest.raises(CheckpointError, match="non-finite weights"):
        Run(out).load_model("cpu")
    (out / "best.pt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="best.pt is not a PyTorch checkpoint"):
        Run(out).header()


def test_settings_compare_only_the_keys_a_run_reads():
    """A default of a key only the delta rule reads (delta_conv) changed between two runs: an mha run
    is the same run (a sweep resumes it), a deltanet run is not; a key every run reads always counts.
    A chunk length (delta_chunk, gla_chunk) never counts: the chunked forms compute the same math at
    any length, rounded otherwise, as a thread count rounds otherwise."""
    from trainer.rundir import settings_differ
    mha = {"attention": "mha", "learning_rate": 1e-3, "delta_conv": 4, "delta_chunk": 64, "gla_chunk": 64}
    assert settings_differ(mha, {**mha, "delta_conv": 2, "delta_chunk": 32, "gla_chunk": 16}) == []
    assert settings_differ(mha, {**mha, "learning_rate": 3e-3}) == ["learning_rate: 0.001 vs 0.003"]
    delta = {**mha, "attention": "deltanet"}
    assert settings_differ(delta, {**delta, "delta_conv": 2}) == ["delta_conv: 4 vs 2"]
    assert settings_differ(delta, {**delta, "delta_chunk": 16}) == []
    hybrid = {**mha, "attention": "gla,mha"}
    assert settings_differ(hybrid, {**hybrid, "gla_chunk": 16}) == []
