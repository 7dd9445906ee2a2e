"""Seeded sweeps: train every config x seed with the same overrides, then compare them.

    python -m tools.sweep config/mha.py config/gqa.py config/mla.py --seeds=1,2,3 --out=sweeps/cpu
    python -m tools.sweep config/mha.py config/gla.py --seeds=1,2 --out=sweeps/short
        --max_iters=500 --lr_decay_iters=500

Each run is `python train.py CONFIG --seed=S --out_dir=OUT/<config>-s<S> [overrides]` in its own
process (a crash or a kill of one run stays in it), one after another; its console output
goes to OUT/<config>-s<S>/train.log. Re-running the same command skips finished runs (a
summary.json saying finished) and resumes unfinished ones from their ckpt.pt, so a sweep
survives a kill. One progress line per run: which run, its ETA and the sweep's ETA. With
--wandb_log=True the runs share the wandb group named after OUT. At the end OUT/report.md
and OUT/report.png group the seeds of each config (compare.py: n, mean ± std).

Exit status: 0 all runs finished; 1 some run failed (the others still ran; see its
train.log); 2 bad input (before any training, or a run refused its input).
"""
import os
import signal
import subprocess
import sys
import time

from configurator import ConfigError, fail
from model import GPTConfig
from trainer.rundir import read_log, run_state
from trainer.settings import MODEL_KEYS, parse_keys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo root, where train.py is
RESERVED = ("seed", "out_dir", "init_from")  # the sweep sets these per run


def parse_args(argv):
    """(configs, seeds, out, overrides) from argv; ConfigError for anything wrong."""
    configs, seeds, out, overrides = [], None, None, []
    for arg in argv:
        if arg.startswith("--seeds="):
            try:
                seeds = [int(s) for s in arg.split("=", 1)[1].split(",") if s.strip()]
            except ValueError:
                raise ConfigError(f"{arg}: seeds are integers separated by commas, e.g. --seeds=1,2,3") from None
        elif arg.startswith("--out="):
            out = arg.split("=", 1)[1]
        elif arg.startswith("--"):
            key = arg[2:].partition("=")[0]
            if key in RESERVED:
                raise ConfigError(f"{arg}: the sweep sets {key} for each run; use --seeds and --out instead")
            overrides.append(arg)
        else:
            configs.append(arg)
    if not configs:
        raise ConfigError("no config files given; e.g. python -m tools.sweep config/mha.py config/gqa.py --seeds=1,2,3 "
                          "--out=sweeps/NAME")
    if not seeds:
        raise ConfigError("--seeds is missing or empty; e.g. --seeds=1,2,3")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds lists a seed twice ({seeds})")
    if not out:
        raise ConfigError("--out is missing; e.g. --out=sweeps/NAME (run folders and the report go there)")
    stems = [os.path.splitext(os.path.basename(c))[0] for c in configs]
    if len(set(stems)) != len(stems):
        raise ConfigError(f"two configs share a file name ({', '.join(configs)}); run folders are named after it")
    for path in configs:  # every key, type and model shape checked before any training starts
        cfg = parse_keys([path, *overrides])
        try:
            GPTConfig(vocab_size=1, **{k: cfg[k] for k in MODEL_KEYS})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{path}: {e}") from None
    if cfg["wandb_log"] and not any(o.startswith("--wandb_group=") for o in overrides):
        overrides.append(f"--wandb_group={os.path.basename(os.path.normpath(out))}")
    return configs, seeds, out, overrides


def iters_done(run_dir):
    log = read_log(run_dir)
    return log[-1]["iter"] if log else 0


def fmt_duration(seconds):
    if seconds is None:
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Runner:
    """Runs train.py for one run at a time; forwards SIGINT/SIGTERM to it so a killed sweep
    leaves the run's checkpoint behind for the next invocation."""

    def __init__(self):
        self.child, self.signalled = None, None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._forward)

    def _forward(self, signum, _frame):
        self.signalled = signum
        if self.child is None:
            sys.exit(128 + signum)
        if self.child.poll() is None:
            self.child.send_signal(signum)

    def train(self, config, seed, run_dir, overrides, state):
        cmd = [sys.executable, os.path.join(HERE, "train.py"), config, f"--seed={seed}", f"--out_dir={run_dir}",
               *overrides, *(["--init_from=resume"] if state == "resume" else [])]
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "train.log"), "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            # unbuffered: train.log shows where a run is while it runs
            self.child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
            rc = self.child.wait()
            self.child = None
        if self.signalled is not None:
            sys.exit(128 + self.signalled)
        return rc


def last_error_line(run_dir):
    with open(os.path.join(run_dir, "train.log")) as f:
        lines = [line.strip() for line in f if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return
    try:
        configs, seeds, out, overrides = parse_args(argv)
        max_iters = parse_keys([configs[0], *overrides])["max_iters"]
    except ConfigError as e:
        fail(str(e))
    # seed-major order: a sweep cut short still has every config at the first seeds
    stem = {c: os.path.splitext(os.path.basename(c))[0] for c in configs}
    runs = [(c, s, os.path.join(out, f"{stem[c]}-s{s}")) for s in seeds for c in configs]
    remaining = {run_dir: max(0, max_iters - iters_done(run_dir)) if run_state(run_dir) != "finished" else 0
                 for _, _, run_dir in runs}
    runner, failed = Runner(), []
    trained_s, trained_iters = 0.0, 0
    for i, (config, seed, run_dir) in enumerate(runs, 1):
        state = run_state(run_dir)
        name = os.path.basename(run_dir)
        if state == "finished":
            print(f"[{i}/{len(runs)}] {name}: finished, skipped", flush=True)
            continue
        s_per_iter = trained_s / trained_iters if trained_iters else None
        run_eta = s_per_iter and s_per_iter * remaining[run_dir]
        sweep_eta = s_per_iter and s_per_iter * sum(remaining.values())
        print(f"[{i}/{len(runs)}] {name}: {'resuming' if state == 'resume' else 'training'} "
              f"({remaining[run_dir]} iters left) | run ETA {fmt_duration(run_eta)} | "
              f"sweep ETA {fmt_duration(sweep_eta)}", flush=True)
        t0 = time.time()
        rc = runner.train(config, seed, run_dir, overrides, state)
        if rc == 2:
            fail(f"{name}: train.py refused its input: {last_error_line(run_dir)}")
        if rc != 0 or run_state(run_dir) != "finished":
            failed.append(name)
            print(f"    {name} failed (exit {rc}): {last_error_line(run_dir)}; see {run_dir}/train.log", flush=True)
        else:
            trained_s += time.time() - t0
            trained_iters += remaining[run_dir]
        remaining[run_dir] = 0
    report_runs(runs, out)
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}; fix and re-run the same command to resume them",
              file=sys.stderr)
        sys.exit(1)


def report_runs(runs, out):
    done = [run_dir for _, _, run_dir in runs if run_state(run_dir) == "finished"]
    if not done:
        return
    # the report is compare's, through its command line (no tool imports another entry script)
    r = subprocess.run([sys.executable, "-m", "tools.compare", *done, "--out", out], cwd=HERE)
    if r.returncode:
        sys.exit(r.returncode)


if __name__ == "__main__":
    main()
