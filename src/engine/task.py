"""What the shared loop needs from a task: data, a model, a loss, and evaluation sums.

A task owns its data and its metric, not the loop. It is built from the ``task`` config
group (``_target_``) and never sees the trainer; the loop calls these methods only.
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
