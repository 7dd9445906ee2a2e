"""Text to token ids: tokenizer names, id widths, and the ordered, bounded pool of tokenizing processes.

A tokenizer is `char` (ids index a sorted character list) or a tiktoken encoding. Work reaches the
pool as tasks of about CHUNK_CHARS characters; the ids come back in input order, whatever --num_proc.
"""
import multiprocessing
import os
import signal
import sys
from collections import deque
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from .errors import InputError, one_line

CHUNK_CHARS = 1 << 20  # text per tokenizing task: big enough to amortize IPC, small enough for RAM


def choose_dtype(vocab_size, requested="auto"):
    """uint16 when every id fits (vocab_size <= 65536), else uint32; `requested` forces one."""
    need = "uint16" if vocab_size <= 1 << 16 else "uint32"
    if requested == "auto":
        return need
    if requested not in ("uint16", "uint32"):
        raise InputError(f"--dtype={requested}; choose auto, uint16 or uint32")
    if requested == "uint16" and need == "uint32":
        raise InputError(f"--dtype=uint16 cannot hold a vocabulary of {vocab_size} tokens; "
                         f"use --dtype=uint32 or auto")
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
        raise InputError(f"cannot load the tiktoken encoding {name!r} ({one_line(e)}); connect to the internet "
                         f"once, or set TIKTOKEN_CACHE_DIR to a folder that holds it") from None


# Worker-side state: set once per process by _init_worker (in the main process when num_proc=1).
_ENCODER = None   # tiktoken Encoding, or None for char
_EOT = None
_LUT = None       # char: code point -> id
_DTYPE = None


def die_with_parent(parent_pid):
    """Linux: the kernel kills this worker when its parent dies (kill -9 included), so no worker
    is left orphaned; elsewhere nothing (the pool's own shutdown handles normal exits)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _init_worker(spec, dtype):
    """spec: ('tiktoken', name) or ('char', chars). Workers ignore Ctrl-C: the main process handles it."""
    global _ENCODER, _EOT, _LUT, _DTYPE
    if multiprocessing.parent_process() is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_parent(multiprocessing.parent_process().pid)
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
