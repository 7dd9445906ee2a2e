"""Passkey retrieval at 1x to 8x each run's trained length: a number hidden in filler, asked for at the end.

The probe of Mohtashami & Jaggi 2023, which the PI and YaRN papers report for their stretched models:

    python -m tools.passkey sweeps/ext256/base10k-s1 sweeps/ext256/alibi-s1 --lengths=1x,2x,4x,8x \\
        --rope_scaling=none,yarn --rope_factor=8 --split=test --json passkey.json

A length is in tokens, or Nx: N times the run's block_size. Per run, RoPE setting (--rope_scaling and
its flags, as tools.eval: a row each, other runs as trained) and length, --trials prompts of
length - (answer tokens) tokens each, so that the prompt and its answer fill the length:

    <filler> \\nThe pass key is 48213. Remember it.\\n <filler> \\nWhat is the pass key? The pass key is

The filler is a stretch of the run's own --split tokens (its dataset, its tokenizer) at a random offset;
trial k puts the key sentence at depth (k + u) / trials of the filler, u uniform (stratified: every
depth is covered); each of the --digits digits is uniform, so chance is 1/10^digits. A vocabulary
without the ten digits (Tiny Shakespeare's characters hold only "3") spells them as words ("four eight
two one three"). Trials are seeded by --seed and the length: runs of one dataset get the same prompts.
The model decodes greedily with its cache (GPT.generate, max_context = the length) as many tokens as
the answer has; a trial counts when they decode to the answer exactly.

Out: a markdown table (accuracy, its 95% Wilson interval, chance), under it the regime of a yarn row
(tools.eval), and with --json one object per run, setting and length: {"run", "attention",
"pos_encoding", "rope_scaling", "rope_factor", "block_size", "length", "multiple", "trials", "hits",
"accuracy", "ci95", "chance", "digits", "key_format", "depths", "correct"} ("yarn_regime" on yarn rows;
accuracy, hits and ci95 null where the run cannot take the length: learned positions or BigBird past
block_size, a split too short, a length below the prompt's own sentences). Exit 2 with one line before
any decoding: a bad flag, a run without a text tokenizer or one that cannot spell the prompt, no length
possible for any run.
"""
import itertools
import json
import sys
from typing import NamedTuple

import numpy as np
import torch

from tokenizer import TokenizerError, load_tokenizer
from tools import stats
from tools.eval import (
    add_rope_flags,
    batches,
    check_rope_flags,
    checked_device,
    regime_key,
    regime_notes,
    row_head,
    run_labels,
    scaled_models,
    split_tokens,
    why_not,
)
from trainer.checkpoint import CheckpointError, model_config_from_checkpoint
from trainer.cli import ConfigError, OneLineParser, check_output, fail
from trainer.rundir import Run

KEY_SENTENCE = "\nThe pass key is {key}. Remember it.\n"
QUESTION = "\nWhat is the pass key? The pass key is"
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


class Trial(NamedTuple):
    ids: np.ndarray      # the prompt's token ids (int64)
    answer: str          # what the model must decode, e.g. " 48213"
    n_answer: int        # its tokens
    at: int              # the key sentence's first token in the prompt
    depth: float         # at / the filler's tokens
    key: str             # the digits, e.g. "48213"


def key_format(tok):
    """"digits" when the tokenizer encodes all ten, else "words" (a character vocabulary without them)."""
    try:
        tok.encode("0123456789")
        return "digits"
    except TokenizerError:
        return "words"


def answer_text(key, fmt):
    """The answer as it follows "The pass key is": " 48213" or " four eight two one three"."""
    return " " + ("".join(map(str, key)) if fmt == "digits" else " ".join(DIGIT_WORDS[d] for d in key))


def build_prompt(filler, sentence, question, depth):
    """filler[:at] + sentence + filler[at:] + question, at = round(depth * len(filler)): -> (ids int64, at)."""
    at = round(depth * len(filler))
    return np.concatenate([filler[:at], sentence, filler[at:], question]).astype(np.int64), at


