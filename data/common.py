"""Shared machinery of the data/*/prepare.py scripts: text in, train.bin / val.bin / meta.json out.

Two front ends feed one tokenizing pipeline and one writer:

    text_main(...)   local .txt files or folders (data/text, data/shakespeare): char or any tiktoken
                     encoding; the last --val_fraction of the text is the validation split.
    hf_main(...)     any Hugging Face text dataset (data/openwebtext, data/fineweb): a hub name,
                     streamed, or local files (parquet / jsonl / json / csv / txt / arrow, or a
                     folder written by save_to_disk); validation is a seeded random fraction of the
                     documents or the dataset's own split; resumable after an interruption.

What every script guarantees:
- Output: token ids as little-endian uint16 (uint32 when the vocabulary needs it, or --dtype)
  in train.bin and val.bin, and meta.json with vocab_size, dtype, tokenizer (`char` with its
  `chars`, or `tiktoken:<encoding>` with its `eot_token`) and the token counts. With tiktoken,
  every document (dataset row, or input file) ends with the end-of-text token.
- Bounded memory: documents are tokenized in chunks of about a megabyte by --num_proc worker
  processes, at most a few chunks in flight, and the tokens are appended to the output files as
  they come; the corpus is never held in memory.
- Same tokens whatever --num_proc: chunks are written in input order, and a long text is cut
  only where the tokenizer would cut it anyway (see safe_cut).
- No half-written output: tokens go to train.tmp.bin / val.tmp.bin (ignored by git like any
  .bin), renamed at the end with meta.json written last; a run that stops on bad input removes
  its temporary files, an interrupted hf_main run keeps them with prepare_state.json to resume.
- Bad input (missing or empty input, unknown tokenizer, missing text field, unwritable
  --out_dir, a download that fails...) is one line on stderr naming the problem and the fix,
  and exit status 2, checked before any tokenizing where it can be.
"""
import argparse
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import urllib.request
from collections import deque
from concurrent.futures import ProcessPoolExecutor

import numpy as np

CHUNK_CHARS = 1 << 20        # text per tokenizing task: big enough to amortize IPC, small enough for RAM
CHECKPOINT_SECONDS = 30.0    # hf_main: how often a long run records where it is (for resuming)
STATE_FILE = "prepare_state.json"
TEXT_FIELD_HINT = "parquet/jsonl/json/csv/txt/arrow files, or a folder written by Dataset.save_to_disk"
LOCAL_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv",
                  ".txt": "text", ".arrow": "arrow"}


# ---------------------------------------------------------------- errors

class InputError(Exception):
    """Bad input: reported as one line on stderr, exit status 2."""


