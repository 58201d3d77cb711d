"""Learning-rate schedules that timm lacks, stepped per optimizer update by the shared loop like
timm's own (``conf/sched/``; :func:`src.engine.loop.optim.build_scheduler` builds them).

:class:`RsqrtLRScheduler` is ``constant * linear_warmup * rsqrt_decay``, the schedule of LRA's
text tasks (and of the original Transformer): ``lr(t) = lr · min(1, t / warmup) /
sqrt(max(t, warmup))`` (the LRA release's ``train_utils.create_learning_rate_scheduler``), a
linear warm-up to ``lr / sqrt(warmup)``, then inverse square-root decay
(``conf/sched/rsqrt.yaml``).

:class:`TriangleLRScheduler` is Cramming's "triangle2" (Geiping & Goldstein 2022, ``train/bert-o4.yaml``,
its ``budget-triangle2`` schedule) over ``T`` updates: ``lr(t) = lr · max(0, min(b + t(1-b) / ((1-f)T),
(T - t) / (fT)))`` with ``b = base_fraction`` and ``f = falloff``; with ``b = f = 0.25`` it starts
at a quarter of the peak, rises linearly to the peak at 75% of the run and falls linearly to 0 at
the end (``conf/sched/triangle.yaml``).
"""

from __future__ import annotations

import math

import torch
from timm.scheduler.scheduler import Scheduler

from src.errors import ConfigError


class RsqrtLRScheduler(Scheduler):
    """Linear warm-up over ``warmup_t`` updates, then ``1/sqrt(t)`` decay (``t_initial`` is unused)."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, t_initial: int, warmup_t: int = 0, t_in_epochs: bool = False
    ) -> None:
        super().__init__(optimizer, param_group_field="lr", t_in_epochs=t_in_epochs, initialize=True)
        self.t_initial, self.warmup_t = t_initial, max(int(warmup_t), 1)
        self.update_groups(self._get_lr(0))

    def _get_lr(self, t: int) -> list[float]:
        factor = min(1.0, t / self.warmup_t) / math.sqrt(max(t, self.warmup_t))
        return [base * factor for base in self.base_values]


class TriangleLRScheduler(Scheduler):
    """Cramming's triangle: from ``base_fraction`` of the peak up to it at ``(1 - falloff)`` of
    ``t_initial`` updates, then down to 0 at ``t_initial`` (module docstring).

    The rise is the warm-up: ``warmup_t`` (which :func:`src.engine.loop.optim.build_scheduler` always
    passes) must be 0, so that a warm-up set for another schedule is not silently dropped.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        t_initial: int,
        base_fraction: float = 0.25,
        falloff: float = 0.25,
        t_in_epochs: bool = False,
        warmup_t: int = 0,
    ) -> None:
        if warmup_t:
            raise ConfigError(
                f"sched=triangle has its own rise from base_fraction to the peak, so warmup_t={warmup_t} "
                "cannot apply: set sched.warmup_steps=null and sched.warmup_epochs=null"
            )
        if not (0.0 < falloff < 1.0 and 0.0 <= base_fraction <= 1.0 and t_initial > 0):
            raise ConfigError(
                "sched=triangle needs 0 < falloff < 1, 0 <= base_fraction <= 1 and t_initial > 0; got "
                f"falloff={falloff}, base_fraction={base_fraction}, t_initial={t_initial}"
            )
        super().__init__(optimizer, param_group_field="lr", t_in_epochs=t_in_epochs, initialize=True)
        self.t_initial, self.base_fraction, self.falloff = int(t_initial), base_fraction, falloff
        self.update_groups(self._get_lr(0))

    def factor(self, t: int) -> float:
        """The multiple of the peak rate at update ``t``: the rise and the fall, whichever is lower."""
        b, f, total = self.base_fraction, self.falloff, self.t_initial
        rise = b + t * (1.0 - b) / ((1.0 - f) * total)
        fall = (total - t) / (f * total)
        return max(0.0, min(rise, fall))

    def _get_lr(self, t: int) -> list[float]:
        return [base * self.factor(t) for base in self.base_values]
