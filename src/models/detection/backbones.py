"""timm backbones with the suite's attention variants, registered in mmdetection's ``MODELS``.

A plain mmdet config names them once this module is imported::

    custom_imports = dict(imports=["src.models.detection"], allow_failed_imports=False)
    model = dict(
        type="MaskRCNN",
        backbone=dict(type="SuiteXCiT", model_name="xcit_small_12_p16_224", attn=dict(variant="cond_init")),
        neck=dict(type="FPN", in_channels=[96, 192, 384, 384], out_channels=256, num_outs=5),
        ...)

Each backbone wraps a timm model (``body``), so that ``src.attention.apply`` finds timm's
attention modules and every variant applies; ``attn`` is the content of a ``conf/attn/*.yaml``
file (``{variant: precond, eps: 1e-6, ...}``; ``_target_`` is ignored) and is applied in the
constructor, after timm's initialisation. Outputs: four maps at strides 4, 8, 16, 32, NCHW.

* :class:`SuiteViT`, :class:`SuiteXCiT`: plain backbones (one stride-16 token grid). The
  maps of the blocks ``out_blocks`` go through a simple feature pyramid (:mod:`.pyramid`):
  one block (default: the last, as ViTDet) feeds every level, or four blocks feed one level
  each, as XCiT's own detection code does (blocks 3, 5, 7, 11 of XCiT-S12 and 7, 11, 15, 23 of
  XCiT-M24); ``pyramid`` picks ViTDet's resampling (``vitdet``) or XCiT's (``xcit``). XCiT's
  class-attention layers and every classifier head are pruned: dense features never use them
  (and unused parameters would break DDP).
* :class:`SuiteSwin`: the four stages of a hierarchical Swin (timm's NHWC stages, returned
  as NCHW), each followed by a LayerNorm as in Swin's own detection backbone.

Inputs of any size: the image is zero-padded at the bottom and right to a multiple of
``size_divisor`` (32: every level then has an exact size, ``ceil(H / stride)``); ViT
interpolates its position embedding to the grid (timm's ``dynamic_img_size``), XCiT's Fourier
encoding is computed for any grid, and Swin builds its shifted-window masks per input
(``dynamic_img_size``) and pads each stage to the window (``always_partition``: windows and
shifts of the configured size at every stage, whatever the image size).

mmengine's ``init_weights`` would call timm's own ``init_weights`` and undo the init-time
variants (``cond_init``, ``mimetic``): the backbones are initialised at construction and
their ``init_weights`` does nothing. ``pretrained`` loads a state dict into the timm body
(a suite checkpoint's ``model``, a timm or ``.safetensors`` file); it must come from the same
backbone with the same variant (``spectral`` stores ``W`` under ``parametrizations``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import timm
import torch
import torch.nn.functional as F
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from timm.layers import LayerNorm2d
from torch import Tensor, nn

from src import attention
from src.attention import TokenEntry
from src.attention.sites import Where
from src.attention.timm_families import timm_token_entry
from src.errors import ConfigError

from .pyramid import SimpleFeaturePyramid


def attention_variant(attn: Mapping[str, Any] | str | None) -> attention.Variant | attention.Composition:
    """What an ``attn`` entry names: a ``conf/attn`` mapping (one variant or a composition), a
    variant's name, or None (standard)."""
    if isinstance(attn, Mapping) and "variant" not in attn and "parts" not in attn:
        raise ConfigError(f"backbone attn={dict(attn)} names no variant; e.g. attn=dict(variant='precond')")
    return attention.variant_from_config(attn)


class TimmDetectionBackbone(BaseModule):
    """Shared part: the timm ``body``, input padding, the variant, the token entry, pretrained weights."""

    #: keyword arguments every model of the family gets (subclasses set them)
    family_defaults: dict[str, Any] = {}

    def __init__(self, model_name: str, **model_kwargs: Any) -> None:
        super().__init__(init_cfg=None)
        kwargs = {**self.family_defaults, **model_kwargs, "pretrained": False, "num_classes": 0}
        self.body = timm.create_model(model_name, **kwargs)
        self.out_channels: list[int] = []
        self.size_divisor = 32

    def finish(self, attn: Mapping[str, Any] | str | None, pretrained: str | None) -> None:
        """Apply the attention variant, then load ``pretrained`` (subclasses call it last)."""
        attention.apply(self, attention_variant(attn))
        if pretrained:
            self.load_pretrained(pretrained)

    def token_entry(self, where: Where = "block") -> TokenEntry:
        """The body's token entry (``cond_tokens``, the monitor): the input of its first layer
        (``where="block"``) or its patch embeddings (``"embed"``), see :func:`timm_token_entry`."""
        entry = timm_token_entry(self.body, where)
        if entry is None:
            raise ConfigError(f"no {where} token entry known for timm's {type(self.body).__name__}")
        return entry

    def pad(self, x: Tensor) -> Tensor:
        """``x (B, C, H, W)`` zero-padded at the bottom and right to multiples of ``size_divisor``."""
        h, w = x.shape[-2:]
        return F.pad(x, (0, -w % self.size_divisor, 0, -h % self.size_divisor))

    def init_weights(self) -> None:
        """Nothing to do: initialised at construction, variant applied (see the module docstring)."""
        self._is_init = True

    def load_pretrained(self, path: str) -> None:
        """Load the body's weights from ``path``; heads and pruned layers in the file are ignored."""
        try:
            state = timm.models.load_state_dict(path, use_ema=False)  # weights only
        except Exception as e:  # noqa: BLE001  missing, unreadable or not a state dict: one message
            raise ConfigError(f"backbone pretrained={path}: cannot read a state dict ({e})") from e
        try:
            missing, _unexpected = self.body.load_state_dict(state, strict=False)
        except RuntimeError as e:  # shapes differ: another size of the backbone
            name = type(self.body).__name__
            raise ConfigError(f"backbone pretrained={path} does not fit this {name}: {e}") from e
        if missing:
            raise ConfigError(
                f"backbone pretrained={path} lacks {len(missing)} weights of {type(self.body).__name__} "
                f"(e.g. {', '.join(missing[:3])}): it must come from the same backbone with the same "
                "attention variant"
            )


