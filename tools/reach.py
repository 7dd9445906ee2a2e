"""Which MQAR queries a sparse pattern lets reach their pair, before any training.

    python -m tools.reach config/recall/swa.py config/recall/bigbird.py --data data/mqar64p4 data/mqar64p16

A query at position q asks for the value v of its key k (given earlier at k_pos, v at v_pos). Each
layer reads the tokens its pattern lets it read (Attention.keys_seen: a window, BigBird's blocks;
causal for dense softmax and the recurrent states; None where content chooses, as MoBA does).
Counted over the split's queries:

  field    k_pos and v_pos both lie in q's receptive field, the layers' patterns composed (each with
           the residual path): without it no weights can answer, whatever the circuit
  direct   in the field, and the last layer reads v_pos from q itself: the two-layer recall circuit
           (layer 1 binds k to v at v_pos, layer 2 looks k up from q) needs this
  ceiling  the most accuracy any model with these patterns can have, the best guess from what the
           field holds: 1 in the field; with the value in the field but not the key, 1 / (the pairs
           whose value it sees and whose key it does not: it can rule out those whose key it sees);
           with the value outside, 1 / (the value range less the value-range tokens it sees, filler
           included: filler is never a value of the row)

Fixed patterns are read from the built model (random weights: they do not depend on them; BigBird's
layout comes from sparse_seed), so a config file or a trained run's model gives the same answer. A
content-chosen layer (MoBA) is known only from a trained model's forward on the rows themselves:
reach(..., observe=True), which tools.recall uses for runs that still have their checkpoint. There
the field is the tokens its chosen blocks let it attend to; the choice itself (q . mean(k) over every
earlier block) also carries information, so for MoBA it is not a bound on what can be answered.
For a trained model, reach(..., accuracy=True) also gives what the pattern costs it: its accuracy on
the direct, the in-field-only and the outside queries (tools.recall, beside the counts).
"""
import functools
import json
import os
import sys

import numpy as np
import torch

from model import GPT, GPTConfig
from trainer.cli import ConfigError, OneLineParser, fail
from trainer.rundir import write_json_atomic
from trainer.settings import MODEL_KEYS, parse_shared_keys


def layer_patterns(model, row_len):
    """[bool (1, T, T) per layer], or None when a layer's keys depend on content."""
    seen = [block.attn.keys_seen(row_len) for block in model.h]
    return None if any(s is None for s in seen) else [s.numpy()[None] for s in seen]


def recording(token_keep, out):
    """token_keep that also appends each mask it returns to out."""
    def keep(*args):
        out.append(token_keep(*args))
        return out[-1]
    return keep


@torch.no_grad()
def observed_patterns(model, x, batch=100):
    """[bool (B, T, T) per layer]: what each layer read on the rows x (B, T) of token ids: its fixed pattern,
    or the keys the forward chose (MoBA's token_keep, any head reading a token counts), causal."""
    T = x.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    fixed = [b.attn.keys_seen(T) for b in model.h]
    chosen = {i: [] for i, seen in enumerate(fixed) if seen is None}
    impls = {i: model.h[i].attn.attn_impl for i in chosen}
    for i in chosen:  # an instance attribute over the method, deleted below; naive: the path that masks
        model.h[i].attn.token_keep = recording(model.h[i].attn.token_keep, chosen[i])   # by token_keep at
        model.h[i].attn.attn_impl = "naive"                                             # any length
    try:
        for start in range(0, len(x), batch):
            model(x[start:start + batch].long())
    finally:
        for i in chosen:
            del model.h[i].attn.token_keep
            model.h[i].attn.attn_impl = impls[i]
    return [(torch.cat(chosen[i]).any(dim=1) & causal).numpy() if seen is None else seen.numpy()[None]
            for i, seen in enumerate(fixed)]


def receptive_field(patterns):
    """bool (B, T, T): token j can influence position i through the layers (each read plus the residual);
    B = 1 for fixed patterns (broadcast over rows)."""
    eye = np.eye(patterns[0].shape[-1], dtype=bool)
    field = eye[None]
    for seen in patterns:
        field = np.matmul((seen | eye).astype(np.float32), field.astype(np.float32)) > 0
    return field


def read_split(folder, split, row_len):
    """(tokens, targets), each (rows, row_len)."""
    x = np.fromfile(os.path.join(folder, f"{split}.bin"), dtype=np.uint16).reshape(-1, row_len)
    return x, np.fromfile(os.path.join(folder, f"{split}.targets.bin"), dtype=np.int32).reshape(-1, row_len)


@functools.lru_cache(maxsize=8)   # the runs of one cell share their dataset's files
def queries(folder, split, row_len):
    """[(row, q, k_pos, v_pos, [(k_pos, v_pos) of every pair of the row])] over the split's counted
    queries: k_pos the first earlier occurrence of the query's key, v_pos the only one of its answer
    (prepare.py asks every pair once, so the row's queries give all its pairs)."""
    out = []
    for r, (row, targets) in enumerate(zip(*read_split(folder, split, row_len))):
        pairs = {}
        for q in np.flatnonzero(targets != -1):
            k_pos = int(np.flatnonzero(row[:q] == row[q])[0])
            v_pos = int(np.flatnonzero(row == targets[q])[0])
            pairs[int(q)] = (k_pos, v_pos)
        out += [(r, q, k_pos, v_pos, list(pairs.values())) for q, (k_pos, v_pos) in pairs.items()]
    return out


