"""Benchmark CPU thread settings for training: quiet, and with one competing busy process.

    python -m tools.bench --suite=threads --data_dir DIR            # DIR/shakespeare_char prepared
    python -m tools.bench --suite=threads --data_dir DIR --repeats 3 --json threads.json

Each candidate runs the real command `python train.py config/gqa.py --device=cpu ...` for
--iters iterations; the time per iteration is the median of its console lines' ms/iter after
the first (warm-up) interval, and the median over --repeats runs. The candidates, side by side
in one run on the same machine:
    torch default    one thread per visible core, OpenMP's default (spinning) wait policy
    passive          the same with OMP_WAIT_POLICY=PASSIVE (threads sleep at barriers)
    one thread       --threads=1
    auto             --threads=0, train.py's default: the visible cores less the other running
                     processes at start (trainer/threads.py)
"Busy" starts one single-threaded busy loop (a `while True` Python process) before each run.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from tools.benchmarks.harness import emit, parser
from trainer.threads import visible_cores

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root


def candidates():
    cores = visible_cores()
    return {"torch default": ({}, cores), "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, cores),
            "one thread": ({}, 1), "auto": ({}, 0)}


def ms_per_iter(data_dir, iters, env_extra, threads):
    """Median ms/iter of one train.py run (console lines after the first interval), and its thread line."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env.update(env_extra)
    out_dir = tempfile.mkdtemp(prefix="bench_threads_")
    cmd = [sys.executable, "train.py", "config/gqa.py", f"--data_dir={data_dir}", f"--out_dir={out_dir}",
           "--device=cpu", f"--max_iters={iters}", f"--eval_interval={iters}", "--eval_iters=2",
           "--log_interval=10", f"--threads={threads}"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    if r.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    times = [float(m) for m in re.findall(r"([\d.]+) ms/iter", r.stdout)][1:]
    chosen = re.search(r"cpu threads: (\d+)", r.stdout)
    return statistics.median(times), int(chosen.group(1)) if chosen else threads


def measure(data_dir, iters, repeats, busy):
    """{candidate: (median ms/iter over repeats, threads used)} with or without a competing process."""
    results = {}
    for name, (env_extra, threads) in candidates().items():
        runs = []
        for _ in range(repeats):
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            if hog:
                time.sleep(0.5)  # let it take its core before train.py counts the running processes
            try:
                runs.append(ms_per_iter(data_dir, iters, env_extra, threads))
            finally:
                if hog:
                    hog.kill()
                    hog.wait()
        results[name] = (statistics.median(ms for ms, _ in runs), runs[-1][1])
    return results


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--data_dir", default="data",
                    help="holds shakespeare_char/ (python data/shakespeare_char/prepare.py)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(args.data_dir, "shakespeare_char", "meta.json")):
        print(f"error: {args.data_dir}/shakespeare_char is not prepared; run python data/shakespeare_char/prepare.py "
              f"--out_dir {args.data_dir}/shakespeare_char", file=sys.stderr)
        sys.exit(2)
    if args.iters < 30 or args.repeats < 1:
        print("error: --iters must be at least 30 (3 log intervals) and --repeats at least 1", file=sys.stderr)
        sys.exit(2)
    if args.quick:
        args.iters, args.repeats = 30, 1
    quiet = measure(args.data_dir, args.iters, args.repeats, busy=False)
    busy = measure(args.data_dir, args.iters, args.repeats, busy=True)
    best_busy = min(ms for ms, _ in busy.values())
    lines = [f"config/gqa.py on {visible_cores()} visible cores, {args.iters} iterations, median of {args.repeats}",
             "", "| setting | quiet ms/iter | threads | busy ms/iter | threads | busy / quiet | busy / best busy |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    results = []
    for name in quiet:
        (q, qt), (b, bt) = quiet[name], busy[name]
        lines.append(f"| {name} | {q:.1f} | {qt} | {b:.1f} | {bt} | {b / q:.2f} | {b / best_busy:.2f} |")
        results.append({"setting": name, "quiet_ms_per_iter": q, "quiet_threads": qt, "busy_ms_per_iter": b,
                        "busy_threads": bt})
    emit("\n".join(lines), results, args)


if __name__ == "__main__":
    main()