class SourceError(Exception):
    """Reading the source failed midway (network, disk): the run can be resumed."""


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def one_line(exc, limit=300):
    """An exception as `Type: first line`, for one-line error messages."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def positive_int(text):
    """argparse type for counts such as --max_tokens=5e6 (scientific notation is handy here)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != int(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 0")
    return int(value)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors, in one line with exit status 2
        fail(f"{message}; see {self.prog} --help")


# ---------------------------------------------------------------- tokenizers and dtypes

def choose_dtype(vocab_size, requested="auto"):
    """uint16 when every id fits (vocab_size <= 65536), else uint32; `requested` forces one."""
    need = "uint16" if vocab_size <= 1 << 16 else "uint32"
    if requested == "auto":
        return need
    if requested not in ("uint16", "uint32"):
        raise InputError(f"--dtype={requested}; choose auto, uint16 or uint32")
    if requested == "uint16" and need == "uint32":
        raise InputError(f"--dtype=uint16 cannot hold a vocabulary of {vocab_size} tokens; use --dtype=uint32 or auto")
    return requested


def tiktoken_name(tokenizer):
    """'gpt2' or 'tiktoken:gpt2' -> 'gpt2'; None for 'char'. Raises InputError for unknown names."""
    if tokenizer == "char":
        return None
    import tiktoken
    name = tokenizer[len("tiktoken:"):] if tokenizer.startswith("tiktoken:") else tokenizer
    if name not in tiktoken.list_encoding_names():
        raise InputError(f"unknown tokenizer {tokenizer!r}; choose char or a tiktoken encoding: "
                         f"{', '.join(tiktoken.list_encoding_names())}")
    return name


def load_encoding(name):
    """tiktoken's encoding, or InputError when it is neither cached nor downloadable."""
    import tiktoken
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # requests' errors, a bad cache file...: all mean "cannot get the vocabulary"
        raise InputError(f"cannot load the tiktoken encoding {name!r} ({one_line(e)}); connect to the internet once, "
                         f"or set TIKTOKEN_CACHE_DIR to a folder that holds it") from None


# Worker-side state: set once per process by _init_worker (in the main process when num_proc=1).
_ENCODER = None   # tiktoken Encoding, or None for char
_EOT = None
_LUT = None       # char: code point -> id
_DTYPE = None


def _init_worker(spec, dtype):
    """spec: ('tiktoken', name) or ('char', chars). Workers ignore Ctrl-C: the main process handles it."""
    global _ENCODER, _EOT, _LUT, _DTYPE
    if multiprocessing.parent_process() is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _DTYPE = np.dtype(dtype)
    kind, arg = spec
    if kind == "tiktoken":
        _ENCODER = load_encoding(arg)
        _EOT = _ENCODER.eot_token
    else:
        _ENCODER, _EOT = None, None
        # A code point -> id table: one vectorized lookup per piece instead of a dict lookup per character.
        codes = np.array([ord(c) for c in arg], dtype=np.int64)
        _LUT = np.zeros(int(codes.max()) + 1, dtype=_DTYPE)
        _LUT[codes] = np.arange(len(arg), dtype=_DTYPE)


def _encode_pieces(pieces):
    """[(text, eot)] -> (all ids concatenated, ids per piece); eot=True appends the end-of-text token."""
    if _ENCODER is None:  # char: no end-of-text token
        arrays = [_LUT[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)] for text, _ in pieces]
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=_DTYPE)
        return flat, np.array([len(a) for a in arrays], dtype=np.int64)
    # One Python list for the whole task, converted once: many small arrays cost more than the encoding.
    flat, lengths = [], []
    for text, eot in pieces:
        ids = _ENCODER.encode_ordinary(text)
        flat += ids
        if eot:
            flat.append(_EOT)
        lengths.append(len(ids) + bool(eot))
    return np.array(flat, dtype=_DTYPE), np.array(lengths, dtype=np.int64)


class Workers:
    """An ordered, bounded parallel map: at most `window` tasks in flight, results in input order.

    multiprocessing's imap would read the whole input ahead of the workers (unbounded memory);
    here the producer is only advanced when a slot frees up. A worker that dies (killed for
    memory, say) raises BrokenProcessPool here instead of hanging, as multiprocessing.Pool would."""

    def __init__(self, num_proc, spec, dtype):
        self.pool = None
        self.window = 2 * num_proc + 1
        if num_proc > 1:
            # spawn: a clean interpreter per worker on every OS (no forked dataset threads or locks)
            self.pool = ProcessPoolExecutor(num_proc, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_init_worker, initargs=(spec, dtype))
        else:
            _init_worker(spec, dtype)

    def map(self, tasks):
        """tasks yields (meta, pieces); yields (meta, (flat, lengths)) in the same order."""
        if self.pool is None:
            for meta, pieces in tasks:
                yield meta, _encode_pieces(pieces)
            return
        pending = deque()
        for meta, pieces in tasks:
            pending.append((meta, self.pool.submit(_encode_pieces, pieces)))
            if len(pending) >= self.window:
                meta0, future = pending.popleft()
                yield meta0, future.result()
        while pending:
            meta0, future = pending.popleft()
            yield meta0, future.result()

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)  # running tasks are short: let them end
            self.pool = None


# ---------------------------------------------------------------- output

