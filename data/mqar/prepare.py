"""MQAR, multi-query associative recall (Arora et al. 2023, "Zoology"), in Zoology's layout.

    python data/mqar/prepare.py                                  # 64 tokens, 4 pairs, vocab 512
    python data/mqar/prepare.py --seq_len=128 --num_pairs=16 --out_dir=data/mqar128p16

Each example is a row of seq_len tokens: num_pairs key-value pairs, then each key queried once,
at a place drawn with a power law (most queries soon after the pairs, some far). A query slot
holds the key alone; the token after it is filler, never the answer:

    k1 v1 k2 v2 k3 v3 | f f k2 f f f k1 f f f f k3 f ...        (f: filler)
    targets:            . . v2 . . . v1 . . . . v3 . ...        (.: ignored, -1)

Token ranges (vocab V, half = V // 2): keys from [1, half), distinct within a row; values from
[half, V), distinct within a row (Zoology draws both without replacement); 0 is never written.
Filler comes from the value range less the row's own values: it is never a key (a query has one
earlier occurrence of its key) and never a value of the row, so the input after the pairs holds no
answer at all. A model that ignores which value was paired with which key can do no better than
guessing among the row's P values: accuracy 1/P (tests/test_mqar.py checks it on the files).
Zoology draws filler from the whole vocabulary, which at its 8,192 tokens rarely hits a key of
the row; at smaller vocabularies it would, often.

Written as a dataset of aligned examples (meta.json "format": "examples"): {split}.bin holds
the inputs, row after row (uint16), {split}.targets.bin the targets (int32, -1 where the position
does not count); train.py, tools.eval and tools.compare report accuracy on the counted positions
beside the loss. train.py needs block_size = seq_len. Seeded: the same flags write the same files,
written in chunks of rows, so memory stays small whatever --num_train.
"""
import os
import runpy
import shutil
import sys

import numpy as np

# Registers the data package without editing sys.path; data/bootstrap.py says why (and why at top level).
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bootstrap.py"))

IGNORE = -1  # the target of a position that does not count (model.py's cross_entropy ignore_index)
ROWS_TIMES_VOCAB = 2**24  # rows generated at a time x vocab_size: each row shuffles its vocabulary (bounded memory)
ROW_BYTES = 2 + 4  # bytes per token on disk: uint16 input, int32 target


def check(vocab_size, seq_len, num_pairs, power_a, seed):
    """One line naming what cannot make an example, or None."""
    half = vocab_size // 2
    if num_pairs < 1:
        return f"--num_pairs={num_pairs} must be at least 1"
    if 4 * num_pairs > seq_len:
        return (f"--num_pairs={num_pairs} do not fit in --seq_len={seq_len}: the pairs and their queries take "
                f"4 x {num_pairs} = {4 * num_pairs} tokens; raise --seq_len or lower --num_pairs")
    if half - 1 < num_pairs or vocab_size - half < num_pairs + 1:
        return (f"--vocab_size={vocab_size} holds {max(half - 1, 0)} keys ([1, V/2)) and {vocab_size - half} values "
                f"([V/2, V)); {num_pairs} pairs need {num_pairs} distinct keys and {num_pairs} distinct values plus "
                f"one filler token: raise --vocab_size to at least {2 * num_pairs + 2}")
    if vocab_size > 65536:
        return f"--vocab_size={vocab_size} does not fit uint16 token files; at most 65536"
    if not 0 < power_a <= 1:
        return f"--power_a={power_a} must be in (0, 1] (the query gaps' power law; 0.01 is Zoology's)"
    if not 0 <= seed < 2**32:
        return f"--seed={seed} must be in [0, 2**32)"
    return None


def distinct(rng, n, low, high, k):
    """(n, k) int64: k distinct draws from [low, high) per row, uniformly (random keys, top k)."""
    return np.argsort(rng.random((n, high - low)), axis=1)[:, :k] + low


def make_examples(n, vocab_size, seq_len, num_pairs, power_a, rng):
    """inputs (n, seq_len) int64 and targets (n, seq_len) int64 (IGNORE where not counted)."""
    half, P = vocab_size // 2, num_pairs
    keys = distinct(rng, n, 1, half, P)                                    # (n, P)
    # values and filler from one draw of the value range per row: the first P are the row's values,
    # the rest its filler alphabet (so filler is never a value of the row)
    value_range = distinct(rng, n, half, vocab_size, vocab_size - half)    # (n, V - half), a permutation
    values, filler_alphabet = value_range[:, :P], value_range[:, P:]
    pick = rng.integers(0, filler_alphabet.shape[1], (n, seq_len))
    seq = np.take_along_axis(filler_alphabet, pick, axis=1)               # (n, seq_len) filler everywhere
    seq[:, 0:2 * P:2], seq[:, 1:2 * P:2] = keys, values
    # query slots: positions 2P + 2s, s < slots, drawn without replacement with probability
    # ~ (s + 1)^(a - 1) (Zoology's power law over the gap); Gumbel top-k samples exactly that
    slots = (seq_len - 2 * P) // 2
    logp = (power_a - 1) * np.log(np.arange(1, slots + 1, dtype=np.float64))
    chosen = np.argsort(-(logp + rng.gumbel(size=(n, slots))), axis=1)[:, :P]        # (n, P) distinct slots
    # which key each slot asks: a fresh permutation. The draw order above favours near slots first,
    # so "slot i asks key i" would let the pair's rank predict the query's (Zoology's generator does
    # that; tests/test_mqar.py measures it: 0.55 at 2 pairs where chance is 0.5)
    chosen = np.take_along_axis(chosen, np.argsort(rng.random((n, P)), axis=1), axis=1)
    where = 2 * P + 2 * chosen                                             # query of key i
    rows = np.arange(n)[:, None]
    seq[rows, where] = keys
    targets = np.full((n, seq_len), IGNORE, dtype=np.int64)
    targets[rows, where] = values                                          # reading the key, predict its value
    return seq, targets


