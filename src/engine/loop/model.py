"""The model of a run: the task's backbone with the run's attention variant applied.

Written once for every caller that must get the model training gets; those that build the whole
run (the shared loop, ``python -m src.eval``, the sandbox's stacked seeds, the bench's bare loop)
call it through :func:`.prepared.prepared`, which keeps the order of task, seed, data and model.
The same config and the same seed give the same weights whichever builds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omegaconf import DictConfig
from torch import nn

from src import attention

if TYPE_CHECKING:
    from ..task import Task


def build_model(
    cfg: DictConfig, task: Task, variant: attention.Variant | attention.Composition | None = None
) -> nn.Module:
    """``task``'s model from ``cfg.backbone`` (:meth:`Task.build_model <src.engine.task.Task.build_model>`,
    called after the task read its data, which may size the model) with ``cfg.attn``'s variant
    applied. ``variant``: that variant already built (the pipeline builds it once, as it checks
    ``cfg.attn``); None builds it here from ``cfg.attn``. The task's :meth:`prepare_model` hook is
    the caller's: training calls it, evaluation loads a checkpoint instead."""
    model = task.build_model(cfg.backbone)
    attention.apply(model, variant if variant is not None else attention.variant_from_config(cfg.attn))
    return model
