"""The CPU threads a run computes with when ``trainer.threads`` is null: the CPUs this process may
use, less those other processes are busy on, shared among this node's processes.

torch's own default is one thread per core whatever else runs; on a shared 2-core machine at load
≈ 9 that made a 200-step digits run take 94 s against 21 s on one thread (issue 42), because
oversubscribed threads wait on each other at every parallel region. So the default looks first:

- the CPUs it may use: the affinity mask (``taskset``, SLURM's ``--cpus-per-task`` binding),
  capped by a cgroup v2 CPU quota (a container's ``--cpus``);
- the others' load: the kernel's count of runnable tasks (``/proc/loadavg``'s fourth field) less
  this process, the median of a few reads (an instant, not the 1-minute average, which would count
  the previous run of a local multirun against the next);
- the processes of this node (``LOCAL_WORLD_SIZE`` under ``torchrun``/SLURM) share what is left.

At least one thread. ``OMP_NUM_THREADS``, where set, wins (torch reads it: ``make test`` sets 1),
and so does ``trainer.threads``. Where ``/proc/loadavg`` does not exist (not Linux), torch decides.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path

LOADAVG = Path("/proc/loadavg")
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def auto_threads(cpus: int, others: float, processes: int = 1) -> int:
    """Threads for each of ``processes`` processes on ``cpus`` CPUs while ``others`` are busy."""
    free = max(0, round(cpus - others))  # at most cpus: others is never negative
    return max(1, free // max(1, processes))


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by a cgroup v2 quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = CPU_MAX.read_text().split()[:2]
    except (OSError, ValueError):
        return cpus
    return cpus if quota == "max" else max(1, min(cpus, math.ceil(int(quota) / int(period))))


def others_running(reads: int = 5, every_s: float = 0.01) -> float | None:
    """Runnable tasks other than this process (the median of ``reads``); None without /proc."""
    counts = []
    for i in range(reads):
        try:
            running = int(LOADAVG.read_text().split()[3].split("/")[0])
        except (OSError, IndexError, ValueError):
            return None
        counts.append(running - 1)  # this process, reading
        if i + 1 < reads:
            time.sleep(every_s)
    return max(0.0, statistics.median(counts))


def default_threads() -> tuple[int, str] | None:
    """``(threads, why)`` for a run whose ``trainer.threads`` is null, or None where torch's own
    default stands (``OMP_NUM_THREADS`` set, or no load to read)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    others = others_running()
    if others is None:
        return None
    cpus, processes = usable_cpus(), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    threads = auto_threads(cpus, others, processes)
    per = f", {processes} processes" if processes > 1 else ""
    return threads, f"{cpus} CPUs usable, {others:g} busy with other work{per}"
