"""Preemption: SIGTERM, SIGUSR1 or SIGUSR2 stop training at the next step boundary, after a
checkpoint, and the run resumes from it.

SLURM sends SIGTERM when it cancels or preempts a job (SIGKILL follows after ``KillWait``), and
the signal of ``--signal`` before the time limit (SIGUSR1, or SIGUSR2 under submitit). While the
shared loop trains, :class:`PreemptionGuard`'s handlers only note the first of them; at the next
step boundary the loop saves ``last.pt`` and raises :class:`Preempted`, whose one line says where
the checkpoint is and how the run resumes. The entry point records it (``failures.jsonl``, never a
``failed`` summary: the run is incomplete, not failed) and ends with :func:`exit_preempted`: the
line, the signal's earlier Python handler (submitit's, which requeues the job), or a requeue of
its own for SIGUSR1 under SLURM (``scontrol requeue``, as Lightning does), and exit status
128+signal. Under DDP all processes stop at the same step: the one where they agree on the signal,
in the reduction the loop reads its losses with (:mod:`.readings`), at its next logging,
validation, monitor or checkpoint step, so at most ``trainer.log_every`` steps after the signal
(every step where the loop reads every step); with one process, at the end of the step it arrives in.

A step of many accumulated micro-batches can outlast SLURM's grace before SIGKILL. With one
process, a signal that finds the step running for longer than :data:`STEP_WAIT_S` (or that keeps
running past it) stops it at the next micro-batch boundary instead: ``last.pt`` then holds the
state *within* the step, the last whole step's weights and optimizer with the gradients summed
over the micro-batches done so far, and their data position and RNG states. Nothing is applied:
no partial update reaches the weights, and the rerun sums the remaining micro-batches onto those
gradients and takes the step, exactly as the uninterrupted run does (``previous.pt`` keeps the
whole step before, from which the step is redone from its first micro-batch). Under DDP each
process's gradients are its own until the step's all-reduce, and the processes agree on a
signal only in a collective, which a micro-batch must not add: there the step always ends first.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import torch
from torch import Tensor

from src.errors import SuiteError

from ..distributed import Dist
from ..record.announce import shown

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
#: [reading] How long a signal waits for the step it arrives in to end before the step is stopped at
#: its next micro-batch boundary: SLURM's ``KillWait`` (the grace between SIGTERM and SIGKILL)
#: defaults to 30 s, and this leaves 20 of them for a micro-batch in flight and the checkpoint.
STEP_WAIT_S = 10.0
Handler = Callable[[int, FrameType | None], Any]


class Preempted(SuiteError):
    """A signal stopped training after a checkpoint; the message says how the run resumes.

    ``signum``: the signal; ``step`` of ``total``: where it stopped; ``checkpoint``: the file
    that holds ``step``; ``previous``: the Python handler the signal had before the loop (called
    by :func:`exit_preempted`), or None; ``within``: ``(done, of)`` micro-batches of the next step
    the checkpoint holds, where the signal stopped a long step midway (module docstring)."""

    def __init__(
        self,
        signum: int,
        step: int,
        total: int,
        checkpoint: Path,
        previous: Handler | None = None,
        within: tuple[int, int] | None = None,
    ) -> None:
        self.signum, self.step, self.total = signum, step, total
        self.checkpoint, self.previous, self.within = checkpoint, previous, within
        super().__init__(stopped_line(signum, step, total, checkpoint, within))

    @property
    def exit_status(self) -> int:
        """128 + the signal, as a shell reports a process the signal ended."""
        return 128 + self.signum


def stopped_line(
    signum: int, step: int, total: int, checkpoint: Path, within: tuple[int, int] | None = None
) -> str:
    """``stopped by SIGTERM at step 12 of 60: checkpoint saved (…/last.pt); …`` and how it resumes
    (``within``: ``…at step 12 of 60, 3 of 8 micro-batches into step 13: …``)."""
    job = slurm_job()
    where = f" (SLURM job {job})" if job else ""
    if within is not None:
        where = f", {within[0]} of {within[1]} micro-batches into step {step + 1}{where}"
    resume = (
        f"the job, once requeued, resumes from step {step} (or rerun the same command)"
        if job
        else "rerun the same command to resume"
    )
    return (
        f"stopped by {signal.Signals(signum).name} at step {step} of {total}{where}: "
        f"checkpoint saved ({shown(checkpoint)}); {resume}"
    )


class PreemptionGuard:
    """``with PreemptionGuard() as guard:`` notes the first of :data:`SIGNALS` (the handlers do
    nothing else) and restores the earlier handlers on leaving. Only the main thread can set
    handlers: elsewhere it notes nothing. A signal the process was told to ignore stays ignored."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self.previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self.previous = {}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum

    def noted(self, device: torch.device) -> Tensor:
        """``(len(SIGNALS),)`` on ``device``: 1 for the signal this process noted, else 0; summed
        over the processes (with the loop's losses, :mod:`.readings`) it says who noted what."""
        return torch.tensor([float(self.signum == s) for s in SIGNALS], device=device)

    def agreed(self, counts: Sequence[float]) -> int | None:
        """The signal to stop on, from :meth:`noted` summed over the processes: this process's own,
        else the first that any process noted, else None. A signal any process noted stops all."""
        named = [int(s) for s, count in zip(SIGNALS, counts, strict=True) if count]
        return self.signum or (named[0] if named else None)

    def stop_signal(self, dist: Dist) -> int | None:
        """The signal to stop on now, the same on every process: with one process the one noted;
        with DDP one all-reduce of :meth:`noted`. (The shared loop agrees on it in the reduction
        it reads its losses with, at its boundaries: :mod:`.readings`.)"""
        if dist.world == 1:
            return self.signum
        return self.agreed(dist.all_sum(self.noted(dist.device)).tolist())

    def chained(self, signum: int) -> Handler | None:
        """The Python handler ``signum`` had before the guard (submitit's requeue), or None."""
        handler = self.previous.get(signum)
        return handler if callable(handler) else None


def slurm_job() -> str | None:
    """This SLURM job as ``scontrol`` names it (``<array job>_<task>`` for an array), or None."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID") or None


def requeue_if_slurm(signum: int) -> bool:
    """SIGUSR1 (SLURM's ``--signal`` before the time limit) in a SLURM job, on its first process:
    ``scontrol requeue`` the job, as Lightning does, and say how that went in one line. A failure
    to requeue is logged, never raised: the checkpoint is saved and a rerun resumes from it."""
    job = slurm_job()
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) or 0)
    if signum != signal.SIGUSR1 or job is None or rank != 0:
        return False
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("could not requeue SLURM job %s (%s); rerun the same command to resume", job, error)
        return False
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()[:1] or [f"status {done.returncode}"]
        log.warning("scontrol requeue %s failed (%s); rerun the same command to resume", job, why[0])
        return False
    log.info("requeued SLURM job %s: it resumes from the checkpoint", job)
    return True


def exit_preempted(stop: Preempted) -> NoReturn:
    """The end of a preempted run, once the failure is recorded: its one line on stderr, the
    signal's earlier Python handler (submitit's requeues the job and exits itself), or else
    :func:`requeue_if_slurm`; then exit status 128+signal."""
    print(stop, file=sys.stderr, flush=True)
    if stop.previous is not None:
        stop.previous(stop.signum, None)
    else:
        requeue_if_slurm(stop.signum)
    sys.exit(stop.exit_status)
