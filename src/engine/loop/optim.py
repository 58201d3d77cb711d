"""Optimizer and learning-rate schedule, from timm, built from the ``optim`` and ``sched`` groups."""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn


def build_optimizer(cfg: DictConfig, model: nn.Module):
    """``timm.optim.create_optimizer_v2`` (or any ``_target_``) over ``model``'s parameters.

    timm leaves biases, norms and ``no_weight_decay()`` parameters out of weight decay.
    """
    return instantiate(cfg, model_or_params=model)


def build_scheduler(cfg: DictConfig, optimizer, total_steps: int, steps_per_epoch: int):
    """A timm scheduler stepped per optimizer update, over ``total_steps``.

    The config's ``warmup_steps`` or ``warmup_epochs`` (converted with ``steps_per_epoch``)
    becomes timm's ``warmup_t``; the rest goes to the ``_target_`` as is.
    """
    options = OmegaConf.to_container(cfg, resolve=True)
    warmup_steps, warmup_epochs = options.pop("warmup_steps", None), options.pop("warmup_epochs", None)
    warmup = warmup_steps if warmup_steps is not None else round((warmup_epochs or 0) * steps_per_epoch)
    return instantiate(
        options,
        optimizer=optimizer,
        t_initial=total_steps,
        warmup_t=min(warmup, total_steps),
        t_in_epochs=False,
    )
