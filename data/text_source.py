"""Local text as tokenizing tasks: .txt files and folders, checked up front, cut where no token changes.

Each file is one document; the last --val_fraction of the characters (counted across files) is the
validation split, its start moved to the nearest place where cutting changes no token (safe_cut).
"""
import os
import sys
import urllib.request

from . import tokenizers  # tokenizers.CHUNK_CHARS is read at call time: tests shrink it
from .errors import InputError, one_line

MAX_CARRY = 4 << 20   # characters read on while looking for a safe cut: what bounds memory on one giant line


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


NEWLINES = ("keep", "unix")


def open_text(path, newlines="keep"):
    """keep: the exact text, a byte-order mark and \r\n included. unix: as dos2unix would leave it:
    \r\n (and a lone \r) read as \n (Python's universal newlines), a leading byte-order mark dropped."""
    if newlines == "unix":
        return open(path, encoding="utf-8-sig", newline=None)
    return open(path, encoding="utf-8", newline="")


def scan_text_files(files, want_chars, newlines="keep", found=None):
    """One fast pass before any work: every file is UTF-8, the total is not empty, and (for char) the
    sorted character set. Returns (total characters, chars or None). found, a dict if given, receives
    the files that (as read) start with a byte-order mark ("bom") and that hold a \r ("cr")."""
    total, chars = 0, set()
    found = {} if found is None else found
    found.update(bom=[], cr=[])
    for path in files:
        try:
            with open_text(path, newlines) as f:
                first = True
                while True:
                    block = f.read(tokenizers.CHUNK_CHARS * 8)
                    if not block:
                        break
                    if first and block.startswith("\ufeff"):
                        found["bom"].append(path)
                    if "\r" in block and path not in found["cr"][-1:]:
                        found["cr"].append(path)
                    first = False
                    total += len(block)
                    if "\x00" in block:  # valid UTF-8, but no text has NUL bytes: a binary file
                        raise InputError(f"{path} holds NUL bytes (a binary file, not text); pass text files")
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


def _cut_near(piece, local):
    """Where to start the validation split in piece, as near after `local` as no token changes."""
    cut = safe_cut(piece, local, forward=True) if local else 0
    cut = cut if cut != -1 else safe_cut(piece, 0, local)
    return cut if cut != -1 else local  # no safe place at all: cut there anyway


def text_pieces(files, split_at, newlines="keep"):
    """Yield (file index, last piece of the file?, in val?, text): pieces of about CHUNK_CHARS cut at safe
    places, and the piece holding character `split_at` (counted across all files) cut near it, so that
    everything from there on is the validation split. An empty file yields one empty last piece."""
    offset, in_val = 0, False
    for i, path in enumerate(files):
        with open_text(path, newlines) as f:  # keep: \r\n stays, the exact text is tokenized
            carry, eof, warned = "", False, False
            while not eof:
                block = f.read(tokenizers.CHUNK_CHARS)
                buf, eof = carry + block, not block
                if eof:
                    piece, carry = buf, ""
                else:
                    cut = safe_cut(buf, len(buf) // 2)
                    if cut == -1 and len(buf) < MAX_CARRY:  # no safe place in the second half: read on
                        carry = buf
                        continue
                    if cut == -1:  # bounded memory first: cut anyway, and say so once per file
                        cut = len(buf) // 2
                        if not warned:
                            warned = True
                            print(f"note: {path} has over {len(buf):,} characters without a newline or a space "
                                  "between words; cut inside them (the tokens at such a cut may differ from "
                                  "tokenizing it whole)", file=sys.stderr)
                    piece, carry = buf[:cut], buf[cut:]
                if not in_val and offset <= split_at < offset + len(piece):
                    cut = _cut_near(piece, split_at - offset)
                    if cut:
                        yield i, False, False, piece[:cut]
                        offset, piece = offset + cut, piece[cut:]
                    in_val = True
                yield i, eof, in_val, piece
                offset += len(piece)


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
