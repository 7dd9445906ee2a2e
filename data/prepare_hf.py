"""Front end for Hugging Face text datasets (data/openwebtext, data/fineweb): a hub name or local files.

Every document (dataset row) is followed by the end-of-text token; validation is a seeded random
fraction of the documents, or the dataset's own split (--val_split). An interrupted run (Ctrl-C, a
dropped connection) keeps its temporary files with prepare_state.json and resumes when the same
command runs again; bad data found midway leaves nothing behind.
"""
import argparse
import os
import sys
import time

import numpy as np

from .cli import Parser, add_output_args, check_fractions, check_num_proc, positive_int, progress, test_share
from .errors import InputError, SourceError, fail
from .hf_source import TEXT_FIELD_HINT, hf_tasks, looks_local, open_source
from .tokenizers import Workers, choose_dtype, load_encoding, tiktoken_name
from .writer import Output, check_out_dir, write_failure

CHECKPOINT_SECONDS = 30.0  # how often a long run records where it is (for resuming)
# The options that decide the output: a saved state from a run with other values is not resumed.
SIGNATURE_KEYS = ("input", "dataset", "name", "split", "val_split", "val_fraction", "test_fraction", "seed",
                  "text_field", "revision", "max_tokens")


def _parser(description, dataset, out_dir, name, split, val_split, val_fraction, text_field, tokenizer, max_tokens):
    ap = Parser(description)
    ap.add_argument("--input", metavar="PATH", help=f"a local copy instead of the hub: {TEXT_FIELD_HINT}")
    ap.add_argument("--dataset", default=dataset,
                    help="Hugging Face dataset name, or a local path (default %(default)s)")
    ap.add_argument("--name", default=name, help="the dataset's configuration (default %(default)s)")
    ap.add_argument("--split", default=split, help="split to read (default %(default)s)")
    ap.add_argument("--val_split", default=val_split,
                    help="use this split of the dataset for validation instead of --val_fraction")
    ap.add_argument("--val_fraction", type=float, default=val_fraction,
                    help="fraction of documents drawn (seeded) for validation (default %(default)s)")
    ap.add_argument("--seed", type=int, default=2357, help="seed of the validation draw")
    ap.add_argument("--text_field", default=text_field, help="column holding the text (default %(default)s)")
    ap.add_argument("--tokenizer", default=tokenizer, help="a tiktoken encoding (default %(default)s)")
    ap.add_argument("--max_tokens", type=positive_int, default=max_tokens,
                    help="stop after the document that reaches this many tokens (per split read; 0 = all)")
    ap.add_argument("--streaming", action=argparse.BooleanOptionalAction, default=True,
                    help="stream from the hub (default); --no-streaming downloads into the datasets cache first")
    ap.add_argument("--revision", default=None, help="hub revision (branch, tag or commit)")
    add_output_args(ap, out_dir)
    return ap


def _check_args(args, local):
    """The checks that need no dataset: returns (encoding name, tiktoken encoding, dtype)."""
    if args.input is not None and not os.path.exists(args.input):
        raise InputError(f"--input {args.input} does not exist; pass {TEXT_FIELD_HINT}")
    if args.val_split is None and not 0 < args.val_fraction < 1:
        raise InputError(f"--val_fraction={args.val_fraction} must be between 0 and 1 (e.g. 0.0005)")
    check_fractions(None if args.val_split else args.val_fraction, args.test_fraction)
    if not local and looks_local(args.dataset):
        raise InputError(f"--dataset {args.dataset} does not exist; pass an existing path or a hub dataset name")
    check_num_proc(args.num_proc)
    enc_name = tiktoken_name(args.tokenizer)
    if enc_name is None:
        raise InputError("--tokenizer=char needs the whole corpus's character set; use data/text/prepare.py "
                         "for character-level data, or a tiktoken encoding here")
    enc = load_encoding(enc_name)
    return enc_name, enc, choose_dtype(enc.n_vocab, args.dtype)


def _open_sources(args, local):
    """[(route, dataset)]: route 'fraction' draws validation documents, 'train' / 'val' sends all to one split."""
    sources = [("fraction" if args.val_split is None else "train", open_source(args, args.split, local))]
    if args.val_split is not None:
        sources.append(("val", open_source(args, args.val_split, local)))
    return sources


