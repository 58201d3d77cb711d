"""The loop's reads of the device: each step's loss and the stop signal, one reduction at a time.

On a GPU, reading a value on the host (``.item()``, ``.tolist()``) waits for every kernel queued
before it, and a collective waits for every process: one of each per step keeps the GPU idle
while the host catches up. So the shared loop keeps each step's loss where it was computed (this
process's mean over its micro-batches, a 0-d tensor) and reads them at a *boundary* only: a step
that logs, validates, runs the monitor or saves a checkpoint, the last step, and a stop. There
:func:`reduce_readings` stacks the pending losses and the preemption flags into one small tensor
``[loss_1 … loss_k, SIGTERM, SIGUSR1, SIGUSR2]``, all-reduces it once (with several processes) and
reads it on the host once. Nothing is lost between reads: every step's loss is kept until then,
so the logged ``train/loss`` is the mean over the window's finite steps, as a read per step gives.

Where a decision needs the step's own value before the update, the loop reads every step instead
(:class:`~.trainer.Trainer`: ``trainer.nonfinite=skip``, and a task that overrides ``after_backward``,
which takes the step's loss as a float), still one reduction and one read per step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..distributed import Dist


class PendingLosses:
    """The steps trained since the last read and their losses, still on the device."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.losses: list[Tensor] = []  # each 0-d, this process's mean over its micro-batches

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, step: int, loss: Tensor) -> None:
        self.steps.append(step)
        self.losses.append(loss)

    def take(self) -> tuple[list[int], list[Tensor]]:
        """The pending steps and losses, in order; none are pending afterwards."""
        taken = self.steps, self.losses
        self.steps, self.losses = [], []
        return taken


def reduce_readings(
    dist: Dist, losses: list[Tensor], flags: Tensor | None = None
) -> tuple[list[float], list[float]]:
    """``(means, counts)``: each of ``losses`` (0-d, one per step) averaged over the processes, and
    ``flags`` (``(F,)``, may be None) summed over them; one all-reduce of the stacked float32 tensor
    (several processes) and one host read, or neither when both are empty. The mean of a step is
    computed as a per-step all-reduce would (float32 sum, then ÷ world), so it is the same value."""
    parts = [torch.stack(losses).float()] if losses else []  # (k,)
    if flags is not None:
        parts.append(flags.float())  # (F,)
    if not parts:
        return [], []
    summed = dist.all_sum(torch.cat(parts))  # (k + F,)
    means = summed[: len(losses)] / dist.world
    values = torch.cat([means, summed[len(losses) :]]).tolist()  # the one read
    return values[: len(losses)], values[len(losses) :]
