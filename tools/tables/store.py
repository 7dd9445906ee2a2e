"""Land a study's small result files in docs/results/<STUDY>/, for tools.tables to build its tables from.

    python -m tools.tables.store sweeps/cache256 cache256
    python -m tools.tables.store sweeps/sparse512 sparse512-window sweeps/sparse512/eval_window.json --runs=mha

Copies each finished run's summary.json, log.jsonl, test_eval.json and reach.json (never checkpoints; the runs
and the learning-rate probes under lr/ alike), the sweep's plan.json and any further files named
(evaluation JSON); each file is written to a temporary name and renamed. --runs keeps the runs of these
configs only. A study stored before keeps its runs: the sweep's plan.json is merged into the stored one as
a resuming sweep merges its own (more configs or seeds of the same settings: seeds 2-3 of a cell land
beside its seed 1), and a plan made with other settings is refused (store it under another name).

    python -m tools.tables.store sweeps/recall/w64-t64-p4 recall/w64-t64-p4 --restore

--restore goes the other way, for a study that runs over several sessions on machines that keep only
what was committed: the stored files of every run SWEEP lacks (and its plan.json, where SWEEP has none)
are copied back into it, so that the same tools.sweep command skips the finished runs (their summary.json
says finished) and trains the rest.
"""
import glob
import json
import os
import sys

from tools.compare import config_name
from tools.sweep import PLAN, differing_inputs, merged_inputs
from tools.tables.source import HERE, results_dir
from trainer.checkpoint import WriteError
from trainer.cli import OneLineParser, fail
from trainer.rundir import LOG, REACH, SUMMARY, TEST_EVAL, Run, write_json_atomic, write_text_atomic

DECIDED = ("learning_rate", "max_iters")   # what a sweep's plan decides per config


class PlanClash(Exception):
    """The sweep's plan.json and the stored one were made with other settings: their runs do not belong together."""


def copy(src, dst):
    """src's text to dst through trainer.rundir's atomic writer (a temporary file, then a rename)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src, encoding="utf-8") as f:
        write_text_atomic(f.read(), dst)


def run_folders(folder):
    """The finished runs under folder (summary.json says so; a run still training writes one too),
    relative to it: <config>-s<seed> and the learning-rate probes lr/<config>-lr<rate>-s<seed>."""
    found = glob.glob(os.path.join(folder, "*-s*")) + glob.glob(os.path.join(folder, "lr", "*-s*"))
    return sorted(os.path.relpath(d, folder) for d in found
                  if os.path.isfile(os.path.join(d, SUMMARY)) and Run(d).summary.get("finished"))


def copy_runs(src, dst, runs):
    """[paths written]: each run's small files from src/<run> to dst/<run>."""
    written = []
    for run in runs:
        for name in (SUMMARY, LOG, TEST_EVAL, REACH):
            if os.path.isfile(os.path.join(src, run, name)):
                written.append(os.path.join(dst, run, name))
                copy(os.path.join(src, run, name), written[-1])
    return written


def merged_plan(stored_path, sweep_path):
    """The sweep's plan merged into the stored one, as tools.sweep merges a resumed sweep's: the same inputs
    (configs aside where each config is planned alone), the configs of both, each config's entry agreeing."""
    with open(sweep_path, encoding="utf-8") as f:
        new = json.load(f)
    if not os.path.isfile(stored_path):
        return new
    with open(stored_path, encoding="utf-8") as f:
        old = json.load(f)
    old_in, new_in = old.get("inputs", {}), new.get("inputs", {})
    sweep_made = {"match", "lr_grid"} <= set(new_in)             # tools.sweep's keys (a hand-made plan: equality)
    inputs = merged_inputs(old_in, new_in) if sweep_made else (new_in if old_in == new_in else None)
    if inputs is None:
        raise PlanClash(f"{stored_path} was planned with other settings ({', '.join(differing_inputs(old_in, new_in))} "
                        f"differ from {sweep_path}); store this sweep under another study name")
    old_cfg, new_cfg = old.get("configs", {}), new.get("configs", {})
    # a resumed sweep's entry grows (probes, overrides); only a rate or budget decided otherwise clashes
    clash = [c for c in old_cfg.keys() & new_cfg.keys()
             if any(k in old_cfg[c] and k in new_cfg[c] and old_cfg[c][k] != new_cfg[c][k] for k in DECIDED)]
    if clash:
        raise PlanClash(f"{stored_path} planned {clash[0]} otherwise than {sweep_path} (its learning rate or "
                        "budget); store this sweep under another study name")
    return {**old, **new, "inputs": inputs, "configs": {**old_cfg, **new_cfg}}


