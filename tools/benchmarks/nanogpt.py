"""Side by side with nanoGPT on its own CPU recipe: ms per iteration and the val loss reached.

    python -m tools.bench --suite=nanogpt --nanogpt_dir=PATH/nanoGPT --data_dir=data   # data/shakespeare_char
    python -m tools.bench --suite=nanogpt --nanogpt_dir=... --ours=--dtype=float32,--dtype=bfloat16,--compile=True

nanoGPT's README trains shakespeare_char on a CPU with

    python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
        --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
        --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

(fp32: its autocast is off on CPU). Ours runs config/base_shakespeare_char.py, the same model,
batch, schedule and evaluation, once per --ours setting (comma-separated; each may hold several
flags joined by '+', e.g. --dtype=bfloat16+--compile=True). Both read the same prepared
train.bin/val.bin (nanoGPT gets a meta.pkl written from our meta.json in a scratch folder that
links its files), with the same thread count. The runs alternate, nanoGPT then each of ours, for
--repeats rounds, so a drift of the machine touches all alike. Per run: the median ms/iter of
its per-iteration log lines (nanoGPT's "time" includes its evaluations at those iterations, ours
leaves them out; the median is the same for both), and the final val loss. nanoGPT's seed is fixed
(1337 in its train.py); with --seed_per_round ours trains round r with seed 1337 + r, so the spread
of its val losses over rounds is the seed noise its equality with nanoGPT's is judged against.
"""
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from tools.benchmarks.harness import emit, parser
from trainer.cli import fail

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = ["--device=cpu", "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12",
          "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0"]
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config")


def nanogpt_workdir(nanogpt_dir, data):
    """A scratch folder nanoGPT runs in: links to its code, data/shakespeare_char with our bins and a meta.pkl."""
    work = tempfile.mkdtemp(prefix="bench_nanogpt_")
    for name in NANOGPT_FILES:
        os.symlink(os.path.join(os.path.abspath(nanogpt_dir), name), os.path.join(work, name))
    dest = os.path.join(work, "data", "shakespeare_char")
    os.makedirs(dest)
    for split in ("train.bin", "val.bin"):
        os.symlink(os.path.abspath(os.path.join(data, split)), os.path.join(dest, split))
    with open(os.path.join(data, "meta.json")) as f:
        chars = json.load(f)["chars"]
    with open(os.path.join(dest, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": {c: i for i, c in enumerate(chars)}}, f)
    return work


def run(cmd, cwd, threads, pattern, val_pattern):
    """(median ms/iter, final val loss) of one training run, parsed from its console."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    times = [float(t) for t in re.findall(pattern, r.stdout)][1:]  # the first iteration warms up
    vals = re.findall(val_pattern, r.stdout)
    return statistics.median(times), float(vals[-1])


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--nanogpt_dir", required=True, help="a checkout of github.com/karpathy/nanoGPT")
    ap.add_argument("--data_dir", default="data", help="holds shakespeare_char/ (data/shakespeare_char/prepare.py)")
    ap.add_argument("--ours", default="--dtype=float32", help="our settings to time, comma-separated")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed_per_round", action="store_true", help="ours: seed 1337 + round (default: 1337 every round)")
    args = ap.parse_args(argv)
    data = os.path.join(args.data_dir, "shakespeare_char")
    if not all(os.path.exists(os.path.join(args.nanogpt_dir, n)) for n in NANOGPT_FILES):
        fail(f"--nanogpt_dir={args.nanogpt_dir} is not a nanoGPT checkout (train.py, model.py, configurator.py, "
             "config/); git clone https://github.com/karpathy/nanoGPT")
    if not os.path.isfile(os.path.join(data, "meta.json")):
        fail(f"{data} is not prepared; run python data/shakespeare_char/prepare.py --out_dir {data}")
    if args.quick:
        args.iters, args.repeats = 30, 1
    if min(args.iters, args.repeats, args.threads) < 1:
        fail("--iters, --repeats and --threads must be at least 1")
    work = nanogpt_workdir(args.nanogpt_dir, data)
    try:
        rows = time_all(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {"iters": args.iters, "threads": args.threads, "repeats": args.repeats,
               "seed_per_round": args.seed_per_round, "rows": rows}
    emit(f"nanoGPT's shakespeare_char CPU recipe, {args.iters} iterations, {args.threads} thread(s), "
         f"{args.repeats} alternating rounds\n\n" + markdown(results), results, args)


def time_all(args, work):
    """{setting: [(ms/iter, val loss) per round]}, nanoGPT first, the settings alternating."""
    sched = [f"--max_iters={args.iters}", f"--lr_decay_iters={args.iters}", f"--eval_interval={min(250, args.iters)}"]
    settings = {"nanoGPT": None, **{f"ours {s.replace('+', ' ')}": s.split("+") for s in args.ours.split(",")}}
    results = {name: [] for name in settings}
    for r in range(args.repeats):
        seed = [f"--seed={1337 + r}"] if args.seed_per_round else []
        for name, flags in settings.items():
            out = tempfile.mkdtemp(prefix="bench_nanogpt_out_")
            if flags is None:
                cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--compile=False",
                       f"--out_dir={out}", *RECIPE, *sched]
                results[name].append(run(cmd, work, args.threads, r"time ([\d.]+)ms", r"val loss ([\d.]+)"))
            else:
                cmd = [sys.executable, "train.py", "config/base_shakespeare_char.py", f"--out_dir={out}",
                       f"--data_dir={args.data_dir}", f"--threads={args.threads}", *RECIPE, *sched, *seed, *flags]
                results[name].append(run(cmd, ROOT, args.threads, r"([\d.]+) ms/iter", r"val ([\d.]+)"))
            shutil.rmtree(out, ignore_errors=True)
    return [{"setting": name, "ms_per_iter": [m for m, _ in r], "val_loss": [v for _, v in r]}
            for name, r in results.items()]


def markdown(results):
    """The table of the results main() writes as JSON (docs/ regenerates it from the stored file)."""
    rows = results["rows"]
    ref = statistics.median(rows[0]["ms_per_iter"])
    spread = results.get("seed_per_round") and len(rows[0]["val_loss"]) > 1
    lines = ["| setting | ms/iter (median of rounds) | / nanoGPT | final val loss (mean of rounds"
             + (" ± sd; ours: seed 1337 + round) |" if spread else ") |"), "| --- | ---: | ---: | ---: |"]
    for r in rows:
        ms, val = statistics.median(r["ms_per_iter"]), statistics.mean(r["val_loss"])
        sd = f" ± {statistics.stdev(r['val_loss']):.4f}" if spread else ""
        lines.append(f"| {r['setting']} | {ms:.1f} | {ms / ref:.2f} | {val:.4f}{sd} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
