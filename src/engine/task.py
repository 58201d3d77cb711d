"""What the shared loop needs from a task: data, a model, a loss, and evaluation sums.

A task owns its data and its metric, not the loop. It is built from the ``task`` config
group (``_target_``) and never sees the trainer; the loop calls these methods only.

Optional, looked up with ``getattr``: ``collate_fn``; ``derived_metrics(means) -> dict``,
metrics computed from the reduced means (perplexity from the mean loss), added to them;
``tokens_per_sample`` (int), with which the loop logs ``tokens_per_s`` beside ``throughput``;
``after_backward(model, step, loss) -> dict | None``, called after backward and clipping,
before ``optimizer.step()`` (gradients in ``.grad``; ``step`` counts from 1, ``loss`` is the
step's mean), whose metrics the loop logs at ``step`` (split ``train``);
``after_validation(model, step, run_dir, final)``, called on the main process after each
validation is logged (``final`` at the last step), for what a task writes into the run
folder; ``state_dict()`` / ``load_state_dict(state)``, the task's own state, carried by the
checkpoint so that a resumed run logs what an uninterrupted one does. The hooks get the
bare model (not its DDP or compiled wrapper) and must not draw from the global RNGs.

A task that brings its own loop (detection trains in mmengine's Runner) defines
``run(cfg, session, dist, wandb) -> dict`` instead of the data and loss methods: ``train`` calls
it after the compatibility check, the opening of the record (:class:`src.engine.session.Session`:
``session.record``, its identity, what a checkpoint carries) and seeding, and writes what it
returns (``steps``, ``final``, ``best``, ``wall_s``, …; the record's rows and
``checkpoints/last.pt`` are its to write) into ``summary.json`` beside the keys every run has
(task, backbone, attn, seed, metric, status, sessions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import Dataset


class Task(Protocol):
    name: str
    metric: str  # the main metric, a key of evaluate()'s result, e.g. "val/acc"
    metric_mode: str  # "max" or "min"
    batch_size: int  # per process
    eval_batch_size: int

    def datasets(self, data_dir: Path) -> tuple[Dataset, Dataset]:
        """``(train, val)`` read from their official layout under ``data_dir``."""
        ...

    def build_model(self, backbone: DictConfig) -> nn.Module:
        """The model for this task from the ``backbone`` config group."""
        ...

    def train_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The scalar training loss of one batch (already on the device)."""
        ...

    def eval_sums(self, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """Sums over the batch, each ``(total, count)``; the loop adds them over batches and
        processes and reports ``total / count`` under the key (``val/loss``, ``val/acc``)."""
        ...

    def model_inputs(self, batch: Any) -> tuple:
        """The positional inputs of ``model`` in a batch (for the conditioning monitor)."""
        ...


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a batch (tuples, lists, dicts) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
