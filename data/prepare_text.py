"""Front end for local text (data/text, data/shakespeare, data/shakespeare_char): files in, train/val out.

Files are read in the order given (a folder's .txt files sorted by path); each is one document,
followed by the end-of-text token with tiktoken encodings. The last --val_fraction of the text is
the validation split. A run stopped for any reason leaves nothing behind (local text is quick to redo).
"""
import os
import sys
from dataclasses import dataclass

from .cli import Parser, add_output_args, check_fractions, check_num_proc, progress, test_share
from .errors import InputError, fail
from .text_source import NEWLINES, download, list_text_files, scan_text_files, text_pieces
from .tokenizers import Workers, choose_dtype, load_encoding, tiktoken_name
from .writer import Output, check_out_dir, write_failure


@dataclass
class Vocabulary:
    total_chars: int
    size: int
    spec: tuple      # what the workers build their encoder from: ('char', chars) or ('tiktoken', name)
    meta: dict       # the tokenizer's entries in meta.json
    dtype: str


def _parser(description, out_dir, tokenizer, val_fraction, url):
    ap = Parser(description)
    if url is None:
        ap.add_argument("--input", nargs="+", metavar="PATH",
                        help="text files and/or folders (every .txt inside, sorted); each file is one document")
    else:
        ap.add_argument("--input", nargs=1, metavar="PATH", help="a local copy of the text (default: download it)")
        ap.add_argument("--url", default=url, help="where to download the text from (default %(default)s)")
    ap.add_argument("--tokenizer", default=tokenizer,
                    help="char, or a tiktoken encoding: gpt2, r50k_base, cl100k_base, o200k_base... "
                         "(default %(default)s)")
    ap.add_argument("--val_fraction", type=float, default=val_fraction,
                    help="the last this fraction of the text is the validation split (default %(default)s)")
    ap.add_argument("--newlines", default="keep", choices=NEWLINES,
                    help="keep (default): the text as it is, a UTF-8 byte-order mark and the \\r of CRLF line ends "
                         "become tokens too; unix: as dos2unix, \\r\\n (and a lone \\r) read as \\n and a leading "
                         "byte-order mark dropped")
    add_output_args(ap, out_dir)
    return ap


def _check_args(args, url):
    """The checks that need no reading: (tiktoken encoding name or None for char, files or None to download)."""
    if url is None and not args.input:
        raise InputError("no input; pass text files or folders with --input PATH [PATH ...]")
    if not 0 < args.val_fraction < 1:
        raise InputError(f"--val_fraction={args.val_fraction} must be between 0 and 1 (e.g. 0.1)")
    check_fractions(args.val_fraction, args.test_fraction)
    check_num_proc(args.num_proc)
    enc_name = tiktoken_name(args.tokenizer)
    return enc_name, (list_text_files(args.input) if args.input else None)


def _vocabulary(files, enc_name, dtype, test_fraction=0.0, newlines="keep"):
    """One pass over the files (UTF-8, not empty, the character set for char) and the vocabulary they get."""
    found = {}
    total, chars = scan_text_files(files, want_chars=enc_name is None, newlines=newlines, found=found)
    note_line_ends(found, len(files))
    if total < 2:
        raise InputError("the input holds a single character, too little to split into train and val")
    if test_fraction and total * test_fraction < 1:  # before any work: test.bin would be empty
        raise InputError(f"--test_fraction={test_fraction} of {total:,} characters is {total * test_fraction:.2g} "
                         f"characters: test.bin would be empty; give at least {1 / total:.2g} (or 0: no test split)")
    if enc_name is None:
        return Vocabulary(total, len(chars), ("char", chars), {"tokenizer": "char", "chars": chars},
                          choose_dtype(len(chars), dtype))
    enc = load_encoding(enc_name)
    return Vocabulary(total, enc.n_vocab, ("tiktoken", enc_name),
                      {"tokenizer": f"tiktoken:{enc_name}", "eot_token": enc.eot_token},
                      choose_dtype(enc.n_vocab, dtype))


