"""Any timm model by its registry name: ``backbone=timm backbone.name=vit_tiny_patch16_224``.

``conf/backbone/timm.yaml`` builds its model with :func:`create`: ``timm.create_model`` with the
task's classes, image size and channels, never pretrained weights (the suite trains from scratch,
and nothing is downloaded). The name is the backbone's ``name`` too, so the run is labelled by it
in its folder, in W&B and in the report. Whether the model's attention is one the variants know is
:func:`src.attention.apply`'s to say, in one line that names the nearest supported model.
"""

from __future__ import annotations

import difflib
from typing import Any

from torch import nn

from src.errors import ConfigError


def create(
    name: str, num_classes: int, img_size: int | None = None, in_chans: int | None = None, **kwargs: Any
) -> nn.Module:
    """``timm.create_model(name, pretrained=False, num_classes=…, img_size=…, in_chans=…, **kwargs)``.

    ``img_size`` is passed where the model takes one (ViTs fix their position table by it; a
    ConvNeXt takes any size and no such argument); ``kwargs`` are the model's own arguments
    (``+backbone.model.patch_size=2``). A name timm does not register is a :class:`ConfigError`
    naming the closest ones.
    """
    import timm

    check_name(name)
    args = dict(kwargs, num_classes=num_classes)
    if in_chans is not None:
        args["in_chans"] = in_chans
    if img_size is None:
        return timm.create_model(name, pretrained=False, **args)
    try:
        return timm.create_model(name, pretrained=False, img_size=img_size, **args)
    except TypeError as e:
        if "img_size" not in str(e):
            raise
        return timm.create_model(name, pretrained=False, **args)


def check_name(name: str) -> None:
    """``name`` is a model in timm's registry, else one line naming the closest."""
    import timm

    if not isinstance(name, str) or not timm.is_model(name):
        close = difflib.get_close_matches(str(name), timm.list_models(), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ConfigError(
            f"backbone.name={name}: no such model in timm's registry{hint} "
            "(every name: python -c 'import timm; print(timm.list_models())')"
        )
