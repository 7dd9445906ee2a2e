"""glibc's allocator told to keep freed memory, so that a CPU training step reuses its tensors' memory
instead of asking the kernel for fresh pages every step.

A training step allocates and frees the same large tensors (activations, gradients: hundreds of KiB to
MiB) every step. glibc serves a block of 128 KiB or more with mmap and gives it back to the kernel
when freed, and trims the heap's free top back to the kernel too, so the next step's block is fresh
pages: one page fault per 4 KiB, each page zeroed by the kernel. glibc raises these thresholds by
itself as it sees blocks freed, but a step's mix of sizes keeps it trimming: at the fair study's
shape, 1,100-2,200 page faults and 3-6 ms of system time per step, none of it needed (docs/speed.md,
"The allocator"; tests/test_allocator.py).

keep_freed_memory() sets both thresholds once, before the model is built: blocks up to 32 MiB come
from the heap (glibc's own ceiling for its dynamic threshold) and up to 1 GiB of free heap top is
kept. The cost: memory freed during a run stays with the process (the peak, which the next step
needs again anyway). Settings the user made are kept: MALLOC_MMAP_THRESHOLD_ or
MALLOC_TRIM_THRESHOLD_ in the environment (glibc's own variables), or another allocator in
LD_PRELOAD (jemalloc, tcmalloc). Not glibc (macOS, Windows, musl): nothing to do.
"""
import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 << 20                      # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit glibc
TRIM_THRESHOLD = 1 << 30
GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory() -> str:
    """Fix glibc's mmap and trim thresholds high (see the module docstring). Returns what was done,
    for the run's log: "mmap/trim thresholds 32 MiB/1 GiB", or why nothing was."""
    if not sys.platform.startswith("linux"):
        return f"left as is ({sys.platform}: not glibc)"
    preloaded = os.environ.get("LD_PRELOAD", "")
    if "malloc" in preloaded:                      # jemalloc, tcmalloc, mimalloc...
        return f"left as is (LD_PRELOAD={preloaded})"
    if any(v in os.environ for v in GLIBC_VARIABLES):
        return "left as is (MALLOC_*_THRESHOLD_ set in the environment)"
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):              # musl and other C libraries
        return "left as is (no glibc mallopt)"
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "left as is (mallopt refused the thresholds)"
    return f"mmap/trim thresholds {MMAP_THRESHOLD >> 20} MiB/{TRIM_THRESHOLD >> 30} GiB"
