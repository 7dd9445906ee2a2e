"""Seeded sweeps: train every config x seed with the same overrides, then compare them.

    python -m tools.sweep config/mha.py config/gqa.py config/mla.py --seeds=1,2,3 --out=sweeps/cpu
    python -m tools.sweep config/mha.py config/gla.py --out=sweeps/fair --match=params,flops \\
        --lr_grid=5e-4,1e-3,2e-3,4e-3 --lr_fraction=0.25

Each run is `python train.py CONFIG --seed=S --out_dir=OUT/<config>-s<S> [overrides]` in its own
process (a crash or a kill of one run stays in it), one after another; its console output
goes to OUT/<config>-s<S>/train.log. Re-running the same command skips finished runs (a
summary.json saying finished) and resumes unfinished ones from their ckpt.pt, so a sweep
survives a kill. One progress line per run: which run, its ETA and the sweep's ETA. With
--wandb_log=True the runs share the wandb group named after OUT. Seeds default to 1,2,3,4,5.

A fair comparison (the first config is the reference; tools/budget.py does the arithmetic):
  --match=params      each other config's MLP width (mlp_hidden) solved so that its parameters are
                      within 1% of the reference's
  --match=flops       each config's max_iters (and lr_decay_iters) set for the reference's training
                      FLOPs; --match=time: for its wall time, from a --probe_iters throughput probe
                      run on this machine (OUT/probe/); params combines with either (params,flops)
  --lr_grid=a,b,...   each config trained at every rate with the first seed for --lr_fraction of
                      its budget (OUT/lr/), the rate of the lowest best validation loss chosen
                      (on datasets of examples: the soonest to reach stop_val_acc, else the best
                      val accuracy), then the seeds run at it (min_lr keeps its ratio to learning_rate)
  --lr_from=PLAN      each config at the learning rate an earlier sweep's --lr_grid chose for it (that
                      sweep's OUT/plan.json): tune once at one cell of a study, then keep the rates
OUT/plan.json records these inputs and every choice; a re-run with other inputs is refused (the
configs' order counts only under --match, whose first config is the reference). A sweep
without --match plans each config alone (its rate from its own grid runs), so a re-run may add
configs, which are tuned then, or name fewer.
--jobs=J trains J runs at a time (each its own process: give each --threads=cores/J); the
throughput probe of --match=time always runs alone.
When the dataset has a test split (prepare.py --test_fraction), every run is evaluated on all
of it as it finishes (tools.eval --split=test, the run's best.pt: selected on val; a sweep
stopped midway keeps it) into RUN/test_eval.json, and the report's paired statistics use it.
At the end OUT/report.md and OUT/report.png (compare.py) group the seeds of each config.

Exit status: 0 all runs finished; 1 some run failed (the others still ran; see its
train.log); 2 bad input (before any training, or a run refused its input).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

from model import GPTConfig
from tools import budget
from trainer.cli import ConfigError, OneLineParser, check_output, fail
from trainer.rundir import (
    TEST_EVAL,
    RunError,
    read_log,
    read_summary,
    run_state,
    settings_differ,
    write_json_atomic,
)
from trainer.runfiles import RunLock
from trainer.settings import MODEL_KEYS, parse_keys, read_meta

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo root, where train.py is
RESERVED = ("seed", "out_dir", "init_from")  # the sweep sets these per run
DEFAULT_SEEDS = [1, 2, 3, 4, 5]
PLAN = "plan.json"


def parse_numbers(flag, text, kind):
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--{flag}={text}: give {kind.__name__}s separated by commas") from None
    if not values:
        raise ConfigError(f"--{flag} is empty; e.g. --{flag}=" + ("1,2,3" if kind is int else "5e-4,1e-3,2e-3"))
    return values


def flag_parser():
    """The sweep's own flags (values kept as text: parse_options checks them); every other --key=value
    is a train.py override, passed through (parse_known_args), and every other word a config file."""
    ap = OneLineParser(prog="python -m tools.sweep", description=__doc__, allow_abbrev=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       usage="python -m tools.sweep CONFIG... --out=DIR [--seeds=1,2,3] [--match=params,flops|time] "
                             "[--lr_grid=a,b,...|--lr_from=PLAN] [--lr_fraction=F] [--probe_iters=N] [--jobs=J] "
                             "[--key=value ...]")
    ap.add_argument("configs", nargs="*", metavar="CONFIG", help="train.py config files; the first is the reference")
    ap.add_argument("--out", help="folder of the run folders, plan.json and the report (required)")
    ap.add_argument("--seeds", help="comma-separated seeds (default 1,2,3,4,5)")
    ap.add_argument("--match", help="params, flops, time, or params with one of the other two (comma-separated)")
    ap.add_argument("--lr_grid", help="comma-separated learning rates to tune each config over")
    ap.add_argument("--lr_from", help="an earlier sweep's plan.json: each config at the rate it chose there")
    ap.add_argument("--lr_fraction", help="share of the budget each grid run gets (default 0.25)")
    ap.add_argument("--probe_iters", help="iterations of the --match=time throughput probe (default 30)")
    ap.add_argument("--jobs", help="runs trained at the same time (default 1)")
    return ap


def parse_flags(argv):
    """(configs, sweep flags as text, train.py overrides) from argv, in the order given."""
    known, rest = flag_parser().parse_known_args(argv)
    flags = {k: v for k, v in vars(known).items() if k != "configs" and v is not None}
    configs, overrides = list(known.configs), []
    for arg in rest:   # a config after an override lands here, still in order
        if not arg.startswith("--"):
            configs.append(arg)
            continue
        key = arg[2:].partition("=")[0]
        if key in RESERVED:
            raise ConfigError(f"{arg}: the sweep sets {key} for each run; use --seeds and --out instead")
        overrides.append(arg)
    return configs, flags, overrides


def parse_options(flags):
    """The sweep's own flags, checked: seeds, out, match, lr_grid, lr_fraction, probe_iters, jobs."""
    seeds = parse_numbers("seeds", flags["seeds"], int) if "seeds" in flags else DEFAULT_SEEDS
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds lists a seed twice ({seeds})")
    if not all(0 <= seed < 2**32 for seed in seeds):   # train.py's range, checked before the first run
        raise ConfigError(f"--seeds={','.join(map(str, seeds))}: every seed must be in [0, 2**32)")
    if not flags.get("out"):
        raise ConfigError("--out is missing; e.g. --out=sweeps/NAME (run folders and the report go there)")
    check_output(flags["out"], "--out", folder=True)  # an existing file, an unwritable place: one line
    try:
        match = budget.parse_match(flags["match"]) if "match" in flags else ()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    lr_grid = parse_numbers("lr_grid", flags["lr_grid"], float) if "lr_grid" in flags else None
    if lr_grid and not all(0 < lr < float("inf") for lr in lr_grid):
        raise ConfigError(f"--lr_grid={flags['lr_grid']}: every rate must be a finite number > 0")
    if lr_grid and flags.get("lr_from"):
        raise ConfigError("--lr_grid and --lr_from both choose the learning rates; give one of them")
    fraction = parse_numbers("lr_fraction", flags.get("lr_fraction", "0.25"), float)[0]
    if not 0 < fraction <= 1:
        raise ConfigError(f"--lr_fraction={fraction} must be in (0, 1]: the share of the budget each grid run gets")
    probe = parse_numbers("probe_iters", flags.get("probe_iters", "30"), int)[0]
    if probe < 5:
        raise ConfigError(f"--probe_iters={probe} must be at least 5 (the throughput probe of --match=time)")
    jobs = parse_numbers("jobs", flags.get("jobs", "1"), int)[0]
    if jobs < 1:
        raise ConfigError(f"--jobs={jobs} must be at least 1 (runs trained at the same time)")
    return {"seeds": seeds, "out": flags["out"], "match": match, "lr_grid": lr_grid, "lr_fraction": fraction,
            "probe_iters": probe, "jobs": jobs, "lr_from": flags.get("lr_from")}


