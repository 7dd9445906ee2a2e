"""How far long work is, in every setting: the one progress helper of the data prep and tools.eval.

On a terminal a tqdm bar. Off one (a redirected log, a pipe, a CI job) tqdm's carriage returns make
an unreadable log, and a disabled bar left tools.eval silent for 44 minutes: there, a plain line
on stderr each time the work passes another STEP_PCT percent (or, with no known total, every
PLAIN_EVERY_S seconds), and a closing line. Work that ends within QUIET_S seconds prints nothing,
so a quick run (or a one-line refusal found midway) stays as short as it was.
"""
import sys
import time

STEP_PCT = 5          # a plain line each time the work passes another 5%
PLAIN_EVERY_S = 30.0  # ... or, without a known total, every 30 s
QUIET_S = 2.0         # nothing at all for work done sooner


def progress(total, unit, desc, stream=None, leave=True):
    """A bar-like object (update(n), set_postfix(**kw), close()) for `total` units (None: unknown)."""
    stream = stream or sys.stderr
    if stream.isatty():
        from tqdm import tqdm
        return tqdm(total=total, unit=unit, unit_scale=True, desc=desc, dynamic_ncols=True, file=stream,
                    mininterval=0.5, smoothing=0.1, leave=leave)
    return PlainProgress(total, unit, desc, stream)


class PlainProgress:
    """Progress as whole lines ("tokenizing: 35% (1,234,567/3,500,000 char), 12s, eta 22s")."""

    def __init__(self, total, unit, desc, stream, clock=time.monotonic):
        self.total, self.unit, self.desc, self.stream, self.clock = total, unit, desc, stream, clock
        self.n, self.postfix, self.closed, self.printed = 0, "", False, False
        self.t0 = self.last_t = clock()
        self.next_pct = STEP_PCT

    def update(self, n=1):
        self.n += n
        now = self.clock()
        if now - self.t0 < QUIET_S:
            return
        if self.total:
            pct = 100 * self.n / self.total
            if pct < self.next_pct or self.n >= self.total:  # the end is close()'s line
                return
            self.next_pct = (int(pct) // STEP_PCT + 1) * STEP_PCT
        elif now - self.last_t < PLAIN_EVERY_S:
            return
        self.last_t = now
        self._line()

    def set_postfix(self, refresh=True, **kw):
        self.postfix = ", ".join(f"{k}={v}" for k, v in kw.items())

    def _line(self, done=False):
        elapsed = self.clock() - self.t0
        if self.total:
            where = f"{100 * self.n / self.total:.0f}% ({self.n:,}/{self.total:,} {self.unit})"
            eta = "" if done or not self.n else f", eta {elapsed * (self.total - self.n) / self.n:.0f}s"
        else:
            where, eta = f"{self.n:,} {self.unit}", ""
        tail = f" [{self.postfix}]" if self.postfix else ""
        print(f"{self.desc}: {'done, ' if done else ''}{where}, {elapsed:.0f}s{eta}{tail}", file=self.stream,
              flush=True)
        self.printed = True

    def __enter__(self):  # `with progress(...) as bar:` as with tqdm
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """A closing line when the work took QUIET_S or longer (lines printed or not); idempotent."""
        if not self.closed and (self.printed or self.clock() - self.t0 >= QUIET_S):
            self._line(done=True)
        self.closed = True
