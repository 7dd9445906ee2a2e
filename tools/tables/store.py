"""Land a study's small result files in docs/results/<STUDY>/, for tools.tables to build its tables from.

    python -m tools.tables.store sweeps/cache256 cache256
    python -m tools.tables.store sweeps/sparse512 sparse512-window sweeps/sparse512/eval_window.json --runs=mha

Copies each run folder's summary.json, log.jsonl and test_eval.json (never checkpoints), the sweep's
plan.json and any further files named (evaluation JSON); each file is written to a temporary name and
renamed. --runs keeps the runs of these configs only.
"""
import glob
import os
import sys

from tools.compare import config_name
from tools.tables.source import HERE, results_dir
from trainer.checkpoint import WriteError
from trainer.cli import OneLineParser, fail
from trainer.rundir import LOG, SUMMARY, TEST_EVAL, write_text_atomic


def copy(src, dst):
    """src's text to dst through trainer.rundir's atomic writer (a temporary file, then a rename)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src, encoding="utf-8") as f:
        write_text_atomic(f.read(), dst)


def store(sweep, study, extra=(), configs=None, root=HERE):
    """[paths written]: the small files of sweep's runs (of configs, or all) and extra under docs/results/study."""
    out, written = results_dir(root, study), []
    runs = [d for d in sorted(glob.glob(os.path.join(sweep, "*-s*"))) if os.path.isfile(os.path.join(d, SUMMARY))]
    for run in runs:
        if configs and config_name(os.path.basename(run)) not in configs:
            continue
        for name in (SUMMARY, LOG, TEST_EVAL):
            if os.path.isfile(os.path.join(run, name)):
                written.append(os.path.join(out, os.path.basename(run), name))
                copy(os.path.join(run, name), written[-1])
    for path in [os.path.join(sweep, "plan.json"), *extra]:
        if os.path.isfile(path):
            written.append(os.path.join(out, os.path.basename(path)))
            copy(path, written[-1])
    return written


def main(argv=None):
    ap = OneLineParser(prog="python -m tools.tables.store", description=__doc__.splitlines()[0])
    ap.add_argument("sweep", help="the sweep's --out folder")
    ap.add_argument("study", help="the name under docs/results/")
    ap.add_argument("extra", nargs="*", help="further files to store (evaluation JSON)")
    ap.add_argument("--runs", help="comma-separated configs whose runs to store (default: every run)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    missing = [p for p in [args.sweep, *args.extra] if not os.path.exists(p)]
    if missing:
        fail(f"{missing[0]} does not exist; give the sweep's --out folder and files that are there")
    try:
        written = store(args.sweep, args.study, args.extra, args.runs and set(args.runs.split(",")))
    except WriteError as e:
        fail(str(e))
    if not written:
        fail(f"{args.sweep} holds no run folder with a summary.json; point it at a sweep's --out")
    print(f"stored {len(written)} files in {results_dir(HERE, args.study)}", file=sys.stderr)


if __name__ == "__main__":
    main()