def parse_args(argv):
    """(configs, options, overrides) from argv; ConfigError for anything wrong."""
    configs, flags, overrides = parse_flags(argv)
    if not configs:
        raise ConfigError("no config files given; e.g. python -m tools.sweep config/mha.py config/gqa.py --seeds=1,2,3 "
                          "--out=sweeps/NAME")
    opts = parse_options(flags)
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
        overrides.append(f"--wandb_group={os.path.basename(os.path.normpath(opts['out']))}")
    return configs, opts, overrides


def stem(config):
    return os.path.splitext(os.path.basename(config))[0]


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


def term_with_parent():
    """In a child before exec (Linux): SIGTERM when the sweep dies, even by kill -9, so the run
    saves its checkpoint and exits instead of training on as an orphan that holds its lock."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # 1 = PR_SET_PDEATHSIG


class Runner:
    """Runs train.py (and eval.py) in child processes; forwards SIGHUP/SIGINT/SIGTERM to every
    child so a stopped sweep leaves each run's checkpoint behind for the next invocation, and a
    child gets SIGTERM when the sweep dies (term_with_parent)."""

    def __init__(self):
        self.children, self.signalled = set(), None
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._forward)

    def _forward(self, signum, _frame):
        self.signalled = signum
        if not self.children:
            sys.exit(128 + signum)
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signum)

    def start(self, cmd, log_path):
        """cmd in a child process, its output appended to log_path (unbuffered: the log shows where
        a run is while it runs)."""
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=HERE,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=term_with_parent)
        self.children.add(child)
        return child

    def finished(self, child):
        """The child's exit status once it has ended (None while it runs)."""
        rc = child.poll()
        if rc is not None:
            self.children.discard(child)
        return rc

    def stop_if_signalled(self):
        """After a signal no new run starts: wait for the children (each saves its checkpoint), exit."""
        if self.signalled is None:
            return
        for child in list(self.children):
            child.wait()
        sys.exit(128 + self.signalled)

    def run(self, cmd, log_path):
        child = self.start(cmd, log_path)
        while self.finished(child) is None:
            time.sleep(0.2)
        self.stop_if_signalled()
        return child.returncode