class _Run:
    """One pass over the sources into `out`: where it stands (st), the validation draw (rng), and
    last_good, the state after the last task whose tokens are all written (what a resume restarts from)."""

    def __init__(self, args, out, sources, local, signature):
        self.args, self.out, self.sources, self.local, self.signature = args, out, sources, local, signature
        self.rng = np.random.default_rng(args.seed)
        self.st = {"source": 0, "ds_state": None, "docs": 0, "source_tokens": 0, "train_docs": 0,
                   "last_train_len": 0}
        self.last_good = None

    def open(self):
        """Reopen the files of an interrupted run with the same signature, or start empty ones."""
        saved = self.out.load_state()
        if saved and saved.get("signature") == self.signature and self.out.can_resume(saved["tokens"]):
            self.st.update({k: saved[k] for k in self.st})
            self.rng.bit_generator.state = saved["rng"]
            self.out.open(resume_tokens=saved["tokens"])
            split = self.args.split if self.st["source"] == 0 else self.args.val_split
            print(f"resuming an interrupted run at document {self.st['docs']:,} of split "
                  f"{split} ({sum(self.out.tokens.values()):,} tokens written)", file=sys.stderr)
        else:
            if saved:
                print("a saved state from a run with other settings was found: starting over", file=sys.stderr)
            self.out.open()

    def checkpoint(self):
        if self.last_good is not None:
            self.out.save_state({**self.last_good, "signature": self.signature})

    def tokenize(self, workers, bar):
        """Every source in turn, from where the run stands."""
        args, st = self.args, self.st
        last_save = time.time()
        for si in range(st["source"], len(self.sources)):
            route, ds = self.sources[si]
            if si > st["source"]:
                st.update(docs=0, source_tokens=0, ds_state=None)
            if st["ds_state"] is not None:
                ds.load_state_dict(st["ds_state"])
            done = args.max_tokens and st["source_tokens"] >= args.max_tokens
            # test documents are drawn with val's (at val + test) and split off its tail at the end
            tasks = hf_tasks(ds, args.text_field, st["docs"], route, self.rng, args.val_fraction + args.test_fraction,
                             self.local)
            for task, (flat, lengths) in ([] if done else workers.map(tasks)):
                if self._write(si, task, flat, lengths, bar):
                    break
                if time.time() - last_save >= CHECKPOINT_SECONDS:
                    self.checkpoint()
                    last_save = time.time()
            self.last_good = None if si + 1 == len(self.sources) else {
                **st, "source": si + 1, "docs": 0, "source_tokens": 0, "ds_state": None,
                "rng": self.rng.bit_generator.state, "tokens": dict(self.out.tokens)}

    def _write(self, si, task, flat, lengths, bar):
        """Write one task's documents to their splits; True when --max_tokens is reached."""
        args, st, out = self.args, self.st, self.out
        to_val, done = task["to_val"], False
        if args.max_tokens and st["source_tokens"] + flat.size >= args.max_tokens:
            # keep documents up to the one that reaches max_tokens: the same cut whatever the task sizes
            ends = np.cumsum(lengths)
            keep = int(np.searchsorted(ends, args.max_tokens - st["source_tokens"])) + 1
            flat, lengths, to_val, done = flat[:ends[keep - 1]], lengths[:keep], to_val[:keep], True
        token_val = np.repeat(to_val, lengths)
        out.write("val", flat[token_val])
        out.write("train", flat[~token_val])
        if (~to_val).any():
            st["last_train_len"] = int(lengths[np.flatnonzero(~to_val)[-1]])
        st["train_docs"] += int((~to_val).sum())
        st["docs"] = task["end_doc"] - (len(task["to_val"]) - len(to_val))
        st["source_tokens"] += int(flat.size)
        st.update(source=si, ds_state=task["ds_state"])
        self.last_good = {**st, "rng": task["rng"], "tokens": dict(out.tokens)}  # a consistent point
        bar.update(int(flat.size))
        bar.set_postfix(docs=f"{st['docs']:,}", train=f"{out.tokens['train']:,}",
                        val=f"{out.tokens['val']:,}", refresh=False)
        return done

    def finish(self, enc, enc_name, dtype):
        """Check that both splits hold tokens (the last document becomes val if the draw took none), commit."""
        args, out = self.args, self.out
        if out.tokens["train"] + out.tokens["val"] == 0:
            raise InputError(f"{args.input or args.dataset} holds no documents")
        if out.tokens["val"] == 0:
            if args.val_split is not None:
                raise InputError(f"split {args.val_split!r} holds no documents; pick another --val_split")
            if self.st["train_docs"] < 2:
                raise InputError("the dataset holds a single document: too few to split off validation; "
                                 "add documents, or use data/text/prepare.py, which splits inside a text")
            print(f"--val_fraction={args.val_fraction} drew no document from {self.st['train_docs']:,}; "
                  f"the last document is the validation split", file=sys.stderr)
            out.move_tail_to_val(self.st["last_train_len"])
        # with --val_split the test split is that split's tail (test_fraction of it)
        share = args.test_fraction if args.val_split else test_share(args.val_fraction, args.test_fraction)
        out.commit({"vocab_size": enc.n_vocab, "dtype": dtype, "tokenizer": f"tiktoken:{enc_name}",
                    "eot_token": enc.eot_token, "train_tokens": out.tokens["train"], "val_tokens": out.tokens["val"],
                    "source": args.input or args.dataset, "name": args.name, "split": args.split,
                    "val_split": args.val_split, "val_fraction": None if args.val_split else args.val_fraction,
                    "seed": args.seed, "text_field": args.text_field, "max_tokens": args.max_tokens,
                    **({"test_fraction": args.test_fraction} if args.test_fraction else {})}, share)

    def stop(self, e):
        """Ctrl-C (exit 130) or a source broken midway (exit 1): keep what a rerun resumes from, and say so."""
        self.checkpoint()
        if os.path.exists(self.out.state_path):
            self.out.close()
            kept = sum(self.out.load_state()["tokens"].values())
            how = f"run the same command again to resume ({kept:,} tokens are kept)"
        else:
            self.out.discard()
            how = "nothing was kept"
        if isinstance(e, KeyboardInterrupt):
            print(f"\ninterrupted; {how}", file=sys.stderr)
            sys.exit(130)
        print(f"error: {e}; {how}", file=sys.stderr)
        sys.exit(1)