def note_line_ends(found, n_files):
    """Say it when the text carries a byte-order mark or \r (CRLF) line ends, which --newlines=keep
    tokenizes as characters (a char model then samples carriage returns), and how to convert."""
    what = [f"{len(found[k])} of {n_files} file(s) {text}" for k, text in
            (("bom", "start with a UTF-8 byte-order mark"), ("cr", "hold \\r (CRLF line ends)")) if found.get(k)]
    if what:
        print(f"note: {' and '.join(what)} (e.g. {(found['bom'] or found['cr'])[0]}); they are kept as characters "
              "(--newlines=keep, the default): pass --newlines=unix to read them as dos2unix would leave them",
              file=sys.stderr)


def _tokenize(args, files, vocab, out):
    """Tokenize every file into out and commit it; returns meta.json's content."""
    total = vocab.total_chars
    # The split point in characters; text_pieces moves it to the nearest place that changes no token.
    held_out = args.val_fraction + args.test_fraction   # val, then test, at the end of the text
    split_at = min(total - 1, max(1, round(total * (1 - held_out))))
    add_eot = vocab.spec[0] == "tiktoken"
    workers = None
    bar = progress(total, "char", "tokenizing")
    try:
        workers = Workers(args.num_proc, vocab.spec, vocab.dtype)
        out.open()
        tasks = (((i, last, in_val, len(piece)), [(piece, add_eot and last)])
                 for i, last, in_val, piece in text_pieces(files, split_at, args.newlines))
        docs = 0
        for (i, last, in_val, n_chars), (flat, _) in workers.map(tasks):
            out.write("val" if in_val else "train", flat)
            docs += last
            bar.update(n_chars)
            bar.set_postfix(docs=f"{docs}/{len(files)}", tokens=f"{sum(out.tokens.values()):,}", refresh=False)
        bar.close()
        meta = {"vocab_size": vocab.size, "dtype": vocab.dtype, **vocab.meta,
                "train_tokens": out.tokens["train"], "val_tokens": out.tokens["val"], "documents": len(files),
                "source": args.input or [args.url], "val_fraction": args.val_fraction,
                **({"test_fraction": args.test_fraction} if args.test_fraction else {}),
                **({"newlines": "unix"} if args.newlines == "unix" else {})}
        meta = out.commit(meta, test_share(args.val_fraction, args.test_fraction))
    except KeyboardInterrupt:  # local text is quick to redo: nothing half-written stays
        bar.close()
        out.discard()
        print("\ninterrupted; nothing was kept", file=sys.stderr)
        sys.exit(130)
    except BaseException:
        bar.close()
        out.discard()
        raise
    finally:
        bar.close()
        if workers is not None:
            workers.close()
    return meta


def main(description, argv=None, *, out_dir, tokenizer="gpt2", val_fraction=0.1, url=None,
         download_name="input.txt"):
    """Tokenize local text files (or, when url is given and --input is not, a downloaded one) into out_dir."""
    args = _parser(description, out_dir, tokenizer, val_fraction, url).parse_args(argv)
    try:
        enc_name, files = _check_args(args, url)
    except InputError as e:
        fail(str(e))
    created = check_out_dir(args.out_dir)
    try:
        if files is None:
            files = [download(args.url, os.path.join(args.out_dir, download_name))]
        vocab = _vocabulary(files, enc_name, args.dtype, args.test_fraction, args.newlines)
    except InputError as e:
        Output(args.out_dir, "uint16", created_dir=created).discard()
        fail(str(e))
    out = Output(args.out_dir, vocab.dtype, created_dir=created)
    try:
        meta = _tokenize(args, files, vocab, out)
    except OSError as e:  # a full or read-only disk while writing: nothing partial stays
        out.discard()
        fail(write_failure(args.out_dir, e) + " (nothing partial was left)")
    except InputError as e:  # found while splitting (e.g. too few held-out tokens): nothing kept
        out.discard()
        fail(str(e))
    print(f"{vocab.total_chars:,} characters in {len(files)} file(s), {meta['tokenizer']} vocabulary of "
          f"{vocab.size}: {' / '.join(f'{n:,} {split}' for split, n in out.tokens.items())} tokens ({vocab.dtype}) "
          f"-> {args.out_dir}")
