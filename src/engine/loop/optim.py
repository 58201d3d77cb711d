"""Optimizer and learning-rate schedule, from timm, built from the ``optim`` and ``sched`` groups."""

from __future__ import annotations

import re

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from src.errors import ConfigError


def build_optimizer(cfg: DictConfig, model: nn.Module):
    """``timm.optim.create_optimizer_v2`` (or any ``_target_``) over ``model``'s parameters.

    timm leaves biases, norms and ``no_weight_decay()`` parameters out of weight decay.
    ``mlp_lr_discount: r`` (P5's option) trains the feed-forward layers (every parameter under a
    module named ``mlp``) at ``lr / r``, through timm's ``param_group_fn`` with the same rule for
    weight decay (:func:`feed_forward_groups`).
    """
    options = OmegaConf.to_container(cfg, resolve=True)
    discount = options.pop("mlp_lr_discount", None)
    if discount is None:
        return instantiate(options, model_or_params=model)
    if discount <= 0:
        raise ConfigError(f"optim.mlp_lr_discount={discount}: a positive divisor of the feed-forward's lr")
    lr, decay = float(options["lr"]), float(options.get("weight_decay") or 0.0)

    def groups(module: nn.Module) -> list[dict]:
        return feed_forward_groups(module, lr, discount, decay)

    return instantiate(options, model_or_params=model, param_group_fn=groups)


def is_feed_forward(name: str) -> bool:
    """A parameter under a module named ``mlp`` (timm's blocks, the sandboxes; ``a.mlp.fc1.weight``
    or, stacked for :mod:`src.sandbox.seeds`, ``a__mlp__fc1__weight``)."""
    return "mlp" in re.split(r"\.|__", name)[:-1]


def feed_forward_groups(model: nn.Module, lr: float, discount: float, weight_decay: float) -> list[dict]:
    """The trainable parameters in up to four groups: feed-forward or not (its ``lr / discount``),
    decayed or not (timm's rule: 1-D parameters and ``no_weight_decay()`` names get none)."""
    skip = set(getattr(model, "no_weight_decay", lambda: ())())
    groups: dict[tuple[bool, bool], list] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            key = (is_feed_forward(name), p.ndim > 1 and name not in skip and weight_decay > 0)
            groups.setdefault(key, []).append(p)
    return [
        {"params": ps, "lr": lr / discount if ff else lr, "weight_decay": weight_decay if decayed else 0.0}
        for (ff, decayed), ps in groups.items()
    ]


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
