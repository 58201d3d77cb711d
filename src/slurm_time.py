"""Each SLURM attempt's time limit, and how many timeouts a run may requeue after.

A task states the wall-clock time its run needs (``resources.time_min``: DeiT-B on ImageNet asks
72 hours), but a partition refuses, or leaves pending for ever, a job longer than its ``MaxTime``
(often 24 or 48 hours). ``conf/hydra/launcher/slurm.yaml`` therefore asks each attempt for
:func:`attempt_min`, ``min(time_min, cap)``; at the cap SLURM signals the job, the loop saves
``last.pt``, submitit requeues it, and the next attempt resumes (``src/engine/loop/preemption.py``).
The cap is ``resources.max_time_min``: a number of minutes, ``null`` for none, or ``auto``, the
partition's own ``MaxTime`` as ``sinfo`` reports it when the sweep is submitted.

submitit requeues a timed-out job at most ``max_num_timeout`` times (preemptions are not counted),
so :func:`timeouts_allowed` sizes it from the attempts the run needs. Both are OmegaConf resolvers
(``src/resolvers.py`` registers them), read only where the launcher's config is resolved: in the
process that submits, never in a job.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import subprocess

from src.errors import ConfigError

#: submitit's ``max_num_timeout`` before attempts were capped (conf/hydra/launcher/slurm.yaml): the floor
MIN_TIMEOUTS = 20
#: **[reading]** timeouts allowed per attempt the run's estimate needs: a run twice as slow as its
#: ``time_min`` still ends; a job that never progresses still stops (submitit's guard against a loop)
SLACK = 2
UNLIMITED = {"infinite", "unlimited", "n/a", ""}


def parse_slurm_time(text: str) -> int | None:
    """Minutes in SLURM's time format (``sinfo``'s ``%l``, ``sbatch --time``): ``M``, ``M:S``,
    ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``; None for ``infinite``/``UNLIMITED``. Seconds round up."""
    text = text.strip()
    if text.lower() in UNLIMITED:
        return None
    days, _, clock = text.rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        day_minutes = int(days) * 24 * 60 if days else 0
    except ValueError:
        raise ValueError(f"{text!r} is not a SLURM time ([D-]H:M:S, M, M:S, D-H, D-H:M)") from None
    if days:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = 0, parts[0], 0
    return day_minutes + hours * 60 + minutes + math.ceil(seconds / 60)


def partition_limit_min(partition: str | None) -> int | None:
    """The ``MaxTime`` (minutes) of ``partition`` (a comma list: the shortest; None: the cluster's
    default partition), from ``sinfo``; None where it is unlimited, or SLURM does not answer (the
    launcher's own check then says so: ``launch/cluster/callbacks.py``)."""
    return _partition_limit_min(partition or None, shutil.which("sinfo"), os.environ.get("SLURM_CONF"))


@functools.lru_cache(maxsize=32)
def _partition_limit_min(partition: str | None, sinfo: str | None, _conf: str | None) -> int | None:
    if sinfo is None:
        return None
    command = [sinfo, "-h", "-o", "%P %l"] + (["-p", partition] if partition else [])
    try:
        listed = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    limits: dict[str, int | None] = {}
    for line in listed.stdout.splitlines():
        name, _, limit = line.strip().partition(" ")
        if not name or (partition is None and not name.endswith("*")):  # the default partition is starred
            continue
        limits[name.rstrip("*")] = parse_slurm_time(limit)
    finite = [m for m in limits.values() if m is not None]
    return min(finite) if finite else None


def attempt_min(time_min: int, max_time_min: int | str | None, partition: str | None = None) -> int:
    """``timeout_min`` of one attempt: ``time_min``, at most the cap (``auto``: the partition's)."""
    time_min = int(time_min)
    if max_time_min is None:
        return time_min
    if str(max_time_min) == "auto":
        cap = partition_limit_min(partition)
        return time_min if cap is None else min(time_min, cap)
    try:
        cap = int(max_time_min)
    except ValueError:
        raise ConfigError(
            f"resources.max_time_min={max_time_min!r}: minutes, auto (the partition's MaxTime) or null"
        ) from None
    if cap < 1:
        raise ConfigError(
            f"resources.max_time_min={cap}: the longest job a partition takes is at least 1 minute"
        )
    return min(time_min, cap)


def attempts_needed(time_min: int, attempt: int, signal_delay_s: int) -> int:
    """Attempts of ``attempt`` minutes that train ``time_min`` minutes in all: each stops
    ``signal_delay_s`` early (SIGUSR2, then ``last.pt``)."""
    usable = int(attempt) * 60 - int(signal_delay_s)
    if usable <= 0:
        raise ConfigError(
            f"each SLURM attempt asks {attempt} min, but hydra.launcher.signal_delay_s={signal_delay_s} "
            "signals it before it starts: lower signal_delay_s or raise resources.max_time_min"
        )
    return max(1, math.ceil(int(time_min) * 60 / usable))


def timeouts_allowed(time_min: int, attempt: int, signal_delay_s: int) -> int:
    """``max_num_timeout``: :data:`SLACK` times the attempts the run needs, at least :data:`MIN_TIMEOUTS`."""
    return max(MIN_TIMEOUTS, SLACK * attempts_needed(time_min, attempt, signal_delay_s))