def make_trials(tokens, tok, fmt, length, n_trials, digits, seed):
    """The trials at one length (ValueError where the sentences alone do not fit it)."""
    rng = np.random.default_rng([seed, length])     # the same prompts for every run on these tokens
    question = np.array(tok.encode(QUESTION), dtype=np.int64)
    trials = []
    for k in range(n_trials):
        key = rng.integers(0, 10, digits).tolist()
        answer = answer_text(key, fmt)
        sentence = np.array(tok.encode(KEY_SENTENCE.format(key=answer.strip())), dtype=np.int64)
        n_answer = len(tok.encode(answer))
        n_filler = length - n_answer - len(sentence) - len(question)
        if n_filler < 0:
            raise ValueError(f"the key sentence, question and answer take {length - n_filler} tokens, more than "
                             f"{length}")
        if n_filler > len(tokens):
            raise ValueError(f"the split has {len(tokens)} tokens, fewer than the {n_filler} of filler")
        start = int(rng.integers(0, len(tokens) - n_filler + 1))
        depth = (k + rng.random()) / n_trials
        ids, at = build_prompt(np.asarray(tokens[start:start + n_filler], dtype=np.int64), sentence, question, depth)
        trials.append(Trial(ids, answer, n_answer, at, at / max(n_filler, 1), "".join(map(str, key))))
    return trials


@torch.no_grad()
def score(model, trials, tok, length, batch_size, device, desc):
    """Per trial, whether greedy cached decoding of its answer's token count gives the answer exactly.
    Trials go in batches of one prompt and answer length (GPT.generate takes no padding)."""
    def shape(i):
        return len(trials[i].ids), trials[i].n_answer
    correct = [False] * len(trials)
    for batch in batches(sorted(range(len(trials)), key=shape), batch_size, desc):
        for (_, n), group in itertools.groupby(batch, key=shape):
            group = list(group)
            idx = torch.from_numpy(np.stack([trials[i].ids for i in group])).to(device)
            out = model.generate(idx, n, temperature=0.0, max_context=length)[:, -n:].tolist()
            for i, ids in zip(group, out):
                correct[i] = tok.decode(ids) == trials[i].answer
    return correct