class PlainBackbone(TimmDetectionBackbone):
    """A plain timm ViT or XCiT, the maps of ``out_blocks`` and a simple feature pyramid."""

    def __init__(
        self,
        model_name: str,
        attn: Mapping[str, Any] | str | None = None,
        out_blocks: Sequence[int] | None = None,
        pyramid: str = "vitdet",
        pretrained: str | None = None,
        **model_kwargs: Any,
    ) -> None:
        super().__init__(model_name, **model_kwargs)
        depth = len(self.body.blocks)
        blocks = [b % depth for b in (out_blocks if out_blocks is not None else [-1])]
        if len(blocks) not in (1, 4):
            raise ConfigError(
                f"{type(self).__name__}: out_blocks={list(out_blocks or [])} must name one block (every "
                "level from it, as ViTDet) or four (one per level, as XCiT's detection code)"
            )
        self.out_blocks = blocks
        self.body.prune_intermediate_layers(sorted(set(blocks)), prune_norm=True, prune_head=True)
        stride = self.body.feature_info[-1]["reduction"]
        if stride != 16:
            raise ConfigError(
                f"{type(self).__name__}: {model_name} has stride {stride}; the pyramid needs 16"
            )
        self.size_divisor = 2 * stride  # the ½-scale level halves the grid exactly
        if pyramid not in ("vitdet", "xcit"):
            raise ConfigError(f"{type(self).__name__}: pyramid={pyramid!r} is not one of vitdet, xcit")
        self.pyramid = SimpleFeaturePyramid(self.body.embed_dim, style=pyramid)
        self.out_channels = self.pyramid.out_channels
        self.finish(attn, pretrained)

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        # each (B, D, H/16, W/16) after padding
        maps = self.body.forward_intermediates(
            self.pad(x), indices=self.out_blocks, norm=False, output_fmt="NCHW", intermediates_only=True
        )
        if len(self.out_blocks) == 1:
            return self.pyramid(maps[0])  # (B, D/4, H/4, W/4), (B, D/2, H/8, W/8), …, (B, D, H/32, W/32)
        order = sorted(set(self.out_blocks))  # timm returns each block once, in depth order
        return self.pyramid([maps[order.index(b)] for b in self.out_blocks])


@MODELS.register_module()
class SuiteViT(PlainBackbone):
    """timm's VisionTransformer (any ``vit_*`` name) with the position embedding interpolated to
    each input's grid; the class token stays (so ImageNet checkpoints load) and is dropped from
    the maps."""

    family_defaults = {"dynamic_img_size": True}


@MODELS.register_module()
class SuiteXCiT(PlainBackbone):
    """timm's XCiT (any ``xcit_*_p16`` name): cross-covariance blocks with their local patch
    interaction; the class-attention layers are pruned."""


@MODELS.register_module()
class SuiteSwin(TimmDetectionBackbone):
    """timm's SwinTransformer (any ``swin_*`` name): four stages at strides 4, 8, 16, 32, each
    followed by a LayerNorm; windows of the configured size at every stage (``always_partition``)."""

    family_defaults = {"dynamic_img_size": True, "always_partition": True}

    def __init__(
        self,
        model_name: str,
        attn: Mapping[str, Any] | str | None = None,
        pretrained: str | None = None,
        **model_kwargs: Any,
    ) -> None:
        super().__init__(model_name, **model_kwargs)
        stages = len(self.body.layers)
        self.body.prune_intermediate_layers(stages, prune_norm=True, prune_head=True)
        self.out_channels = [info["num_chs"] for info in self.body.feature_info]
        strides = [info["reduction"] for info in self.body.feature_info]
        if strides != [4, 8, 16, 32]:
            raise ConfigError(f"SuiteSwin: {model_name} gives strides {strides}; Mask R-CNN's FPN needs 4-32")
        self.size_divisor = strides[-1]
        self.norms = nn.ModuleList(LayerNorm2d(c) for c in self.out_channels)
        self.finish(attn, pretrained)

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        maps = self.body.forward_intermediates(self.pad(x), output_fmt="NCHW", intermediates_only=True)
        return tuple(
            norm(m) for norm, m in zip(self.norms, maps, strict=True)
        )  # (B, C·2^i, H/4/2^i, W/4/2^i)


def out_channels(backbone: Mapping[str, Any]) -> list[int]:
    """The channels of each output level of the backbone a config dict (``type=…``) describes,
    read from the module built on the meta device (no weights are allocated)."""
    cls = MODELS.get(backbone["type"])
    if cls is None:
        raise ConfigError(f"backbone type {backbone['type']!r} is not in mmdet's MODELS registry")
    options = {k: v for k, v in backbone.items() if k not in ("type", "attn", "pretrained")}
    with torch.device("meta"):
        return list(cls(**options).out_channels)
