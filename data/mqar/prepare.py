"""MQAR, multi-query associative recall (Arora et al. 2023, "Zoology"): a synthetic recall task.

    python data/mqar/prepare.py                                  # 64 tokens, 8 pairs, vocab 256
    python data/mqar/prepare.py --seq_len=256 --num_pairs=32 --out_dir=data/mqar256

Each example is a row of seq_len tokens: num_pairs key-value pairs, then each key queried once,
at a place drawn with a power law (most queries soon after the pairs, some far):

    k1 v1 k2 v2 k3 v3 | n n k2 v2 n k1 v1 n n n k3 v3 n ...     (n: random values)
    targets:            . . v2 .  . v1 .  . . . v3 .  . ...     (.: ignored, -1)

Keys come from [1, vocab/2) without repeats in a row, values and the noise from [vocab/2, vocab); the model
reads the key of a query and must produce its value, which only recall of the pairs gives.
Written as a dataset of aligned examples (meta.json "format": "examples"): {split}.bin holds
the inputs, row after row (uint16), {split}.targets.bin the targets (int32, -1 where the position
does not count); train.py, tools.eval and tools.compare report accuracy on the counted positions
beside the loss. train.py needs block_size = seq_len. Seeded: the same flags write the same files.
"""
import os
import runpy
import sys

import numpy as np

# Registers the data package without editing sys.path; data/bootstrap.py says why (and why at top level).
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bootstrap.py"))

IGNORE = -1  # the target of a position that does not count (model.py's cross_entropy ignore_index)


def check(vocab_size, seq_len, num_pairs, power_a):
    """One line naming what cannot make an example, or None."""
    if num_pairs < 1:
        return f"--num_pairs={num_pairs} must be at least 1"
    if 4 * num_pairs > seq_len:
        return (f"--num_pairs={num_pairs} do not fit in --seq_len={seq_len}: the pairs and their queries take "
                f"4 x {num_pairs} = {4 * num_pairs} tokens; raise --seq_len or lower --num_pairs")
    if vocab_size // 2 - 1 < num_pairs:
        return (f"--vocab_size={vocab_size} holds {max(vocab_size // 2 - 1, 0)} keys ([1, vocab/2)), fewer than "
                f"--num_pairs={num_pairs} distinct ones; raise --vocab_size to at least {2 * num_pairs + 2}")
    if vocab_size > 65536:
        return f"--vocab_size={vocab_size} does not fit uint16 token files; at most 65536"
    if not 0 < power_a <= 1:
        return f"--power_a={power_a} must be in (0, 1] (the query gaps' power law; 0.01 is Zoology's)"
    return None


def make_examples(n, vocab_size, seq_len, num_pairs, power_a, rng):
    """inputs (n, seq_len) int64 and targets (n, seq_len) int64 (IGNORE where not counted)."""
    half = vocab_size // 2
    # distinct keys per row: the first num_pairs of a random order of [1, half)
    keys = np.argsort(rng.random((n, half - 1)), axis=1)[:, :num_pairs] + 1
    values = rng.integers(half, vocab_size, (n, num_pairs))
    # the noise between queries comes from the value half: a key appears only in its pair and its
    # query, so each query has one answer (Zoology draws noise from the whole vocabulary, which at its
    # 8192 tokens rarely repeats a key; at this repo's small vocabularies it would, often)
    seq = rng.integers(half, vocab_size, (n, seq_len + 1))
    seq[:, 0:2 * num_pairs:2], seq[:, 1:2 * num_pairs:2] = keys, values
    # query slots: pairs of positions after the context, slot s at 2P + 2s, drawn without
    # replacement with probability ~ (s + 1)^(a - 1) (Zoology's power law over the gap)
    slots = (seq_len - 2 * num_pairs) // 2
    p = np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1)
    p /= p.sum()
    targets = np.full((n, seq_len + 1), IGNORE, dtype=np.int64)
    for row in range(n):
        where = 2 * num_pairs + 2 * rng.choice(slots, num_pairs, replace=False, p=p)
        order = rng.permutation(num_pairs)                             # which key each query asks
        seq[row, where], seq[row, where + 1] = keys[row, order], values[row, order]
        targets[row, where] = values[row, order]                       # reading the key, predict its value
    return seq[:, :seq_len], targets[:, :seq_len]


def write_split(out_dir, split, inputs, targets):
    """{split}.bin (uint16) and {split}.targets.bin (int32), each written under a temporary name first."""
    for suffix, array in ((".bin", inputs.astype(np.uint16)), (".targets.bin", targets.astype(np.int32))):
        path = os.path.join(out_dir, split + suffix)
        array.tofile(path + ".tmp")
        os.replace(path + ".tmp", path)


def main(argv=None):
    from data.cli import Parser, positive_int
    from data.errors import fail
    from data.writer import check_out_dir, write_failure, write_json_atomic

    ap = Parser(__doc__)
    ap.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--vocab_size", type=positive_int, default=256)
    ap.add_argument("--seq_len", type=positive_int, default=64, help="tokens per example (train.py's block_size)")
    ap.add_argument("--num_pairs", type=positive_int, default=8, help="key-value pairs per example")
    ap.add_argument("--power_a", type=float, default=0.01, help="query gaps ~ gap^(a-1) (Zoology's 0.01)")
    ap.add_argument("--num_train", type=positive_int, default=20_000)
    ap.add_argument("--num_val", type=positive_int, default=1_000)
    ap.add_argument("--num_test", type=positive_int, default=1_000, help="0: no test split")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    why = check(args.vocab_size, args.seq_len, args.num_pairs, args.power_a)
    if why or args.num_train < 1 or args.num_val < 1:
        fail(why or "--num_train and --num_val must be at least 1")
    check_out_dir(args.out_dir)
    rng = np.random.default_rng(args.seed)
    counts = {"train": args.num_train, "val": args.num_val, "test": args.num_test}
    meta = {"vocab_size": args.vocab_size, "dtype": "uint16", "tokenizer": "none", "format": "examples",
            "row_len": args.seq_len, "ignore_index": IGNORE, "targets_dtype": "int32",
            "mqar": {k: getattr(args, k) for k in ("vocab_size", "seq_len", "num_pairs", "power_a", "seed")}}
    meta_path = os.path.join(args.out_dir, "meta.json")
    try:
        if os.path.exists(meta_path):  # no meta.json while the files change: train.py refuses, not misreads
            os.remove(meta_path)
        for split, n in counts.items():
            if not n:  # an older test split belongs to other files
                for suffix in (".bin", ".targets.bin"):
                    if os.path.exists(os.path.join(args.out_dir, split + suffix)):
                        os.remove(os.path.join(args.out_dir, split + suffix))
            else:
                write_split(args.out_dir, split, *make_examples(n, args.vocab_size, args.seq_len, args.num_pairs,
                                                                args.power_a, rng))
                meta[f"{split}_examples"] = n
        write_json_atomic(meta_path, meta)   # last: the files are complete
    except OSError as e:
        fail(write_failure(args.out_dir, e))
    print(f"wrote {sum(counts.values()):,} examples of {args.seq_len} tokens ({args.num_pairs} pairs) to "
          f"{args.out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