def store(sweep, study, extra=(), configs=None, root=HERE):
    """[paths written]: the small files of sweep's runs (of configs, or all), its plan merged into the stored
    one, and extra under docs/results/study."""
    out = results_dir(root, study)
    sweep_plan = os.path.join(sweep, PLAN)
    plan = merged_plan(os.path.join(out, PLAN), sweep_plan) if os.path.isfile(sweep_plan) else None   # refused first
    runs = [r for r in run_folders(sweep) if not configs or config_name(os.path.basename(r)) in configs]
    written = copy_runs(sweep, out, runs)
    if plan:
        os.makedirs(out, exist_ok=True)
        written.append(os.path.join(out, PLAN))
        write_json_atomic(plan, written[-1])
    for path in extra:
        if os.path.isfile(path):
            written.append(os.path.join(out, os.path.basename(path)))
            copy(path, written[-1])
    return written


def restore(study, sweep, root=HERE):
    """[paths written]: the stored files of each run of docs/results/study that sweep has no summary.json of."""
    stored = results_dir(root, study)
    written = copy_runs(stored, sweep, [r for r in run_folders(stored)
                                        if not os.path.isfile(os.path.join(sweep, r, SUMMARY))])
    if os.path.isfile(os.path.join(stored, PLAN)) and not os.path.isfile(os.path.join(sweep, PLAN)):
        written.append(os.path.join(sweep, PLAN))   # the resumed sweep then plans on from it
        copy(os.path.join(stored, PLAN), written[-1])
    return written


def main(argv=None):
    ap = OneLineParser(prog="python -m tools.tables.store", description=__doc__.splitlines()[0])
    ap.add_argument("sweep", help="the sweep's --out folder")
    ap.add_argument("study", help="the name under docs/results/")
    ap.add_argument("extra", nargs="*", help="further files to store (evaluation JSON)")
    ap.add_argument("--runs", help="comma-separated configs whose runs to store (default: every run)")
    ap.add_argument("--restore", action="store_true", help="copy the stored runs back into SWEEP (where it lacks them)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.restore:
        return main_restore(args)
    missing = [p for p in [args.sweep, *args.extra] if not os.path.exists(p)]
    if missing:
        fail(f"{missing[0]} does not exist; give the sweep's --out folder and files that are there")
    configs = args.runs and set(args.runs.split(","))
    if configs:  # a name that matches no finished run would store nothing of it, silently
        finished = {config_name(os.path.basename(r)) for r in run_folders(args.sweep)}
        unknown = sorted(configs - finished)
        if unknown:
            fail(f"--runs={unknown[0]}: {args.sweep} holds no finished run of that config (runs are named "
                 f"<config>-s<seed>; --runs takes the config: {', '.join(sorted(finished)) or 'none finished'})")
    try:
        written = store(args.sweep, args.study, args.extra, configs, root=HERE)
    except (WriteError, PlanClash) as e:
        fail(str(e))
    if not written:
        fail(f"{args.sweep} holds no run folder with a summary.json; point it at a sweep's --out")
    print(f"stored {len(written)} files in {results_dir(HERE, args.study)}", file=sys.stderr)


def main_restore(args):
    stored = results_dir(HERE, args.study)
    if args.extra or args.runs:
        fail("--restore copies every stored run back: give only SWEEP and STUDY")
    if not run_folders(stored):
        fail(f"{stored} holds no stored run; give the name the study was stored under")
    try:
        written = restore(args.study, args.sweep)
    except WriteError as e:
        fail(str(e))
    print(f"restored {len(written)} files into {args.sweep}", file=sys.stderr)


if __name__ == "__main__":
    main()
