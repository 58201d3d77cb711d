"""Learning-rate schedules that timm lacks, stepped per optimizer update by the shared loop like
timm's own (``conf/sched/``; :func:`src.engine.optim.build_scheduler` builds them).

:class:`RsqrtLRScheduler` is ``constant * linear_warmup * rsqrt_decay``, the schedule of LRA's
text tasks (and of the original Transformer): ``lr(t) = lr · min(1, t / warmup) /
sqrt(max(t, warmup))`` (the LRA release's ``train_utils.create_learning_rate_scheduler``), a
linear warm-up to ``lr / sqrt(warmup)``, then inverse square-root decay
(``conf/sched/rsqrt.yaml``).
"""

from __future__ import annotations

import math

import torch
from timm.scheduler.scheduler import Scheduler


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
