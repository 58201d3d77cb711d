"""A run's task, data and model, built in one order by every caller that must get what training
gets: the shared loop (:func:`.shared_loop.fit_shared`), ``python -m src.eval`` (which then loads
a checkpoint into the model), the sandbox's stacked seeds (:mod:`src.sandbox.stacked`, one build per
seed) and the bench's bare loop (:mod:`launch.tools.bench_training`).

The order is the task contract's (:class:`src.engine.task.Task`): the task from ``cfg.task``, then
the run's seed, then its data (which may size the model: a tokenizer's vocabulary), then the model
with ``cfg.attn``'s variant applied (:func:`.model.build_model`), then, for training, the task's
:meth:`~src.engine.task.Task.prepare_model`. The same config and seed give the same data and the
same weights whichever caller builds them, since each draws from the global RNGs in that order.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import Dataset

from .batching import BatchPlan, check_global_batch
from .data import epoch_samples
from .model import build_model
from .seeding import seed_everything

if TYPE_CHECKING:
    from src.attention import Composition, Variant

    from ..task import Task


class Prepared(NamedTuple):
    """What :func:`prepared` built: the task, its data sets (``(train, val)`` for training, the
    split's alone for evaluation) and the model, variant applied."""

    task: Task
    datasets: tuple[Dataset, ...]
    model: nn.Module


def seeded_task(cfg: DictConfig) -> Task:
    """``cfg.task`` built, then the run's seed set: after the task, whose constructor draws nothing
    the run reads, and before its data and model, which do."""
    task = instantiate(cfg.task)
    seed_everything(cfg.seed)
    return task


def prepared(
    cfg: DictConfig,
    task: Task | None = None,
    *,
    variant: Variant | Composition | None = None,
    split: str | None = None,
    batch: BatchPlan | None = None,
    device: torch.device | str | None = None,
) -> Prepared:
    """The run of ``cfg``, built in the module docstring's order.

    ``task``: one the caller built already (the pipeline's, seeded by :func:`seeded_task` before
    :meth:`~src.engine.task.Task.fit`; evaluation's, checked before its checkpoint is opened and
    not seeded, since the checkpoint's weights replace the drawn ones); None: :func:`seeded_task`.
    ``variant``: ``cfg.attn``'s, built already (None: built from ``cfg.attn``). ``split``: build
    for evaluating that split (:meth:`~src.engine.task.Task.eval_dataset`, and no
    :meth:`~src.engine.task.Task.prepare_model`: a checkpoint's weights are loaded next) instead
    of training (:meth:`~src.engine.task.Task.datasets`). ``batch``: the run's batch plan, whose
    global batch is refused, before the model is built, where it spans more than an epoch of the
    training set. ``device``: where the model goes (None: it stays where it was built)."""
    task = task if task is not None else seeded_task(cfg)
    data_dir = Path(cfg.paths.data_dir)
    datasets = (task.eval_dataset(data_dir, split),) if split is not None else task.datasets(data_dir)
    if batch is not None:  # a typo's accumulate=1000000000, refused before the model is built
        train_size = len(datasets[0])
        check_global_batch(batch, epoch_samples(train_size, task.repeated_aug), train_size)
    model = build_model(cfg, task, variant)
    if split is None:
        task.prepare_model(model)
    if device is not None:
        model.to(device)
    return Prepared(task, tuple(datasets), model)
