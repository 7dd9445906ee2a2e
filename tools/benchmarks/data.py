"""Benchmark the tokenizing pipeline: tokens/s and peak memory of the data/*/prepare.py scripts.

    python -m tools.bench --suite=data --input data/shakespeare/input.txt            # 64 MB corpus, num_proc 1 and 2
    python -m tools.bench --suite=data --input FILE --corpus_mb 256 --num_proc 2 4 8 --format parquet

Builds a corpus of --corpus_mb megabytes from a text file (its paragraphs, repeated, as one
document each) under --work_dir as JSON lines (or parquet), then runs the real command lines
    python data/openwebtext/prepare.py --input CORPUS --num_proc N   (the Hugging Face datasets path)
    python data/text/prepare.py --input CORPUS.txt --num_proc N      (with --text: the local-text path)
and prints a markdown table: wall time (start-up included), tokens/s, and peak memory: the
sum over the script and its workers, and the largest single process (both sampled from /proc
every 0.1 s, so Linux only). The output must be far smaller than the
corpus's tokens: the scripts stream, they never hold the corpus.
"""
import json
import os
import shutil
import subprocess
import sys
import time

from tools.benchmarks.harness import at_least, parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root


def build_corpus(src, work_dir, megabytes, fmt):
    """Paragraphs of src repeated to `megabytes` MB: corpus.{jsonl,parquet} and corpus.txt."""
    with open(src, encoding="utf-8") as f:
        paragraphs = [p for p in f.read().split("\n\n") if p.strip()]
    os.makedirs(work_dir, exist_ok=True)
    target = megabytes * 1_000_000
    txt = os.path.join(work_dir, "corpus.txt")
    data = os.path.join(work_dir, f"corpus.{fmt}")
    if not (os.path.exists(txt) and os.path.exists(data) and os.path.getsize(txt) >= target):
        docs, size, i = [], 0, 0
        with open(txt, "w", encoding="utf-8") as f:
            while size < target:
                p = paragraphs[i % len(paragraphs)]
                f.write(p + "\n\n")
                docs.append(p)
                size += len(p.encode("utf-8")) + 2
                i += 1
        if fmt == "jsonl":
            with open(data, "w") as f:
                f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq
            pq.write_table(pa.table({"text": docs}), data, row_group_size=10_000)
    with open(txt, encoding="utf-8") as f:
        n_docs = len(f.read().split("\n\n")) - 1
    return data, txt, os.path.getsize(txt), n_docs


def tree_memory(root_pid):
    """(current RSS summed over root_pid and its descendants, largest peak RSS among them), bytes, from /proc."""
    children = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(pid))
            except (OSError, IndexError, ValueError):
                continue
    total, largest, stack = 0, 0, [root_pid]
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            total += int(status["VmRSS"].split()[0]) * 1024
            largest = max(largest, int(status["VmHWM"].split()[0]) * 1024)
        except (OSError, KeyError, ValueError):
            continue
    return total, largest


def run(cmd, env):
    """Run cmd, sampling its process tree's memory every 0.1 s: (wall s, peak summed RSS, largest process peak)."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_tree = peak_single = 0
    while proc.poll() is None:
        tree, single = tree_memory(proc.pid)
        peak_tree, peak_single = max(peak_tree, tree), max(peak_single, single)
        time.sleep(0.1)
    wall = time.time() - t0
    _, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
    return wall, peak_tree, peak_single


def main(argv=None):
    ap = parser(__doc__, quick="a 2 MB corpus: a smoke test of the script itself")
    ap.add_argument("--input", default=os.environ.get("TINYSHAKESPEARE_INPUT"), help="text to build the corpus from")
    ap.add_argument("--corpus_mb", type=at_least(1), default=64)
    ap.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    ap.add_argument("--num_proc", type=at_least(1), nargs="+", default=[1, 2])
    ap.add_argument("--text", action="store_true", help="also time data/text/prepare.py on the same text")
    ap.add_argument("--work_dir", default="/tmp/bench_data")
    ap.add_argument("--keep", action="store_true", help="keep the corpus and outputs")
    args = ap.parse_args(argv)
    if not args.input or not os.path.isfile(args.input):
        print("error: pass a text file with --input (or set TINYSHAKESPEARE_INPUT)", file=sys.stderr)
        sys.exit(2)
    if args.quick:
        args.corpus_mb, args.num_proc = 2, [1]

    data, txt, size, n_docs = build_corpus(args.input, args.work_dir, args.corpus_mb, args.format)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    print(f"corpus: {size / 1e6:.0f} MB, {n_docs:,} documents ({args.format}); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| script | num_proc | tokens | wall s | tokens/s | peak RSS, all processes | largest process |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    runs = [("openwebtext", n) for n in args.num_proc] + ([("text", n) for n in args.num_proc] if args.text else [])
    rows = []
    for script, n in runs:
        out = os.path.join(args.work_dir, f"out-{script}-{n}")
        src = data if script == "openwebtext" else txt
        cmd = [sys.executable, f"data/{script}/prepare.py", "--input", src, "--out_dir", out, f"--num_proc={n}"]
        wall, tree, single = run(cmd, env)
        with open(os.path.join(out, "meta.json")) as f:
            meta = json.load(f)
        tokens = meta["train_tokens"] + meta["val_tokens"]
        print(f"| {script} | {n} | {tokens:,} | {wall:.1f} | {tokens / wall:,.0f} | {tree / 2**20:,.0f} MiB | "
              f"{single / 2**20:,.0f} MiB |", flush=True)
        rows.append({"script": script, "num_proc": n, "tokens": tokens, "wall_s": wall, "peak_rss_all": tree,
                     "peak_rss_max": single})
        if not args.keep:
            shutil.rmtree(out)
    print(f"\n(for scale: the corpus is {size / 2**20:,.0f} MiB of text; its tokens as uint16 take "
          f"{2 * tokens / 2**20:,.0f} MiB)")
    if not args.keep:
        shutil.rmtree(args.work_dir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