def parse_lengths(text):
    """[(value, relative)]: 256 is tokens, 2x twice the run's block_size."""
    try:
        out = [(int(v.strip()[:-1]), True) if v.strip().endswith("x") else (int(v), False)
               for v in text.split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or min(v for v, _ in out) < 1:
        raise ValueError(f"--lengths={text!r}: give positive token counts or multiples of block_size, e.g. "
                         "--lengths=1x,2x,4x,8x or --lengths=256,1024")
    return out


def prepare(run_dir, name, specs, args):
    """Everything one run needs before decoding (its tokenizer, split and trials per length), so a
    problem is one line before any work: -> dict(run_dir, name, tok, fmt, n_tokens, trials: {length: [Trial]
    or the reason it is not possible})."""
    run = Run(run_dir)
    header = run.header(args.ckpt)  # no weights
    try:
        tok = load_tokenizer(run.meta)
        fmt = key_format(tok)
        tok.encode(KEY_SENTENCE.format(key=answer_text(range(10), fmt)) + QUESTION)
    except TokenizerError as e:
        raise TokenizerError(f"{run_dir}: the passkey prompt cannot be spelled with its tokenizer ({e})") from None
    tokens = split_tokens(header, run_dir, args.data_dir, args.split)
    block_size = model_config_from_checkpoint(header, run.checkpoint_path(args.ckpt)).block_size
    trials = {}
    for value, relative in specs:
        length = value * block_size if relative else value
        try:
            trials[length] = make_trials(tokens, tok, fmt, length, args.trials, args.digits, args.seed)
        except ValueError as e:
            trials[length] = str(e)
    return {"run_dir": run_dir, "name": name, "tok": tok, "fmt": fmt, "n_tokens": len(tokens), "trials": trials}


def probe_run(p, args, device):
    """Rows of one prepared run: per RoPE setting and length, its accuracy (None and a why where not possible)."""
    run = Run(p["run_dir"])
    path, ckpt = run.checkpoint_path(args.ckpt), run.checkpoint(args.ckpt, device)
    rows = []
    for model, label, _ in scaled_models(ckpt, path, p["name"], args, device):
        head = {**row_head(label, model.config), **regime_key(model)}
        for length, trials in p["trials"].items():
            why = trials if isinstance(trials, str) else why_not(model, length, p["n_tokens"])
            correct = None if why else score(model, trials, p["tok"], length, args.batch_size, device,
                                             f"{label} L={length}")
            rows.append(result_row(head, length, None if why else trials, correct, why, args.digits, p["fmt"]))
    return rows


def result_row(head, length, trials, correct, why, digits, fmt):
    hits = None if correct is None else sum(correct)
    n = len(trials) if trials else 0
    return {**head, "length": length, "multiple": length / head["block_size"], "trials": n, "hits": hits,
            "accuracy": None if correct is None else hits / n,
            "ci95": None if correct is None else list(stats.wilson(hits, n)),
            "chance": 10.0 ** -digits, "digits": digits, "key_format": fmt,
            "depths": [round(t.depth, 4) for t in trials] if trials else [], "correct": correct or [], "why": why}


def markdown(rows):
    """One line per run, setting and length; n/a cells point to their reason under the table."""
    reasons = list(dict.fromkeys(r["why"] for r in rows if r["why"]))
    lines = ["| run | attention | pos | block_size | length (x block_size) | accuracy [95% Wilson] (hits/trials) "
             "| chance |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = (f"n/a ({reasons.index(r['why']) + 1})" if r["accuracy"] is None else
               f"{r['accuracy']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] ({r['hits']}/{r['trials']})")
        lines.append(f"| {r['run']} | {r['attention']} | {r['pos_encoding']} | {r['block_size']} | {r['length']} "
                     f"({r['multiple']:g}x) | {acc} | {r['chance']:.0e} |")
    return "\n".join(lines + [""] + [f"({i}) {why}" for i, why in enumerate(reasons, 1)]) + "\n"


def parse_args(argv):
    ap = OneLineParser(prog="python -m tools.passkey", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="train.py out_dirs")
    ap.add_argument("--lengths", default="1x,2x,4x,8x", help="comma-separated: tokens, or Nx = N times block_size")
    ap.add_argument("--trials", type=int, default=50, help="prompts per run, setting and length")
    ap.add_argument("--digits", type=int, default=5, help="digits of the key (chance 1/10^digits)")
    ap.add_argument("--seed", type=int, default=1337, help="draws the keys, depths and filler offsets")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--batch_size", type=int, default=8, help="prompts decoded together")
    ap.add_argument("--ckpt", default="best", help="best (best.pt when present) or last (ckpt.pt)")
    ap.add_argument("--split", default="val", choices=("val", "test"), help="the split the filler comes from")
    ap.add_argument("--data_dir", help="folder holding <dataset>/val.bin (default: the run's data_dir)")
    ap.add_argument("--device", default="auto")
    add_rope_flags(ap)
    ap.set_defaults(stride=None)  # tools.eval.check_runs reads it
    args = ap.parse_args(argv)
    check_output(args.json, "--json")
    check_rope_flags(args)
    for flag, low, high in (("trials", 1, 100000), ("digits", 1, 18), ("batch_size", 1, 100000)):
        if not low <= getattr(args, flag) <= high:
            fail(f"--{flag}={getattr(args, flag)} must be between {low} and {high}")
    try:
        args.specs = parse_lengths(args.lengths)
    except ValueError as e:
        fail(str(e))
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        device = checked_device(args, done="probed")
        prepared = [prepare(d, name, args.specs, args) for d, name in zip(args.runs, run_labels(args.runs))]
        rows = [r for p in prepared for r in probe_run(p, args, device)]
    except (CheckpointError, ConfigError, TokenizerError) as e:
        fail(str(e))
    if all(r["accuracy"] is None for r in rows):
        fail(f"no length of --lengths={args.lengths} is possible for any run ("
             + "; ".join(dict.fromkeys(f"{r['run']}: {r['why']}" for r in rows)) + ")")
    print(markdown(rows) + regime_notes(rows), end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "why"} for r in rows], f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
