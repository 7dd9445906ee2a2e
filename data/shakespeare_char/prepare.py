"""Tiny Shakespeare at the character level: train.bin, val.bin (uint16) and meta.json.

    python data/shakespeare_char/prepare.py                 # downloads input.txt
    python data/shakespeare_char/prepare.py --input FILE    # a local copy (offline, tests)

90/10 train/val split; the vocabulary is the sorted set of characters in the text.
"""
import argparse
import json
import os
import sys
import urllib.request

import numpy as np

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def write_atomic(path, write):
    """Write through a temporary name, then rename, so no half-written file is ever read."""
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", help="local input.txt (default: download)")
    ap.add_argument("--out_dir", default=here, help="where to write train.bin, val.bin, meta.json")
    args = ap.parse_args()

    if args.input:
        if not os.path.isfile(args.input):
            fail(f"--input {args.input} does not exist; pass the path of a text file")
        with open(args.input, encoding="utf-8") as f:
            text = f.read()
    else:
        try:
            with urllib.request.urlopen(URL, timeout=30) as r:
                text = r.read().decode("utf-8")
        except OSError as e:
            fail(f"download of {URL} failed ({e}); pass a local copy with --input PATH")
    if len(text) < 2:
        fail(f"input is empty; pass a text file with --input")
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        fail(f"cannot create --out_dir {args.out_dir} ({e.strerror}); pick a writable folder")

    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = int(0.9 * len(ids))
    write_atomic(os.path.join(args.out_dir, "train.bin"), lambda p: ids[:n].tofile(p))
    write_atomic(os.path.join(args.out_dir, "val.bin"), lambda p: ids[n:].tofile(p))
    meta = {"vocab_size": len(chars), "dtype": "uint16", "tokenizer": "char", "chars": chars}
    write_atomic(os.path.join(args.out_dir, "meta.json"), lambda p: open(p, "w").write(json.dumps(meta)))
    print(f"{len(text):,} characters, vocab {len(chars)}: {n:,} train / {len(ids) - n:,} val tokens -> {args.out_dir}")


if __name__ == "__main__":
    main()
