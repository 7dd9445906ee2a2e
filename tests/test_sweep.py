"""sweep.py trains config x seed, skips and resumes on a re-run; compare.py groups seeds (mean ± std)."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import ROOT
from tools import compare

TINY = ["--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=32", "--batch_size=8",
        "--eval_iters=5", "--eval_interval=10", "--log_interval=10", "--warmup_iters=5", "--learning_rate=1e-2"]


def sweep_cmd(data_root, out, configs=("config/mha.py", "config/gqa.py"), seeds="1,2", max_iters=20):
    return [sys.executable, "-m", "tools.sweep", *configs, f"--seeds={seeds}", f"--out={out}",
            f"--data_dir={data_root}",
            *TINY, f"--max_iters={max_iters}", f"--lr_decay_iters={max_iters}"]


def cell_mean_std(report, config, column):
    """(mean, std) parsed from the report row of `config`, column index after the config name."""
    row = next(line for line in report.splitlines() if line.startswith(f"| {config} |"))
    cell = row.split("|")[1 + column].strip()
    mean, std = cell.split(" ± ")
    return float(mean), (None if std == "-" else float(std))


def test_sweep_trains_each_run_once_and_reports_seed_statistics(data_root, tmp_path):
    out = tmp_path / "sw"
    r = subprocess.run(sweep_cmd(data_root, out), cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    runs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert runs == ["gqa-s1", "gqa-s2", "mha-s1", "mha-s2"]
    progress = [line for line in r.stdout.splitlines() if line.startswith("[")]
    assert len(progress) == 4 and all("run ETA" in line and "sweep ETA" in line for line in progress)
    report = (out / "report.md").read_text()
    for config in ("mha", "gqa"):
        best = [json.loads((out / f"{config}-s{s}" / "summary.json").read_text())["best_val_loss"] for s in (1, 2)]
        assert best[0] != best[1]  # the seeds differ, so the std has something to measure
        mean, std = cell_mean_std(report, config, 5)
        assert mean == pytest.approx(np.mean(best), abs=1e-4) and std == pytest.approx(np.std(best, ddof=1), abs=1e-4)
        assert f"| {config} | 2 |" in report
    assert (out / "report.png").stat().st_size > 1000

    mtimes = {p: os.path.getmtime(p) for p in out.glob("*/ckpt.pt")}
    assert len(mtimes) == 4
    r2 = subprocess.run(sweep_cmd(data_root, out), cwd=ROOT, capture_output=True, text=True, check=False)
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout.count("skipped") == 4 and ": training" not in r2.stdout
    assert {p: os.path.getmtime(p) for p in out.glob("*/ckpt.pt")} == mtimes
    assert (out / "report.md").read_text() == report

    # a plain sweep grows by a config: only the new one trains, and the plan names all three
    r3 = subprocess.run(sweep_cmd(data_root, out, ("config/mha.py", "config/mqa.py"), seeds="1"), cwd=ROOT,
                        capture_output=True, text=True, check=False)
    assert r3.returncode == 0, r3.stderr
    assert "mha-s1: finished, skipped" in r3.stdout and "mqa-s1: training" in r3.stdout
    plan = json.loads((out / "plan.json").read_text())
    assert plan["inputs"]["configs"] == ["config/gqa.py", "config/mha.py", "config/mqa.py"]


@pytest.mark.parametrize("jobs", [1, 2])
def test_killed_sweep_completes_when_rerun(data_root, tmp_path, jobs):
    """SIGTERM: the running runs save and stop, no further run starts (with --jobs=2 too), the
    sweep exits; the same command then resumes and finishes everything."""
    out = tmp_path / "sw"
    seeds = "1,2" if jobs == 1 else "1,2,3"
    cmd = sweep_cmd(data_root, out, configs=("config/mha.py",), seeds=seeds, max_iters=60) + [f"--jobs={jobs}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt, deadline = out / "mha-s1" / "ckpt.pt", time.time() + 120
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # mid-run: the first checkpoint (iteration 10 of 60) is on disk
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert not (out / f"mha-s{jobs + 1}").exists()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert "mha-s1: resuming" in r.stdout and f"mha-s{jobs + 1}: training" in r.stdout
    for seed in range(1, jobs + 2):
        summary = json.loads((out / f"mha-s{seed}" / "summary.json").read_text())
        assert summary["iters"] == 60 and summary.get("finished", True)
    assert "--init_from=resume" in (out / "mha-s1" / "train.log").read_text()
    assert f"| mha | {jobs + 1} |" in (out / "report.md").read_text()

def start_sweep_and_wait_for_a_checkpoint(cmd, out):
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt, deadline = out / "mha-s1" / "ckpt.pt", time.time() + 120
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    return proc


def train_pid(out):
    return json.loads((out / "mha-s1" / "train.lock").read_text())["pid"]


def gone(pid, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and the parent-death signal are Linux's")
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL])
def test_a_stopped_or_killed_sweep_leaves_no_run_behind(data_root, tmp_path, sig):
    """SIGHUP is forwarded; after kill -9 of the sweep its train.py gets SIGTERM: either way the
    run saves a checkpoint at the iteration it reached and exits (it trained on as an orphan)."""
    out = tmp_path / "sw"
    cmd = sweep_cmd(data_root, out, configs=("config/mha.py",), seeds="1", max_iters=2000)
    proc = start_sweep_and_wait_for_a_checkpoint(cmd, out)
    pid = train_pid(out)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert gone(pid), f"train.py pid {pid} still runs after the sweep got {sig.name}"
    log = (out / "mha-s1" / "train.log").read_text()
    assert "checkpoint saved" in log and not (out / "mha-s1" / "train.lock").exists()


def test_a_run_another_process_trains_is_skipped_not_fatal(data_root, tmp_path):
    """Two sweeps over one folder: the second skips the run the first holds and does the rest."""
    out = tmp_path / "sw"
    (out / "mha-s1").mkdir(parents=True)
    (out / "mha-s1" / "train.lock").write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    r = subprocess.run(sweep_cmd(data_root, out, configs=("config/mha.py",), seeds="1,2", max_iters=10),
                       cwd=ROOT, capture_output=True, text=True)
    assert "mha-s1: busy (train.py pid" in r.stdout and "mha-s2: training" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 1 and json.loads((out / "mha-s2" / "summary.json").read_text())["finished"]



def test_a_plan_resumes_with_its_configs_in_any_order_unless_a_budget_is_matched():
    """Without --match a sweep's configs are a set; with it the first is the reference, so order counts.
    A sweep may grow by configs, tune or borrow rates for more (each config's rate is its own)."""
    from tools.sweep import same_inputs
    plan = {"configs": ["a.py", "b.py"], "overrides": [], "match": [], "lr_grid": None}
    assert same_inputs(plan, {**plan, "configs": ["b.py", "a.py"]})
    assert same_inputs(plan, {**plan, "configs": ["a.py", "c.py"]}) and same_inputs(plan, {**plan, "configs": ["a.py"]})
    assert not same_inputs(plan, {**plan, "configs": ["a.py", "c.py"], "overrides": ["--n_embd=32"]})
    tuned = {**plan, "lr_grid": [1e-3, 3e-3]}
    assert same_inputs(tuned, {**tuned, "configs": ["b.py", "a.py"]})
    assert same_inputs(tuned, {**tuned, "configs": ["a.py", "c.py"]})
    assert same_inputs(tuned, {**tuned, "configs": ["a.py"]})
    assert not same_inputs(tuned, {**tuned, "configs": ["a.py", "c.py"], "lr_grid": [1e-3]})
    borrowed = {**plan, "lr_from": "x/plan.json"}   # looked up per config
    assert same_inputs(borrowed, {**borrowed, "configs": ["a.py", "c.py"]})
    assert not same_inputs(borrowed, {**borrowed, "configs": ["a.py", "c.py"], "lr_from": "y/plan.json"})
    matched = {**plan, "match": ["params"]}
    assert same_inputs(matched, matched) and not same_inputs(matched, {**matched, "configs": ["b.py", "a.py"]})


@pytest.mark.parametrize("extra, words", [(["--n_embd=33"], "n_embd"), (["--no_such_key=1"], "no_such_key"),
                                          (["--seed=3"], "seeds")])
def test_sweep_refuses_bad_input_before_training(data_root, tmp_path, capsys, extra, words):
    from tools import sweep
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(sweep_cmd(data_root, tmp_path / "sw")[3:] + extra)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and words in err
    assert not (tmp_path / "sw").exists()


def write_run(folder, best, final, attention="mha", state_bytes=0, torn=False):
    folder.mkdir(parents=True)
    summary = {"attention": attention, "pos_encoding": "rope", "params": 800_000, "best_val_loss": best,
               "final_val_loss": final, "iters": 100, "tokens_per_sec": 1000.0, "peak_mem_bytes": 2 ** 30,
               "kv_cache_bytes_per_token": 0 if state_bytes else 4096, "cache_state_bytes": state_bytes,
               "wall_s": 10.0}
    (folder / "summary.json").write_text(json.dumps(summary))
    lines = [json.dumps({"iter": i, "val_loss": final + 1 - i / 100, "elapsed_s": i / 10.0}) for i in (0, 50, 100)]
    (folder / "log.jsonl").write_text("\n".join(lines) + ("\n{\"iter\": 15" if torn else "\n"))


def test_compare_groups_seeds_and_reads_paired_verdicts(tmp_path):
    losses = {"ref": [1.0, 1.1, 1.2], "far": [1.5, 1.6, 1.7], "near": [1.12, 1.08, 1.16]}
    for name, values in losses.items():
        for seed, best in enumerate(values, 1):
            write_run(tmp_path / f"{name}-s{seed}", best, best + 0.01, torn=seed == 2)
    write_run(tmp_path / "gla-single", 1.3, 1.31, attention="gla", state_bytes=65536)
    dirs = [str(tmp_path / f"{n}-s{s}") for n in losses for s in (1, 2, 3)] + [str(tmp_path / "gla-single")]
    compare.main([*dirs, "--out", str(tmp_path / "rep")])
    report = (tmp_path / "rep" / "report.md").read_text()
    ref = np.array(losses["ref"])
    for name, values in losses.items():
        v = np.array(values)
        mean, std = cell_mean_std(report, name, 5)
        assert (mean, std) == (pytest.approx(v.mean(), abs=5e-5), pytest.approx(v.std(ddof=1), abs=5e-5))
        final_mean, _ = cell_mean_std(report, name, 6)
        assert final_mean == pytest.approx(v.mean() + 0.01, abs=5e-5)
        if name == "ref":
            continue
        row = next(line for line in report.splitlines() if line.startswith(f"| {name} |"))
        assert row.split("|")[9].strip() == f"{v.mean() - ref.mean():+.4f}"   # the unpaired difference of means
    verdict = {name: next(line for line in report.splitlines() if line.startswith(f"| {name} |") and "[" in line)
               .split("|")[7].strip() for name in ("far", "near")}
    # far is 0.5 above ref at every seed (worse); near's paired differences (+0.12, -0.02, -0.04) decide nothing
    assert verdict == {"far": "worse", "near": "undetermined"}
    gla = next(line for line in report.splitlines() if line.startswith("| gla-single |"))
    assert "| 1 |" in gla and "1.3000 ± -" in gla and "65,536" in gla  # one run: no std; GLA's state shown
    assert "| gla-single | <2 |" in report   # no seed shared with ref: no paired statistics


def test_the_lr_grid_ranks_recall_runs_by_solving_then_accuracy():
    """Text runs: lowest best val loss. MQAR runs: a run that reached stop_val_acc beats one that did
    not (whatever their losses), sooner beats later, and among unsolved runs the higher accuracy wins."""
    from tools.sweep import lr_rank
    text = [{"best_val_loss": 1.5}, {"best_val_loss": 1.2}]
    assert min(text, key=lr_rank) is text[1]
    late = {"best_val_loss": 0.01, "best_val_acc": 0.995, "target_reached_iter": 900}
    soon = {"best_val_loss": 0.05, "best_val_acc": 0.991, "target_reached_iter": 400}
    close = {"best_val_loss": 0.001, "best_val_acc": 0.985, "target_reached_iter": None}
    far = {"best_val_loss": 0.0005, "best_val_acc": 0.6, "target_reached_iter": None}
    assert sorted([far, close, late, soon], key=lr_rank) == [soon, late, close, far]


def test_sweep_flags_and_train_overrides_are_split_in_order():
    """The sweep's own flags (either --flag=v or --flag v) are its; every other --key=value goes to train.py
    as written, configs keep their order around them (the first is the reference), and a key the sweep
    sets per run is refused."""
    from tools import sweep
    from trainer.cli import ConfigError
    configs, flags, overrides = sweep.parse_flags(
        ["config/mha.py", "--n_layer=2", "config/gqa.py", "--seeds", "3,4", "--out=o", "--lr=5e-4",
         "--lr_grid=1e-3,2e-3", "config/mla.py", "--min_lr=-0"])
    assert configs == ["config/mha.py", "config/gqa.py", "config/mla.py"]
    assert flags == {"seeds": "3,4", "out": "o", "lr_grid": "1e-3,2e-3"}
    assert overrides == ["--n_layer=2", "--lr=5e-4", "--min_lr=-0"]    # --lr is no abbreviation of --lr_grid
    for reserved in ("--seed=1", "--out_dir=x", "--init_from=resume"):
        with pytest.raises(ConfigError, match="the sweep sets"):
            sweep.parse_flags(["config/mha.py", reserved])


def test_lr_from_trains_each_config_at_the_rate_an_earlier_plan_chose(data_root, tmp_path, capsys):
    """--lr_from=PLAN: mha and gqa at the rates written in the plan here (min_lr keeps its tenth), and a plan
    without a config's rate refused in one line before any training."""
    from tools import sweep
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"configs": {"mha": {"learning_rate": 2e-3}, "gqa": {"learning_rate": 5e-3}}}))
    args = sweep_cmd(data_root, tmp_path / "sw", seeds="1", max_iters=2)[3:]
    sweep.main([*args, f"--lr_from={plan}", "--min_lr=1e-3"])
    for name, lr in (("mha", 2e-3), ("gqa", 5e-3)):
        summary = json.loads((tmp_path / "sw" / f"{name}-s1" / "summary.json").read_text())
        assert summary["learning_rate"] == pytest.approx(lr) and summary["settings"]["min_lr"] == pytest.approx(lr / 10)
    # the sweep grows by a config: its rate is looked up then, the finished runs keep theirs
    plan.write_text(json.dumps({"configs": {"mha": {"learning_rate": 9e-3}, "mqa": {"learning_rate": 3e-3}}}))
    sweep.main([*sweep_cmd(data_root, tmp_path / "sw", ("config/mha.py", "config/mqa.py"), seeds="1", max_iters=2)[3:],
                f"--lr_from={plan}", "--min_lr=1e-3"])
    summary = json.loads((tmp_path / "sw" / "mqa-s1" / "summary.json").read_text())
    assert summary["learning_rate"] == pytest.approx(3e-3)
    assert json.loads((tmp_path / "sw" / "plan.json").read_text())["configs"]["mha"]["learning_rate"] == 2e-3
    plan.write_text(json.dumps({"configs": {"mha": {"learning_rate": 2e-3}}}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        sweep.main([*sweep_cmd(data_root, tmp_path / "sw2", seeds="1", max_iters=2)[3:], f"--lr_from={plan}"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "holds no learning rate chosen for gqa" in err
    assert len(err.strip().splitlines()) == 1
    assert not list((tmp_path / "sw2").glob("*-s1"))


def test_a_tuned_sweep_grows_by_a_config_whose_rate_is_tuned_then(data_root, tmp_path, capsys):
    """--lr_grid chooses each config's rate from its own grid runs: a re-run that adds mqa trains mqa's grid
    and its run only; mha keeps the rate it was given and its runs are skipped, the plan names both."""
    from tools import sweep
    out = tmp_path / "sw"
    grid = ["--lr_grid=1e-3,2e-2", "--lr_fraction=0.5"]
    sweep.main([*sweep_cmd(data_root, out, ("config/mha.py",), seeds="1", max_iters=4)[3:], *grid])
    first = json.loads((out / "plan.json").read_text())["configs"]["mha"]
    mtime = os.path.getmtime(out / "lr" / "mha-lr0.001-s1" / "summary.json")
    capsys.readouterr()
    sweep.main([*sweep_cmd(data_root, out, ("config/mha.py", "config/mqa.py"), seeds="1", max_iters=4)[3:], *grid])
    said = capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    assert plan["configs"]["mha"] == first and sorted(plan["inputs"]["configs"]) == ["config/mha.py", "config/mqa.py"]
    assert set(plan["configs"]["mqa"]["lr_grid"]) == {"0.001", "0.02"}
    assert os.path.getmtime(out / "lr" / "mha-lr0.001-s1" / "summary.json") == mtime
    assert "mha-s1: finished, skipped" in said and "mqa: learning_rate" in said and "mha: learning_rate" not in said


def test_a_restored_run_keeps_its_test_evaluation(tmp_path):
    """A run copied back by tools.tables.store --restore has test_eval.json and no best.pt: the sweep
    keeps its evaluation instead of failing on the missing checkpoint; a run whose best.pt is newer
    than its evaluation is evaluated again."""
    from tools import sweep

    class Recorder:
        def __init__(self):
            self.cmds = []

        def run(self, cmd, log_path):
            self.cmds.append(cmd)
            return 0

    restored, stale = tmp_path / "restored-s1", tmp_path / "stale-s1"
    for run in (restored, stale):
        run.mkdir()
        (run / "test_eval.json").write_text("[]")
    (stale / "best.pt").write_text("newer")
    os.utime(stale / "test_eval.json", (0, 0))
    runner = Recorder()
    runs = [("config/mha.py", 1, str(run), []) for run in (restored, stale)]
    sweep.evaluate_on_test(runner, runs)
    assert [c[3] for c in runner.cmds] == [str(stale)]
