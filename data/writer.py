"""The output folder: train.bin / val.bin written under temporary names, meta.json last, resume state.

Nothing half-written is ever named train.bin: tokens go to train.tmp.bin / val.tmp.bin (ignored by
git like any .bin) and are renamed together by Output.commit, with meta.json written last.
"""
import json
import os
import shutil
import tempfile

import numpy as np

from .errors import InputError, fail

STATE_FILE = "prepare_state.json"  # where an interrupted Hugging Face run records how far it got


def write_failure(out_dir, e):
    """The one line for an OSError while writing out_dir's files."""
    folder = out_dir if os.path.isdir(out_dir) else os.path.dirname(os.path.abspath(out_dir))
    free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
    return (f"cannot write to {out_dir} ({e.strerror or e}; {free / 2**20:,.0f} MiB free there); free space or pick "
            "another --out_dir")


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


def write_json_atomic(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1 if "chars" not in obj else None)  # a char list one per line is unreadable
    os.replace(tmp, path)


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

    def _take_tail(self, split, n):
        """Cut the last n tokens off split's temporary file and return them."""
        f = self.files[split]
        f.flush()
        keep = self.tokens[split] - n
        tail = np.fromfile(self.tmp[split], dtype=self.dtype, offset=keep * self.dtype.itemsize)
        f.truncate(keep * self.dtype.itemsize)
        f.seek(0, os.SEEK_END)
        self.tokens[split] = keep
        return tail

    def move_tail_to_val(self, n):
        """Move the last n train tokens to val (used when the random val draw picked no document)."""
        self.write("val", self._take_tail("train", n))

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

    def split_off_test(self, share):
        """Move the last `share` of the val tokens into test.tmp.bin (the held-out split that a study
        reports on, never used to select); returns how many. A token-stream cut: with documents,
        the one at the boundary is split between val and test."""
        n = round(self.tokens["val"] * share)
        if not 0 < n < self.tokens["val"]:  # an empty test.bin (or val.bin) would be written and read as a split
            fix = "a larger --test_fraction (0: no test split)" if n == 0 else "a larger --val_fraction"
            raise InputError(f"the held-out text is {self.tokens['val']} token(s): test.bin would get {n} and "
                             f"val.bin {self.tokens['val'] - n}; give more text, or {fix}")
        tail = self._take_tail("val", n)
        self.tmp["test"] = os.path.join(self.out_dir, "test.tmp.bin")
        tail.tofile(self.tmp["test"])
        self.tokens["test"] = n
        return n

    def commit(self, meta, test_share=0.0):
        """Rename the temporary files into place (with test_share > 0 the val tail becomes test.bin,
        else an older test.bin goes, as it belongs to other files). The old meta.json goes first and
        the new one comes last, so a crash in between leaves no meta.json (train.py refuses) rather
        than a mismatch."""
        if test_share > 0:
            meta = {**meta, "test_tokens": self.split_off_test(test_share)}
            meta["val_tokens"] = self.tokens["val"]
        self.sync()
        self.close()
        meta_path = os.path.join(self.out_dir, "meta.json")
        if os.path.exists(meta_path):
            os.remove(meta_path)
        for s in self.tmp:
            os.replace(self.tmp[s], os.path.join(self.out_dir, f"{s}.bin"))
        if "test" not in self.tmp and os.path.exists(os.path.join(self.out_dir, "test.bin")):
            os.remove(os.path.join(self.out_dir, "test.bin"))
        write_json_atomic(meta_path, meta)
        if os.path.exists(self.state_path):
            os.remove(self.state_path)
        return meta

    def discard(self):
        """Remove every temporary file (and out_dir itself if this run created it and it is empty)."""
        self.close()
        for path in (*self.tmp.values(), os.path.join(self.out_dir, "test.tmp.bin"), self.state_path):
            if os.path.exists(path):
                os.remove(path)
        if self.created_dir:
            try:
                os.rmdir(self.out_dir)
            except OSError:
                pass