def _execute(run, enc, enc_name, dtype):
    """Tokenize and commit, turning every way of stopping into its exit status and what it leaves behind."""
    workers = None
    bar = progress(run.args.max_tokens * len(run.sources) or None, "tok", "tokenizing")
    try:
        workers = Workers(run.args.num_proc, ("tiktoken", enc_name), dtype)
        bar.update(sum(run.out.tokens.values()))
        run.tokenize(workers, bar)
        bar.close()
        run.finish(enc, enc_name, dtype)
    except InputError as e:  # bad data found midway: nothing to resume, leave nothing behind
        bar.close()
        run.out.discard()
        fail(str(e))
    except (KeyboardInterrupt, SourceError) as e:
        bar.close()
        run.stop(e)
    except BaseException:  # a bug: keep what can be resumed, show the traceback
        bar.close()
        run.checkpoint()
        run.out.close()
        raise
    finally:
        bar.close()
        if workers is not None:
            workers.close()


def main(description, argv=None, *, dataset, out_dir, name=None, split="train", val_split=None,
         val_fraction=0.0005, text_field="text", tokenizer="gpt2", max_tokens=0):
    """Tokenize a Hugging Face dataset (hub name or local files) into out_dir; see the module docstring."""
    args = _parser(description, dataset, out_dir, name, split, val_split, val_fraction, text_field, tokenizer,
                   max_tokens).parse_args(argv)
    local = args.input is not None or os.path.exists(args.dataset)
    try:
        enc_name, enc, dtype = _check_args(args, local)
    except InputError as e:
        fail(str(e))
    out = Output(args.out_dir, dtype, created_dir=check_out_dir(args.out_dir))
    try:
        sources = _open_sources(args, local)
    except InputError as e:
        out.discard()
        fail(str(e))
    signature = {**{k: getattr(args, k) for k in SIGNATURE_KEYS}, "tokenizer": enc_name, "dtype": dtype}
    run = _Run(args, out, sources, local, signature)
    run.open()
    try:
        _execute(run, enc, enc_name, dtype)
    except OSError as e:  # a full or read-only disk while writing
        fail(write_failure(args.out_dir, e) + ", then re-run the same command")
    print(f"{args.input or args.dataset}: {out.tokens['train']:,} train / {out.tokens['val']:,} val tokens "
          f"({dtype}, {enc_name}) -> {args.out_dir}")
