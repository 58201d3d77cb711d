"""P5's feed-forward learning-rate discount: the sandbox's parameter-group hook for the optimizer.

P5's code trains the feed-forward layers at ``lr / r`` (its grid's ``mlp_lr`` ablation,
``conf/experiment/paper/p5_mlp_lr.yaml``). That experiment file names :func:`mlp_lr_discount` as
its ``optim.param_groups`` hook (``conf/task/modadd.yaml`` names none, so a default modadd run's
identity holds no hook), and :func:`src.engine.loop.optim.build_optimizer` calls it with
``optim.mlp_lr_discount`` (``r``; null: timm's own groups, no discount).
"""

from __future__ import annotations

import re

from torch import nn

from src.errors import ConfigError


def mlp_lr_discount(
    model: nn.Module, lr: float, weight_decay: float, mlp_lr_discount: float | None = None
) -> list[dict] | None:
    """The parameter groups with the feed-forward at ``lr / mlp_lr_discount`` (:func:`feed_forward_groups`),
    or None (timm's own groups) where no discount is given; a discount of 0 or less is refused."""
    if mlp_lr_discount is None:
        return None
    if mlp_lr_discount <= 0:
        raise ConfigError(
            f"optim.mlp_lr_discount={mlp_lr_discount}: a positive divisor of the feed-forward's lr"
        )
    return feed_forward_groups(model, lr, mlp_lr_discount, weight_decay)


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