def train_cmd(config, seed, run_dir, overrides, state):
    return [sys.executable, os.path.join(HERE, "train.py"), config, f"--seed={seed}", f"--out_dir={run_dir}",
            *overrides, *(["--init_from=resume"] if state == "resume" else [])]


def check_run_settings(config, seed, run_dir, overrides):
    """A run folder is reused only for the run it was made for (summary.json's settings)."""
    try:
        summary = read_summary(run_dir)
    except RunError:
        return  # none yet (a checkpoint without an evaluation record): train.py's resume checks it
    saved, wanted = summary.get("settings"), parse_keys([config, *overrides, f"--seed={seed}"])
    if not isinstance(saved, dict):
        return  # written before runs recorded their settings
    # dtype=auto is what the run resolved it to (summary's dtype); a resume keeps that dtype
    resolved = summary.get("dtype", saved.get("dtype"))
    saved = {**saved, "dtype": resolved}
    wanted["dtype"] = resolved if wanted["dtype"] == "auto" else wanted["dtype"]
    differ = settings_differ(saved, wanted)
    if differ:
        fail(f"{run_dir} was trained with other settings ({'; '.join(differ[:3])}); re-run the command that made "
             "it, or give this sweep another --out")


def busy_with(run_dir):
    """The live process training run_dir (train.py's lock), as text, or None."""
    owner = RunLock(run_dir).live_owner()
    return f"train.py pid {owner[0]} on {owner[1]} holds its lock" if owner else None


def last_error_line(run_dir):
    with open(os.path.join(run_dir, "train.log")) as f:
        lines = [line.strip() for line in f if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1]