def best_guess(sees, k_pos, v_pos, row_pairs, row, vocab_size):
    """The accuracy of the best guess of a query that sees the positions `sees` (bool (T,)) of `row`."""
    if sees[k_pos] and sees[v_pos]:
        return 1.0
    if sees[v_pos]:   # among the values it sees whose key it does not (its own among them)
        return 1 / sum(bool(sees[v] and not sees[k]) for k, v in row_pairs)
    half = vocab_size // 2   # values come from [V/2, V); any such token it sees is not the answer
    return 1 / (vocab_size - half - len(set(row[sees & (row >= half)].tolist())))


def reach(model, folder, row_len, split="test", observe=False, accuracy=False):
    """{"field", "direct", "ceiling"}: fractions of the split's queries (ceiling an accuracy). Where a
    layer's keys depend on content: each None, or with observe (a trained model) what its forward chose
    on each row. accuracy (a trained model): also what the pattern costs it, its accuracy on the
    queries of each class (acc_direct, acc_indirect: in the field without a direct read, acc_outside;
    None where a class is empty)."""
    patterns = layer_patterns(model, row_len)
    if patterns is None and not observe:
        return dict.fromkeys(("field", "direct", "ceiling"))
    tokens, targets = read_split(folder, split, row_len)
    if patterns is None:
        patterns = observed_patterns(model, torch.from_numpy(tokens.astype(np.int64)))
    field, last = receptive_field(patterns), patterns[-1]
    ceiling, classes = 0.0, []
    rows = queries(folder, split, row_len)
    for r, q, k_pos, v_pos, row_pairs in rows:
        sees, seen_last = field[r if len(field) > 1 else 0][q], last[r if len(last) > 1 else 0][q]
        in_field = sees[k_pos] and sees[v_pos]
        classes.append("outside" if not in_field else "direct" if seen_last[v_pos] else "indirect")
        ceiling += best_guess(sees, k_pos, v_pos, row_pairs, tokens[r], model.config.vocab_size)
    classes, n = np.array(classes), len(rows)
    out = {"direct": float(np.mean(classes == "direct")), "field": float(np.mean(classes != "outside")),
           "ceiling": ceiling / n}
    if accuracy:
        right = answered(model, tokens, targets)
        out.update({f"acc_{c}": float(right[classes == c].mean()) if (classes == c).any() else None
                    for c in ("direct", "indirect", "outside")})
    return out


@torch.no_grad()
def answered(model, tokens, targets, batch=100):
    """bool per counted query, row-major as queries() lists them: the model's top token is the answer."""
    right = []
    for i in range(0, len(tokens), batch):
        x, y = (torch.from_numpy(a[i:i + batch].astype(np.int64)) for a in (tokens, targets))
        logits, _ = model(x, y, counted_only=True)        # (N, V): the counted positions, row-major
        right.append((logits.argmax(-1) == y[y != -1]).numpy())
    return np.concatenate(right)


def config_model(path, overrides, vocab_size):
    keys = parse_shared_keys(path, overrides)
    return GPT(GPTConfig(vocab_size=vocab_size, **{k: keys[k] for k in MODEL_KEYS}))


def main(argv=None):
    ap = OneLineParser(prog="python -m tools.reach", description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", help="config files (train.py's), e.g. config/recall/swa.py")
    ap.add_argument("--data", nargs="+", required=True, help="MQAR dataset folders (data/mqar/prepare.py)")
    ap.add_argument("--split", default="test", choices=("val", "test"))
    ap.add_argument("--json", help="also write the rows here, [{config, data, row_len, pairs, field, direct, ceiling}]")
    args, overrides = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    metas = {folder: read_meta(folder) for folder in args.data}   # every folder checked before any work
    rows = []
    for folder, meta in metas.items():
        row_len, pairs = meta["row_len"], meta["mqar"]["num_pairs"]
        print(f"{folder}: rows of {row_len} tokens, {pairs} pairs, {args.split} split")
        print("| config | field | direct | ceiling |\n|---|---|---|---|")
        for path in args.configs:
            try:
                model = config_model(path, [*overrides, f"--block_size={row_len}"], meta["vocab_size"])
            except (ConfigError, ValueError) as e:
                fail(f"{path}: {e}")
            r = reach(model, folder, row_len, args.split)
            name = os.path.splitext(os.path.basename(path))[0]
            rows.append({"config": name, "data": folder, "row_len": row_len, "pairs": pairs, **r})
            cells = (["content-chosen: no fixed pattern", "-", "-"] if r["field"] is None
                     else [f"{r[k]:.3f}" for k in ("field", "direct", "ceiling")])
            print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        write_json_atomic(rows, args.json)


def read_meta(folder):
    """The dataset's meta.json; one line and exit 2 unless it is an MQAR dataset."""
    meta_path = os.path.join(folder, "meta.json")
    if not os.path.isfile(meta_path):
        fail(f"--data {folder} has no meta.json: give a folder data/mqar/prepare.py wrote")
    with open(meta_path) as f:
        meta = json.load(f)
    if "mqar" not in meta:
        fail(f"--data {folder} is not an MQAR dataset (no mqar record in its meta.json)")
    return meta


if __name__ == "__main__":
    main()
