"""How many CPU threads torch uses: the visible cores less the processes already running.

torch's default, one OpenMP thread per core, spins each thread at every parallel region's
barrier. As soon as another process holds a core, the thread that shares it is descheduled
while the others spin for it: training on 2 cores ran 2-3x slower than on one thread then
(docs/threads.md has the measurements and the command). So the entry points call
`use_cpu_threads` before any work: it counts the other runnable tasks at that moment and
leaves them their cores. OMP_NUM_THREADS, when set, is the user's choice and is kept.
A load that starts later is not seen (the count is fixed for the run: results stay
reproducible); on a shared machine pass threads=1.
"""
import os
import statistics
import time

import torch


def visible_cores() -> int:
    """Cores this process may run on (the affinity mask, e.g. under taskset or a container)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _own_running_threads() -> int:
    """This process's threads in state R (running or runnable), from /proc/self/task/*/stat."""
    running = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                running += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except OSError:  # the thread ended meanwhile
            pass
    return running


def other_running_tasks(samples: int = 5, interval_s: float = 0.01) -> int | None:
    """Runnable tasks of other processes now: the median over a few samples of /proc/loadavg's
    running count less this process's own running threads. None where /proc is not there."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        counts.append(max(0, running - _own_running_threads()))
        if i + 1 < samples:
            time.sleep(interval_s)
    return int(statistics.median(counts))


def choose_threads(requested: int = 0) -> tuple[int, str]:
    """-> (threads, why): `requested` when > 0, OMP_NUM_THREADS when set, else the free cores."""
    if requested > 0:
        return requested, "threads key"
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads(), "OMP_NUM_THREADS"
    cores, others = visible_cores(), other_running_tasks()
    if others is None:
        return cores, f"{cores} visible cores"
    return max(1, cores - others), f"{cores} visible cores, {others} other running"


def use_cpu_threads(requested: int = 0, device: str = "cpu") -> tuple[int, str]:
    """Set torch's intra-op threads for a CPU run before its first tensor op -> (threads, why).
    On CUDA the CPU only feeds the GPU: the threads are left as they are."""
    if not str(device).startswith("cpu"):
        return torch.get_num_threads(), "not a CPU run"
    threads, why = choose_threads(requested)
    torch.set_num_threads(threads)
    return threads, why