def train_runs(runner, runs, label="", jobs=1, on_finish=None):
    """Train [(config, seed, run_dir, overrides)], up to `jobs` at a time, in order: skip the
    finished, resume the rest; on_finish(run) follows each run that finishes, before the next starts
    (so a sweep cut short keeps it). Returns the names of the runs that failed; exits 2 when a run
    refuses its input."""
    max_iters = {run_dir: parse_keys([c, *ov])["max_iters"] for c, _, run_dir, ov in runs}
    remaining = {run_dir: max(0, max_iters[run_dir] - iters_done(run_dir)) if run_state(run_dir) != "finished" else 0
                 for _, _, run_dir, _ in runs}
    failed, active, clock = [], {}, {"s": 0.0, "iters": 0}
    for i, (config, seed, run_dir, overrides) in enumerate(runs, 1):
        state, name = run_state(run_dir), label + os.path.basename(run_dir)
        if state != "scratch":
            check_run_settings(config, seed, run_dir, overrides)
        if state == "finished":
            print(f"[{i}/{len(runs)}] {name}: finished, skipped", flush=True)
            continue
        busy = busy_with(run_dir)
        if busy:  # e.g. a second sweep over the same folder: leave it to that one
            print(f"[{i}/{len(runs)}] {name}: busy ({busy}), skipped; re-run this sweep once it is done", flush=True)
            failed.append(name)
            continue
        while len(active) >= jobs:
            reap(runner, active, remaining, failed, clock, on_finish)
        runner.stop_if_signalled()
        s_per_iter = clock["s"] / clock["iters"] if clock["iters"] else None
        run_eta = s_per_iter and s_per_iter * remaining[run_dir]
        sweep_eta = s_per_iter and s_per_iter * sum(remaining.values()) / jobs
        print(f"[{i}/{len(runs)}] {name}: {'resuming' if state == 'resume' else 'training'} "
              f"({remaining[run_dir]} iters left) | run ETA {fmt_duration(run_eta)} | "
              f"sweep ETA {fmt_duration(sweep_eta)}", flush=True)
        child = runner.start(train_cmd(config, seed, run_dir, overrides, state), os.path.join(run_dir, "train.log"))
        active[child] = (name, time.time(), (config, seed, run_dir, overrides))
    while active:
        reap(runner, active, remaining, failed, clock, on_finish)
    runner.stop_if_signalled()
    return failed


def reap(runner, active, remaining, failed, clock, on_finish=None):
    """Wait until one of the active runs ends, and account for it."""
    while True:
        for child, (name, t0, run) in list(active.items()):
            rc, run_dir = runner.finished(child), run[2]
            if rc is None:
                continue
            del active[child]
            if rc == 2:
                fail(f"{name}: train.py refused its input: {last_error_line(run_dir)}")
            if rc != 0 or run_state(run_dir) != "finished":
                failed.append(name)
                print(f"    {name} failed (exit {rc}): {last_error_line(run_dir)}; see {run_dir}/train.log", flush=True)
            else:
                clock["s"] += time.time() - t0
                clock["iters"] += remaining[run_dir]
                if on_finish:
                    on_finish(run)
            remaining[run_dir] = 0
            return
        time.sleep(0.2)


# ---- the plan: matched budgets and learning rates, recorded in OUT/plan.json ----
def plan_inputs(configs, opts, overrides):
    """What decides the plan (seeds are not in it: adding seeds to a sweep is fine)."""
    inputs = {"configs": configs, "overrides": overrides, "match": list(opts["match"]), "lr_grid": opts["lr_grid"],
              "lr_fraction": opts["lr_fraction"] if opts["lr_grid"] else None,
              "probe_iters": opts["probe_iters"] if "time" in opts["match"] else None}
    if "flops" in opts["match"]:  # a plan matched under another FLOPs count (older plans: none said) is refused
        inputs["flops_count"] = budget.FLOPS_COUNT
    return {**inputs, "lr_from": opts["lr_from"]} if opts["lr_from"] else inputs  # older plans have no such key


def same_inputs(old, new) -> bool:
    """Whether a plan made with `old` inputs serves `new`. The configs' order matters only to a matched
    budget (the first config is the reference); otherwise a sweep resumes with its configs in any order.
    A sweep with no budget matched plans each config alone, so it may also grow or name a subset of
    its configs, as it may add seeds."""
    if grows_freely(new) and isinstance(old.get("configs"), list):
        return {**old, "configs": None} == {**new, "configs": None}
    if not new["match"] and isinstance(old.get("configs"), list):
        old = {**old, "configs": sorted(old["configs"])}
        new = {**new, "configs": sorted(new["configs"])}
    return old == new


