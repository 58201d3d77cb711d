"""Optimizer and learning-rate schedule, from timm, built from the ``optim`` and ``sched`` groups."""

from __future__ import annotations

import inspect

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn


def build_optimizer(cfg: DictConfig, model: nn.Module):
    """``timm.optim.create_optimizer_v2`` (or any ``_target_``) over ``model``'s parameters.

    timm leaves biases, norms and ``no_weight_decay()`` parameters out of weight decay. A config may
    name a parameter-group hook, ``param_groups`` (a ``_target_`` with ``_partial_: true``; none by
    default): it is called as ``hook(model, lr=…, weight_decay=…, **options)``, its ``options`` the
    keys of ``cfg`` its signature names (taken out of what the optimizer receives), and returns the
    groups (timm's ``param_group_fn``), or None for timm's own. The sandbox's
    (:func:`src.sandbox.param_groups.mlp_lr_discount`) trains the feed-forward at a lower rate.
    """
    options = OmegaConf.to_container(cfg, resolve=True)
    hook_config = options.pop("param_groups", None)
    if hook_config is None:
        return instantiate(options, model_or_params=model)
    hook = instantiate(hook_config)
    own = [name for name in inspect.signature(hook).parameters if name not in ("model", "lr", "weight_decay")]
    hook_options = {name: options.pop(name) for name in own if name in options}
    lr, decay = float(options["lr"]), float(options.get("weight_decay") or 0.0)
    groups = hook(model, lr=lr, weight_decay=decay, **hook_options)
    if groups is None:
        return instantiate(options, model_or_params=model)
    return instantiate(options, model_or_params=model, param_group_fn=lambda _: groups)


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
