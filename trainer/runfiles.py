"""What keeps a training run safe against kills and neighbours: the lock that keeps a second
run out of its out_dir, the signals that stop a run cleanly, the non-finite watch. The run's
records (log.jsonl, summary.json) are trainer/rundir.py's.
"""
import fcntl
import json
import os
import resource
import signal
import socket
import sys
import threading
import time

import torch

from trainer.cli import ConfigError

LOCK_NAME = "train.lock"


def peak_memory_bytes(device_type):
    """Peak CUDA memory allocated, or on CPU the process's peak resident set size."""
    if device_type == "cuda":
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


class RunLock:
    """out_dir/train.lock holding pid and host while a run is alive. A second run is refused
    with one line; a lock whose process is gone (same host) is taken over with a note."""

    def __init__(self, out_dir):
        self.path = os.path.join(out_dir, LOCK_NAME)
        self.held = False

    def acquire(self):
        """Check and take the lock as one step: an flock on out_dir itself serialises every train.py
        starting there (the kernel drops it if the process dies), and the lock file appears complete
        (written under a temporary name, then renamed), so no one ever reads a half-written lock."""
        folder = os.path.dirname(self.path) or "."
        guard = os.open(folder, os.O_RDONLY)
        tmp = self.path + ".tmp"  # one writer at a time (under the flock), so one name serves
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            if os.path.lexists(self.path):
                self._refuse_or_clear()
            with open(tmp, "w") as f:
                json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}, f)
            os.replace(tmp, self.path)
            self.held = True
        except OSError as e:  # a read-only or full folder: nothing of ours stays behind
            if os.path.isfile(tmp):
                os.remove(tmp)
            raise ConfigError(f"cannot write the lock {self.path} ({e.strerror or e}); pick a writable --out_dir "
                              "with free space") from None
        finally:
            os.close(guard)  # releases the flock

    def owner(self):
        """(pid, host) of the lock's holder, or None when there is no readable lock."""
        try:
            with open(self.path) as f:
                owner = json.load(f)
            return int(owner["pid"]), str(owner["host"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def live_owner(self, owner=None):
        """(pid, host) of a holder that may still run (alive here, or on another host), else None
        (owner: an owner() already read)."""
        owner = owner or self.owner()
        return owner if owner is not None and (owner[1] != socket.gethostname() or pid_alive(owner[0])) else None

    def refuse_if_held(self, owner=None):
        """ConfigError (one line) when a live process holds the lock (owner: an owner() already read)."""
        owner = self.live_owner(owner)
        if owner is not None:
            raise ConfigError(f"out_dir {os.path.dirname(self.path)} is in use by train.py pid {owner[0]} on "
                              f"{owner[1]} ({self.path}); wait for it to finish or pick another --out_dir")

    def _refuse_or_clear(self):
        owner = self.owner()
        self.refuse_if_held(owner)
        if owner is None:  # torn lock (killed while writing it): nobody can hold it
            print(f"note: removing unreadable lock {self.path}", file=sys.stderr)
        else:
            pid = owner[0]
            print(f"note: taking over {self.path} left by pid {pid}, which is no longer running", file=sys.stderr)
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:  # e.g. a folder named train.lock
            raise ConfigError(f"cannot remove {self.path} ({e.strerror}); move it away, then run again") from None

    def release(self):
        if self.held:
            self.held = False
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP ask the run to stop after the current step (it saves a
    checkpoint and exits 128 + signal). A second Ctrl-C exits at once, saving nothing."""
    NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}

    def __init__(self):
        self.received = 0
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in self.NAMES:
                self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.received and signum == signal.SIGINT:
            print("second interrupt: exiting now without saving", file=sys.stderr)
            os._exit(130)
        self.received = signum
        print(f"{self.NAMES[signum]}: finishing this step, then saving a checkpoint"
              + (" (Ctrl-C again to exit at once)" if signum == signal.SIGINT else ""), file=sys.stderr)

    def name_of(self, signum):
        return self.NAMES.get(signum, f"signal {signum}")

    def restore(self):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}


def all_ranks_max(value: int, dist) -> int:
    """The largest value over the ranks (e.g. 'any rank saw a signal'); identity in one process."""
    if not dist.strategy:
        return value
    t = torch.tensor(value, dtype=torch.int64, device=dist.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())


class NonFinite(Exception):
    def __init__(self, iter_num, what):
        super().__init__(f"{what} at iter {iter_num}")
        self.iter_num = iter_num


class BadStepWatch:
    """Non-finite loss or gradient norm, noticed without a per-step host sync: a device-side
    record of the first bad iteration, read at log lines and before any save. With float16
    the GradScaler skips overflowing steps by design; only a long run of them counts."""

    def __init__(self, device, fp16, patience=100):
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self.skips = torch.zeros((), dtype=torch.int64, device=device)
        self.fp16, self.patience = fp16, patience

    def update(self, iter_num, loss, grad_norm):
        bad = ~torch.isfinite(loss)
        if grad_norm is not None:
            grad_bad = ~torch.isfinite(grad_norm)
            if self.fp16:
                self.skips = (self.skips + 1) * grad_bad
                grad_bad = self.skips >= self.patience
            bad = bad | grad_bad
        self.first_bad = torch.where((self.first_bad < 0) & bad, iter_num, self.first_bad)

    def check(self, dist):
        first = all_ranks_max(int(self.first_bad.item()), dist)
        if first >= 0:
            raise NonFinite(first, "non-finite loss or gradient norm")