def grows_freely(inputs) -> bool:
    """No stage of the plan looks at more than one config (a matched budget has a reference; a tuned rate
    is chosen per config from its own grid runs, a borrowed one looked up per config): configs may come and go."""
    return not inputs["match"]


def merged_inputs(old, new):
    """The inputs of a plan made with `old` that serves `new` (it names every config either planned, where
    each config is planned alone), or None where it cannot serve them (see differing_inputs)."""
    if not same_inputs(old, new):
        return None
    return {**old, "configs": sorted(set(old["configs"]) | set(new["configs"]))} if grows_freely(new) else old


def differing_inputs(old, new) -> list:
    """The inputs that differ between two plans, for a refusal's message."""
    return [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def load_plan(out, inputs):
    """OUT/plan.json of an earlier invocation with the same inputs, a fresh plan, or a refusal."""
    path = os.path.join(out, PLAN)
    if not os.path.isfile(path):
        return {"inputs": inputs, "configs": {}}
    with open(path) as f:
        plan = json.load(f)
    merged = merged_inputs(plan.get("inputs", {}), inputs)
    if merged is None:
        diff = differing_inputs(plan.get("inputs", {}), inputs)
        fail(f"{out} holds a sweep made with other settings ({', '.join(diff)} differ: {path}); re-run it with "
             "the same command, or give this one another --out")
    return {**plan, "inputs": merged}


def save_plan(out, plan):
    os.makedirs(out, exist_ok=True)
    write_json_atomic(plan, os.path.join(out, PLAN))


def vocab_size_of(keys):
    try:
        return read_meta(os.path.join(keys["data_dir"], keys["dataset"]))["vocab_size"]
    except ConfigError as e:
        fail(f"--match needs the dataset's vocabulary: {e}")


def match_budgets(configs, overrides, plan, match):
    """Per config: the overrides that match the reference (the first config) by params and/or flops."""
    keys = {c: parse_keys([c, *overrides]) for c in configs}
    ref = configs[0]
    vocab = vocab_size_of(keys[ref])
    ref_params = budget.meta_model(keys[ref], vocab).num_params()
    for config in configs:
        entry, k = plan["configs"].setdefault(stem(config), {"overrides": []}), keys[config]
        hidden = None
        if "params" in match and config != ref:
            try:
                hidden, _ = budget.solve_mlp_hidden(k, ref_params, vocab)
            except ValueError as e:
                fail(f"--match=params: {config}: {e}")
            entry["overrides"].append(f"--mlp_hidden={hidden}")
        model = budget.meta_model(k, vocab, **({"mlp_hidden": hidden} if hidden else {}))
        entry.update(params=model.num_params(), flops_per_token=model.flops_per_token(),
                     tokens_per_iter=budget.tokens_per_iter(k))
        if "flops" in match:
            extra, entry["max_iters"] = budget.iters_for(k, budget.flops_ratio(k, keys[ref], vocab, hidden))
            entry["overrides"] += extra


def probe_throughput(runner, configs, overrides, plan, opts):
    """--match=time: a short run of each config (OUT/probe/), then max_iters for the reference's wall time."""
    out, n = opts["out"], opts["probe_iters"]
    tps = {}
    for config in configs:
        entry = plan["configs"][stem(config)]
        run_dir = os.path.join(out, "probe", stem(config))
        probe = [*overrides, *entry["overrides"], f"--max_iters={n}", f"--eval_interval={n}", "--eval_iters=1",
                 f"--log_interval={n}"]
        if run_state(run_dir) != "finished":
            print(f"probe {stem(config)}: {n} iterations for its throughput", flush=True)
            cmd = train_cmd(config, opts["seeds"][0], run_dir, probe, run_state(run_dir))
            if runner.run(cmd, os.path.join(run_dir, "train.log")) or run_state(run_dir) != "finished":
                fail(f"--match=time: the probe of {config} failed: {last_error_line(run_dir)}")
        tps[config] = entry["probe_tokens_per_sec"] = read_summary(run_dir)["tokens_per_sec"]
    ref = configs[0]
    ref_keys = parse_keys([ref, *overrides])
    for config in configs:
        keys = parse_keys([config, *overrides])
        ratio = budget.time_ratio(tps[config], tps[ref], keys, ref_keys)
        extra, plan["configs"][stem(config)]["max_iters"] = budget.iters_for(keys, ratio)
        plan["configs"][stem(config)]["overrides"] += extra


def lr_rank(summary) -> tuple:
    """What the grid minimises. Text: the best validation loss. Datasets of examples (MQAR): a run that
    reached stop_val_acc first, by its steps to reach it; then the best val accuracy; loss breaks ties
    (a run stopped at the target keeps a higher loss than one that trained on past it)."""
    if summary.get("best_val_acc") is None:
        return (summary["best_val_loss"],)
    if summary.get("target_reached_iter") is not None:
        return (0, summary["target_reached_iter"], summary["best_val_loss"])
    return (1, -summary["best_val_acc"], summary["best_val_loss"])


def tune_learning_rates(runner, configs, overrides, plan, opts):
    """--lr_grid: every config at every rate, first seed, lr_fraction of its budget (OUT/lr/); the
    best rate (lr_rank: lowest val loss; on examples, reached the target soonest or best val accuracy)
    joins the config's overrides."""
    seed, grid = opts["seeds"][0], opts["lr_grid"]
    runs = []
    for config in configs:
        entry = plan["configs"][stem(config)]
        keys = parse_keys([config, *overrides, *entry["overrides"]])
        cut = budget.fraction_overrides(keys, opts["lr_fraction"])
        for lr in grid:
            run_dir = os.path.join(opts["out"], "lr", f"{stem(config)}-lr{lr:g}-s{seed}")
            lr_keys = budget.lr_overrides(keys, lr)
            runs.append((config, seed, run_dir, [*overrides, *entry["overrides"], *lr_keys, *cut]))
    failed = train_runs(runner, runs, label="lr grid ", jobs=opts["jobs"])
    if failed:
        fail(f"the learning-rate grid could not finish ({', '.join(failed)}); fix and re-run the same command")
    for config in configs:
        entry = plan["configs"][stem(config)]
        summaries = {lr: read_summary(os.path.join(opts["out"], "lr", f"{stem(config)}-lr{lr:g}-s{seed}"))
                     for lr in grid}
        results = {f"{lr:g}": s["best_val_loss"] for lr, s in summaries.items()}
        best = min(grid, key=lambda lr: lr_rank(summaries[lr]))
        keys = parse_keys([config, *overrides, *entry["overrides"]])
        entry.update(lr_grid=results, learning_rate=best)
        entry["overrides"] += budget.lr_overrides(keys, best)
        edge = " (at the grid's edge: widen the grid)" if best in (min(grid), max(grid)) and len(grid) > 1 else ""
        print(f"{stem(config)}: learning_rate {best:g} chosen on val{edge}", flush=True)


def rates_from_plan(configs, overrides, plan, path):
    """--lr_from: each config's learning_rate from an earlier sweep's plan.json (its --lr_grid choice)."""
    try:
        with open(path) as f:
            chosen = {name: entry.get("learning_rate") for name, entry in json.load(f)["configs"].items()}
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise ConfigError(f"--lr_from={path}: not a sweep's plan.json ({type(e).__name__}: {e})") from None
    for config in configs:
        lr = chosen.get(stem(config))
        if not isinstance(lr, (int, float)) or not 0 < lr < float("inf"):
            raise ConfigError(f"--lr_from={path} holds no learning rate chosen for {stem(config)}; tune it there "
                              "with --lr_grid first, or drop --lr_from")
        entry = plan["configs"][stem(config)]
        entry.update(learning_rate=lr, lr_from=path)
        entry["overrides"] += budget.lr_overrides(parse_keys([config, *overrides, *entry["overrides"]]), lr)
        print(f"{stem(config)}: learning_rate {lr:g} from {path}", flush=True)


def make_plan(runner, configs, opts, overrides):
    """OUT/plan.json: every stage done once and saved, so a killed sweep picks up where it was."""
    out = opts["out"]
    plan = load_plan(out, plan_inputs(configs, opts, overrides))
    for config in configs:
        plan["configs"].setdefault(stem(config), {"overrides": []})
    if opts["match"] and not plan.get("matched"):
        match_budgets(configs, overrides, plan, [m for m in opts["match"] if m != "time"])
        if "time" in opts["match"]:
            probe_throughput(runner, configs, overrides, plan, opts)
        plan["matched"] = True
    untuned = [c for c in configs if "learning_rate" not in plan["configs"][stem(c)]]   # per config: a sweep may grow
    if opts["lr_grid"] and untuned:
        tune_learning_rates(runner, untuned, overrides, plan, opts)
    borrow = [c for c in configs if "lr_from" not in plan["configs"][stem(c)]]   # per config: a sweep may grow
    if opts["lr_from"] and borrow:
        rates_from_plan(borrow, overrides, plan, opts["lr_from"])
    save_plan(out, plan)
    return plan


def has_test_split(config, overrides):
    keys = parse_keys([config, *overrides])
    return os.path.isfile(os.path.join(keys["data_dir"], keys["dataset"], "test.bin"))


def evaluate_on_test(runner, runs):
    """RUN/test_eval.json for each finished run: its best.pt over every window of the test split at
    its block_size (the same windows for every run). Kept until the run's best.pt changes."""
    for config, _, run_dir, run_overrides in runs:
        path = os.path.join(run_dir, TEST_EVAL)   # what Run.test_eval reads
        ckpt = os.path.join(run_dir, "best.pt")
        if os.path.isfile(path) and (not os.path.isfile(ckpt) or os.path.getmtime(path) >= os.path.getmtime(ckpt)):
            continue   # evaluated since best.pt changed, or restored from docs/results (no checkpoint to evaluate)
        block_size = parse_keys([config, *run_overrides])["block_size"]
        cmd = [sys.executable, "-m", "tools.eval", run_dir, "--split=test", f"--lengths={block_size}",
               f"--json={path}", f"--plot={os.path.join(run_dir, 'test_eval.png')}"]
        if runner.run(cmd, os.path.join(run_dir, "test_eval.log")):
            fail(f"{run_dir}: the test evaluation failed; see {run_dir}/test_eval.log")


def main(argv=None):
    try:
        configs, opts, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        fail(str(e))
    runner = Runner()
    try:
        plan = make_plan(runner, configs, opts, overrides)
    except ConfigError as e:  # e.g. --lr_from naming a plan without this config's rate
        fail(str(e))
    out = opts["out"]
    # seed-major order: a sweep cut short still has every config at the first seeds
    runs = [(c, s, os.path.join(out, f"{stem(c)}-s{s}"), [*overrides, *plan["configs"][stem(c)]["overrides"]])
            for s in opts["seeds"] for c in configs]
    on_test = has_test_split(configs[0], overrides)
    # each run is evaluated as it finishes; the pass after catches runs finished by an earlier sweep
    failed = train_runs(runner, runs, jobs=opts["jobs"],
                        on_finish=(lambda run: evaluate_on_test(runner, [run])) if on_test else None)
    done = [run for run in runs if run_state(run[2]) == "finished"]
    if done and on_test:
        evaluate_on_test(runner, done)
    report_runs([run_dir for _, _, run_dir, _ in done], out)
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}; fix and re-run the same command to resume them",
              file=sys.stderr)
        sys.exit(1)


def report_runs(done, out):
    if not done:
        return
    # the report is compare's, through its command line (no tool imports another entry script)
    r = subprocess.run([sys.executable, "-m", "tools.compare", *done, "--out", out,
                        "--plan", os.path.join(out, PLAN)], cwd=HERE)
    if r.returncode:
        sys.exit(r.returncode)


if __name__ == "__main__":
    main()