def write_split(out_dir, split, n, args, rng, bar):
    """{split}.bin (uint16) and {split}.targets.bin (int32), generated a chunk of rows at a time and
    written under temporary names, renamed when complete."""
    chunk = max(1, ROWS_TIMES_VOCAB // args.vocab_size)
    paths = [os.path.join(out_dir, split + suffix) for suffix in (".bin", ".targets.bin")]
    with open(paths[0] + ".tmp", "wb") as inputs, open(paths[1] + ".tmp", "wb") as targets:
        for start in range(0, n, chunk):
            x, y = make_examples(min(chunk, n - start), args.vocab_size, args.seq_len, args.num_pairs,
                                 args.power_a, rng)
            x.astype(np.uint16).tofile(inputs)
            y.astype(np.int32).tofile(targets)
            bar.update(len(x))
    for path in paths:
        os.replace(path + ".tmp", path)


def check_disk(out_dir, counts, seq_len):
    """One line when the files would not fit on out_dir's disk (checked before anything is written)."""
    need = sum(counts.values()) * seq_len * ROW_BYTES
    free = shutil.disk_usage(out_dir).free
    if need > free:
        return (f"the {sum(counts.values()):,} rows of {seq_len} tokens take {need / 2**30:,.1f} GiB and "
                f"{out_dir} has {free / 2**30:,.1f} GiB free; lower --num_train/--num_val/--num_test")
    return None


def main(argv=None):
    from data.cli import Parser, positive_int, progress
    from data.errors import fail
    from data.writer import check_out_dir, write_failure, write_json_atomic

    ap = Parser(__doc__)
    ap.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--vocab_size", type=positive_int, default=512, help="V: keys from [1, V/2), values and "
                    "filler from [V/2, V) (Zoology: 8192)")
    ap.add_argument("--seq_len", type=positive_int, default=64, help="tokens per example (train.py's block_size)")
    ap.add_argument("--num_pairs", type=positive_int, default=4, help="key-value pairs per example")
    ap.add_argument("--power_a", type=float, default=0.01, help="query gaps ~ gap^(a-1) (Zoology's 0.01)")
    ap.add_argument("--num_train", type=positive_int, default=100_000)
    ap.add_argument("--num_val", type=positive_int, default=1_000)
    ap.add_argument("--num_test", type=positive_int, default=1_000, help="0: no test split")
    ap.add_argument("--seed", type=int, default=0, help="in [0, 2**32): the same flags write the same files")
    args = ap.parse_args(argv)
    why = check(args.vocab_size, args.seq_len, args.num_pairs, args.power_a, args.seed)
    if why or args.num_train < 1 or args.num_val < 1:
        fail(why or "--num_train and --num_val must be at least 1")
    check_out_dir(args.out_dir)
    counts = {"train": args.num_train, "val": args.num_val, "test": args.num_test}
    why = check_disk(args.out_dir, counts, args.seq_len)
    if why:
        fail(why)
    rng = np.random.default_rng(args.seed)
    meta = {"vocab_size": args.vocab_size, "dtype": "uint16", "tokenizer": "none", "format": "examples",
            "row_len": args.seq_len, "ignore_index": IGNORE, "targets_dtype": "int32",
            "mqar": {**{k: getattr(args, k) for k in ("vocab_size", "seq_len", "num_pairs", "power_a", "seed")},
                     "layout": "zoology"}}
    meta_path = os.path.join(args.out_dir, "meta.json")
    try:
        if os.path.exists(meta_path):  # no meta.json while the files change: train.py refuses, not misreads
            os.remove(meta_path)
        with progress(sum(counts.values()), "row", "mqar") as bar:
            for split, n in counts.items():
                if not n:  # an older test split belongs to other files
                    for suffix in (".bin", ".targets.bin"):
                        if os.path.exists(os.path.join(args.out_dir, split + suffix)):
                            os.remove(os.path.join(args.out_dir, split + suffix))
                else:
                    write_split(args.out_dir, split, n, args, rng, bar)
                    meta[f"{split}_examples"] = n
        write_json_atomic(meta_path, meta)   # last: the files are complete
    except OSError as e:
        fail(write_failure(args.out_dir, e))
    print(f"wrote {sum(counts.values()):,} examples of {args.seq_len} tokens ({args.num_pairs} pairs) to "
          f"{args.out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