def check_out_dir(out_dir):
    """Create out_dir if needed and prove it is writable. Returns whether it was created."""
    existed = os.path.isdir(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        fail(f"cannot write to --out_dir {out_dir} ({e.strerror or e}); pick a folder you can write to")
    return not existed


class Output:
    """train.bin / val.bin written under temporary names, renamed together by commit()."""

    SPLITS = ("train", "val")

    def __init__(self, out_dir, dtype, created_dir=False):
        self.out_dir, self.dtype, self.created_dir = out_dir, np.dtype(dtype), created_dir
        self.tmp = {s: os.path.join(out_dir, f"{s}.tmp.bin") for s in self.SPLITS}
        self.state_path = os.path.join(out_dir, STATE_FILE)
        self.files, self.tokens = {}, {s: 0 for s in self.SPLITS}

    def open(self, resume_tokens=None):
        """Start empty files, or reopen the temporary files of an interrupted run at the recorded lengths
        (anything written after its last checkpoint is cut off)."""
        for s in self.SPLITS:
            if resume_tokens is None:
                self.files[s] = open(self.tmp[s], "wb")
            else:
                self.files[s] = open(self.tmp[s], "r+b")
                self.files[s].truncate(resume_tokens[s] * self.dtype.itemsize)
                self.files[s].seek(0, os.SEEK_END)
                self.tokens[s] = resume_tokens[s]

    def can_resume(self, tokens):
        return all(os.path.isfile(self.tmp[s]) and
                   os.path.getsize(self.tmp[s]) >= tokens[s] * self.dtype.itemsize for s in self.SPLITS)

    def write(self, split, ids):
        if len(ids):
            ids.astype(self.dtype, copy=False).tofile(self.files[split])
            self.tokens[split] += len(ids)

    def move_tail_to_val(self, n):
        """Move the last n train tokens to val (used when the random val draw picked no document)."""
        f = self.files["train"]
        f.flush()
        keep = self.tokens["train"] - n
        tail = np.fromfile(self.tmp["train"], dtype=self.dtype, offset=keep * self.dtype.itemsize)
        f.truncate(keep * self.dtype.itemsize)
        f.seek(0, os.SEEK_END)
        self.tokens["train"] = keep
        self.write("val", tail)

    def sync(self):
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())

    def save_state(self, state):
        self.sync()
        write_json_atomic(self.state_path, state)

    def load_state(self):
        try:
            with open(self.state_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def close(self):
        for f in self.files.values():
            f.close()
        self.files = {}

    def commit(self, meta):
        """Rename the temporary files into place. The old meta.json goes first and the new one comes
        last, so a crash in between leaves no meta.json (train.py refuses) rather than a mismatch."""
        self.sync()
        self.close()
        meta_path = os.path.join(self.out_dir, "meta.json")
        if os.path.exists(meta_path):
            os.remove(meta_path)
        for s in self.SPLITS:
            os.replace(self.tmp[s], os.path.join(self.out_dir, f"{s}.bin"))
        write_json_atomic(meta_path, meta)
        if os.path.exists(self.state_path):
            os.remove(self.state_path)

    def discard(self):
        """Remove every temporary file (and out_dir itself if this run created it and it is empty)."""
        self.close()
        for path in (*self.tmp.values(), self.state_path):
            if os.path.exists(path):
                os.remove(path)
        if self.created_dir:
            try:
                os.rmdir(self.out_dir)
            except OSError:
                pass


def write_json_atomic(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1 if "chars" not in obj else None)
    os.replace(tmp, path)


def progress(total, unit, desc):
    from tqdm import tqdm
    return tqdm(total=total, unit=unit, unit_scale=True, desc=desc, dynamic_ncols=True,
                mininterval=0.5, smoothing=0.1)


# ---------------------------------------------------------------- local text files

def safe_cut(text, start=0, end=None, forward=False):
    """A position in text[start:end] where splitting changes no token, or -1.

    GPT-2-style pre-tokenizers (gpt2, r50k, p50k, cl100k, o200k) never join across a newline that
    has a non-space character on each side: the newline ends its own piece. Failing that (one
    giant line), a space between two letters starts the next word's piece (' word'). With
    forward=True the first such position is returned, else the last."""
    end = len(text) if end is None else end

    def ok_newline(p):  # cut after text[p] == "\n"
        return 0 < p < len(text) - 1 and not text[p - 1].isspace() and not text[p + 1].isspace()

    def ok_space(p):  # cut before text[p] == " "
        return 0 < p < len(text) - 1 and text[p - 1].isalpha() and text[p + 1].isalpha()

    for ch, ok, shift in (("\n", ok_newline, 1), (" ", ok_space, 0)):
        if forward:
            p = text.find(ch, start, end)
            while p != -1 and not ok(p):
                p = text.find(ch, p + 1, end)
        else:
            p = text.rfind(ch, start, end)
            while p != -1 and not ok(p):
                p = text.rfind(ch, start, p)
        if p != -1 and start < p + shift < end:
            return p + shift
    return -1


def list_text_files(paths):
    """Expand folders into their .txt files (sorted, recursive); InputError on a missing path."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names if f.endswith(".txt"))
            if not found:
                raise InputError(f"folder {path} holds no .txt files; pass text files or a folder of them with --input")
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise InputError(f"--input {path} does not exist; pass text files or folders")
    return files


def scan_text_files(files, want_chars):
    """One fast pass before any work: every file is UTF-8, the total is not empty, and (for char) the
    sorted character set. Returns (total characters, chars or None)."""
    total, chars = 0, set()
    for path in files:
        try:
            with open(path, encoding="utf-8", newline="") as f:
                while True:
                    block = f.read(CHUNK_CHARS * 8)
                    if not block:
                        break
                    total += len(block)
                    if want_chars:
                        chars.update(block)
        except UnicodeDecodeError as e:
            raise InputError(f"{path} is not UTF-8 text ({e.reason}: byte {e.object[e.start]:#04x}); "
                             f"convert it to UTF-8, e.g. iconv -f latin1 -t utf-8 FILE") from None
        except OSError as e:
            raise InputError(f"cannot read {path} ({e.strerror}); check the path and its permissions") from None
    if total == 0:
        raise InputError("the input is empty; pass text files with some text in them")
    return total, sorted(chars) if want_chars else None


def text_pieces(files, split_at):
    """Yield (file index, last piece of the file?, in val?, text): pieces of about CHUNK_CHARS cut at safe
    places, and the piece holding character `split_at` (counted across all files) cut near it, so that
    everything from there on is the validation split. An empty file yields one empty last piece."""
    offset, in_val = 0, False
    for i, path in enumerate(files):
        with open(path, encoding="utf-8", newline="") as f:  # newline="": keep \r\n, tokenize the exact text
            carry, eof = "", False
            while not eof:
                block = f.read(CHUNK_CHARS)
                buf, eof = carry + block, not block
                if eof:
                    piece, carry = buf, ""
                else:
                    cut = safe_cut(buf, len(buf) // 2)
                    if cut == -1:  # no safe place in the second half: read on
                        carry = buf
                        continue
                    piece, carry = buf[:cut], buf[cut:]
                if not in_val and offset <= split_at < offset + len(piece):
                    local = split_at - offset
                    cut = safe_cut(piece, local, forward=True) if local else 0
                    cut = cut if cut != -1 else safe_cut(piece, 0, local)
                    cut = cut if cut != -1 else local  # no safe place at all: cut there anyway
                    if cut:
                        yield i, False, False, piece[:cut]
                        offset, piece = offset + cut, piece[cut:]
                    in_val = True
                yield i, eof, in_val, piece
                offset += len(piece)


def _add_output_args(ap, out_dir):
    """The options every prepare script shares: where to write, id width, processes."""
    ap.add_argument("--out_dir", default=out_dir, help="where to write train.bin, val.bin, meta.json")
    ap.add_argument("--dtype", default="auto", choices=("auto", "uint16", "uint32"),
                    help="token id width; auto = uint16 when the vocabulary fits")
    ap.add_argument("--num_proc", type=int, default=default_num_proc(), help="tokenizing processes (default %(default)s)")


def text_main(description, argv=None, *, out_dir, tokenizer="gpt2", val_fraction=0.1, url=None,
              download_name="input.txt"):
    """Tokenize local text files (or, when url is given and --input is not, a downloaded one) into out_dir."""
    ap = Parser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if url is None:
        ap.add_argument("--input", nargs="+", metavar="PATH",
                        help="text files and/or folders (every .txt inside, sorted); each file is one document")
    else:
        ap.add_argument("--input", nargs=1, metavar="PATH", help="a local copy of the text (default: download it)")
        ap.add_argument("--url", default=url, help="where to download the text from (default %(default)s)")
    ap.add_argument("--tokenizer", default=tokenizer,
                    help="char, or a tiktoken encoding: gpt2, r50k_base, cl100k_base, o200k_base... (default %(default)s)")
    ap.add_argument("--val_fraction", type=float, default=val_fraction,
                    help="the last this fraction of the text is the validation split (default %(default)s)")
    _add_output_args(ap, out_dir)
    args = ap.parse_args(argv)

    try:
        if url is None and not args.input:
            raise InputError("no input; pass text files or folders with --input PATH [PATH ...]")
        if not 0 < args.val_fraction < 1:
            raise InputError(f"--val_fraction={args.val_fraction} must be between 0 and 1 (e.g. 0.1)")
        if args.num_proc < 1:
            raise InputError(f"--num_proc={args.num_proc} must be at least 1")
        enc_name = tiktoken_name(args.tokenizer)
        files = list_text_files(args.input) if args.input else None
    except InputError as e:
        fail(str(e))
    out = Output(args.out_dir, "uint16", created_dir=check_out_dir(args.out_dir))
    try:
        if files is None:
            files = [download(args.url, os.path.join(args.out_dir, download_name))]
        total, chars = scan_text_files(files, want_chars=enc_name is None)
        if total < 2:
            raise InputError("the input holds a single character, too little to split into train and val")
        if enc_name is None:
            vocab_size, spec, tok_meta = len(chars), ("char", chars), {"tokenizer": "char", "chars": chars}
        else:
            enc = load_encoding(enc_name)
            vocab_size, spec = enc.n_vocab, ("tiktoken", enc_name)
            tok_meta = {"tokenizer": f"tiktoken:{enc_name}", "eot_token": enc.eot_token}
        dtype = choose_dtype(vocab_size, args.dtype)
    except InputError as e:
        out.discard()
        fail(str(e))
    out = Output(args.out_dir, dtype, created_dir=out.created_dir)

    # The split point in characters; text_pieces moves it to the nearest place that changes no token.
    split_at = min(total - 1, max(1, round(total * (1 - args.val_fraction))))
    add_eot = enc_name is not None
    workers = None
    bar = progress(total, "char", "tokenizing")
    try:
        workers = Workers(args.num_proc, spec, dtype)
        out.open()
        tasks = (((i, last, in_val, len(piece)), [(piece, add_eot and last)])
                 for i, last, in_val, piece in text_pieces(files, split_at))
        docs = 0
        for (i, last, in_val, n_chars), (flat, _) in workers.map(tasks):
            out.write("val" if in_val else "train", flat)
            docs += last
            bar.update(n_chars)
            bar.set_postfix(docs=f"{docs}/{len(files)}", tokens=f"{sum(out.tokens.values()):,}", refresh=False)
        bar.close()
        meta = {"vocab_size": vocab_size, "dtype": dtype, **tok_meta,
                "train_tokens": out.tokens["train"], "val_tokens": out.tokens["val"], "documents": len(files),
                "source": args.input or [args.url], "val_fraction": args.val_fraction}
        out.commit(meta)
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
    print(f"{total:,} characters in {len(files)} file(s), {meta['tokenizer']} vocabulary of {vocab_size}: "
          f"{out.tokens['train']:,} train / {out.tokens['val']:,} val tokens ({dtype}) -> {args.out_dir}")


def download(url, path):
    """Fetch url to path (kept, so the next run reuses it); InputError naming --input when offline."""
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        return path
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            data = r.read()
    except (OSError, ValueError) as e:  # URLError, timeouts, bad URLs
        raise InputError(f"download of {url} failed ({one_line(e)}); pass a local copy with --input PATH") from None
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    except OSError as e:
        raise InputError(f"cannot write {path} ({e.strerror}); pick a writable --out_dir") from None
    return path


def default_num_proc():
    return max(1, min(8, os.cpu_count() or 1))


# ---------------------------------------------------------------- Hugging Face datasets

def _local_source(path, split):
    """A local path as a streaming IterableDataset: save_to_disk folders, or data files read in place
    (streaming=True reads them directly, without converting them into the datasets cache)."""
    import datasets
    if os.path.isdir(path) and any(os.path.exists(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json")):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise InputError(f"{path} has splits {', '.join(ds)}, not {split!r}; pick one with --split")
            ds = ds[split]
        return ds.to_iterable_dataset()
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    kinds = {}
    for f in files:
        ext = os.path.splitext(f[:-3] if f.endswith(".gz") else f)[1].lower()
        if ext in LOCAL_BUILDERS:
            kinds.setdefault(LOCAL_BUILDERS[ext], []).append(f)
    if len(kinds) != 1:
        found = "none" if not kinds else ", ".join(sorted(kinds))
        raise InputError(f"{path}: need data files of one kind ({TEXT_FIELD_HINT}), found {found}")
    if split != "train":
        raise InputError(f"local data files form a single split; drop --split/--val_split {split!r} "
                         f"(validation is then drawn with --val_fraction), or use a save_to_disk folder with splits")
    builder, data_files = next(iter(kinds.items()))
    if all(os.path.getsize(f) == 0 for f in data_files):
        raise InputError(f"{path} holds no documents; pass files with data in them")
    # A .txt file is one document (not one per line, the text builder's default).
    extra = {"sample_by": "document"} if builder == "text" else {}
    return datasets.load_dataset(builder, data_files=data_files, split="train", streaming=True, **extra)


def open_source(args, split, local):
    """The dataset split as a streaming IterableDataset with the text field checked; InputError otherwise."""
    # datasets' IterableDataset imports torch when it is installed (~200 MB more per process), only to
    # share its epoch counter with torch DataLoader workers, which this script does not use.
    os.environ.setdefault("USE_TORCH", "0")
    try:
        import datasets
    except ImportError:
        raise InputError("the Hugging Face datasets package is missing; pip install datasets") from None
    where = args.input or args.dataset
    try:
        if local:
            ds = _local_source(where, split)
        else:
            kw = dict(name=args.name, split=split, streaming=args.streaming, revision=args.revision)
            ds = datasets.load_dataset(where, **kw, **({} if args.streaming else {"num_proc": args.num_proc}))
            if not args.streaming:
                ds = ds.to_iterable_dataset()
    except InputError:
        raise
    except Exception as e:  # offline, unknown name or split, scripts no longer supported...: one line each
        if local:
            raise InputError(f"cannot read {where} ({one_line(e)}); pass {TEXT_FIELD_HINT}") from None
        hint = ("; the hub copy still uses a loading script: try --revision=refs/convert/parquet"
                if "scripts are no longer supported" in str(e) else "")
        raise InputError(f"cannot load {where!r} (config {args.name}, split {split}) from the Hugging Face Hub "
                         f"({one_line(e)}){hint}; check --dataset/--name/--split and the connection, "
                         f"or pass a local copy with --input PATH ({TEXT_FIELD_HINT})") from None
    features = ds.features
    if features is None:  # some streaming builders only know their columns after the first row
        try:
            first = next(iter(ds.take(1)), None)
        except Exception as e:
            raise InputError(f"cannot read {where} ({one_line(e)}); pass {TEXT_FIELD_HINT}") from None
        if first is None:
            raise InputError(f"{where} (split {split}) holds no documents")
        columns = list(first)
    else:
        columns = list(features)
    if args.text_field not in columns:
        raise InputError(f"{where} (split {split}) has no field {args.text_field!r}; its fields are "
                         f"{', '.join(columns)}: pass the one holding the text with --text_field=NAME")
    if features is not None:
        kind = getattr(features[args.text_field], "dtype", None)
        if kind not in ("string", "large_string"):
            raise InputError(f"field {args.text_field!r} of {where} holds {features[args.text_field]}, not text; "
                             f"pass the one holding the text with --text_field=NAME (fields: {', '.join(columns)})")
    return ds.select_columns([args.text_field])  # decode only the text


def hf_tasks(ds, field, first_doc, route, rng, val_fraction, local):
    """Yield (meta, [(text, True)...]) tasks of about CHUNK_CHARS, reading the dataset in order.

    meta records where the dataset stands after the task (for resuming), the document numbers and
    which documents go to val (drawn here, in document order, so that the draw does not depend on
    task sizes or --num_proc)."""
    pieces, chars, doc = [], 0, first_doc
    batches = ds.iter(batch_size=64)
    while True:
        try:
            batch = next(batches, None)
        except Exception as e:  # a broken local file is bad input; network trouble midway is resumable
            msg = f"reading the dataset failed at document {doc} ({one_line(e)})"
            raise (InputError(f"{msg}; fix or remove that file") if local else SourceError(msg)) from None
        if batch is not None:
            for text in batch[field]:
                if not isinstance(text, str):
                    raise InputError(f"document {doc} has {field} = {str(text)[:40]!r} ({type(text).__name__}), "
                                     f"not text; clean the dataset or pick another --text_field")
                pieces.append((text, True))
                chars += len(text)
                doc += 1
        if pieces and (chars >= CHUNK_CHARS or batch is None):
            to_val = (rng.random(len(pieces)) < val_fraction) if route == "fraction" else \
                np.full(len(pieces), route == "val")
            yield {"end_doc": doc, "to_val": to_val, "ds_state": ds.state_dict(),
                   "rng": rng.bit_generator.state}, pieces
            pieces, chars = [], 0
        if batch is None:
            return


def hf_main(description, argv=None, *, dataset, out_dir, name=None, split="train", val_split=None,
            val_fraction=0.0005, text_field="text", tokenizer="gpt2", max_tokens=0):
    """Tokenize a Hugging Face dataset (hub name or local files) into out_dir; see the module docstring."""
    ap = Parser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", metavar="PATH",
                    help=f"a local copy instead of the hub: {TEXT_FIELD_HINT}")
    ap.add_argument("--dataset", default=dataset, help="Hugging Face dataset name, or a local path (default %(default)s)")
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
    _add_output_args(ap, out_dir)
    args = ap.parse_args(argv)

    local = args.input is not None or os.path.exists(args.dataset)
    try:
        if args.input is not None and not os.path.exists(args.input):
            raise InputError(f"--input {args.input} does not exist; pass {TEXT_FIELD_HINT}")
        if args.val_split is None and not 0 < args.val_fraction < 1:
            raise InputError(f"--val_fraction={args.val_fraction} must be between 0 and 1 (e.g. 0.0005)")
        if not local and (args.dataset.startswith((".", "/", "~")) or
                          os.path.splitext(args.dataset)[1].lower() in LOCAL_BUILDERS):
            raise InputError(f"--dataset {args.dataset} does not exist; pass an existing path or a hub dataset name")
        if args.num_proc < 1:
            raise InputError(f"--num_proc={args.num_proc} must be at least 1")
        enc_name = tiktoken_name(args.tokenizer)
        if enc_name is None:
            raise InputError("--tokenizer=char needs the whole corpus's character set; use data/text/prepare.py "
                             "for character-level data, or a tiktoken encoding here")
        enc = load_encoding(enc_name)
        dtype = choose_dtype(enc.n_vocab, args.dtype)
    except InputError as e:
        fail(str(e))
    out = Output(args.out_dir, dtype, created_dir=check_out_dir(args.out_dir))
    try:
        sources = [("fraction" if args.val_split is None else "train", open_source(args, args.split, local))]
        if args.val_split is not None:
            sources.append(("val", open_source(args, args.val_split, local)))
    except InputError as e:
        out.discard()
        fail(str(e))

    # What decides the output: a saved state from a run with other settings is not resumed.
    signature = {k: getattr(args, k) for k in ("input", "dataset", "name", "split", "val_split", "val_fraction",
                                               "seed", "text_field", "revision", "max_tokens")}
    signature.update(tokenizer=enc_name, dtype=dtype)
    rng = np.random.default_rng(args.seed)
    st = {"source": 0, "ds_state": None, "docs": 0, "source_tokens": 0, "train_docs": 0, "last_train_len": 0}
    saved = out.load_state()
    if saved and saved.get("signature") == signature and out.can_resume(saved["tokens"]):
        st.update({k: saved[k] for k in st})
        rng.bit_generator.state = saved["rng"]
        out.open(resume_tokens=saved["tokens"])
        print(f"resuming an interrupted run at document {st['docs']:,} of split "
              f"{args.split if st['source'] == 0 else args.val_split} ({sum(out.tokens.values()):,} tokens written)",
              file=sys.stderr)
    else:
        if saved:
            print("a saved state from a run with other settings was found: starting over", file=sys.stderr)
        out.open()
    last_good = None  # the state after the last task whose tokens are all written (what a resume restarts from)

    def checkpoint():
        if last_good is not None:
            out.save_state({**last_good, "signature": signature})

    workers = None
    bar = progress(args.max_tokens * len(sources) or None, "tok", "tokenizing")
    try:
        workers = Workers(args.num_proc, ("tiktoken", enc_name), dtype)
        bar.update(sum(out.tokens.values()))
        last_save = time.time()
        for si in range(st["source"], len(sources)):
            route, ds = sources[si]
            if si > st["source"]:
                st.update(docs=0, source_tokens=0, ds_state=None)
            if st["ds_state"] is not None:
                ds.load_state_dict(st["ds_state"])
            done = args.max_tokens and st["source_tokens"] >= args.max_tokens
            tasks = hf_tasks(ds, args.text_field, st["docs"], route, rng, args.val_fraction, local)
            for task, (flat, lengths) in ([] if done else workers.map(tasks)):
                to_val = task["to_val"]
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
                last_good = {**st, "rng": task["rng"], "tokens": dict(out.tokens)}  # a consistent point
                bar.update(int(flat.size))
                bar.set_postfix(docs=f"{st['docs']:,}", train=f"{out.tokens['train']:,}",
                                val=f"{out.tokens['val']:,}", refresh=False)
                if done:
                    break
                if time.time() - last_save >= CHECKPOINT_SECONDS:
                    checkpoint()
                    last_save = time.time()
            last_good = None if si + 1 == len(sources) else {
                **st, "source": si + 1, "docs": 0, "source_tokens": 0, "ds_state": None,
                "rng": rng.bit_generator.state, "tokens": dict(out.tokens)}
        bar.close()
        if out.tokens["train"] + out.tokens["val"] == 0:
            raise InputError(f"{args.input or args.dataset} holds no documents")
        if out.tokens["val"] == 0:
            if args.val_split is not None:
                raise InputError(f"split {args.val_split!r} holds no documents; pick another --val_split")
            if st["train_docs"] < 2:
                raise InputError("the dataset holds a single document: too few to split off validation; "
                                 "add documents, or use data/text/prepare.py, which splits inside a text")
            # The seeded draw picked no document (a small slice): the last one becomes the validation split.
            print(f"--val_fraction={args.val_fraction} drew no document from {st['train_docs']:,}; "
                  f"the last document is the validation split", file=sys.stderr)
            out.move_tail_to_val(st["last_train_len"])
        meta = {"vocab_size": enc.n_vocab, "dtype": dtype, "tokenizer": f"tiktoken:{enc_name}",
                "eot_token": enc.eot_token, "train_tokens": out.tokens["train"], "val_tokens": out.tokens["val"],
                "source": args.input or args.dataset, "name": args.name, "split": args.split,
                "val_split": args.val_split, "val_fraction": None if args.val_split else args.val_fraction,
                "seed": args.seed, "text_field": args.text_field, "max_tokens": args.max_tokens}
        out.commit(meta)
    except InputError as e:  # bad data found midway: nothing to resume, leave nothing behind
        bar.close()
        out.discard()
        fail(str(e))
    except (KeyboardInterrupt, SourceError) as e:
        bar.close()
        checkpoint()
        if os.path.exists(out.state_path):
            out.close()
            kept = sum(out.load_state()["tokens"].values())
            how = f"run the same command again to resume ({kept:,} tokens are kept)"
        else:
            out.discard()
            how = "nothing was kept"
        if isinstance(e, KeyboardInterrupt):
            print(f"\ninterrupted; {how}", file=sys.stderr)
            sys.exit(130)
        print(f"error: {e}; {how}", file=sys.stderr)
        sys.exit(1)
    except BaseException:  # a bug: keep what can be resumed, show the traceback
        bar.close()
        checkpoint()
        out.close()
        raise
    finally:
        bar.close()
        if workers is not None:
            workers.close()
    print(f"{args.input or args.dataset}: {out.tokens['train']:,} train / {out.tokens['val']:,} val tokens "
          f"({dtype}, {enc_name}) -> {args.out_dir}")
