"""``standard``: softmax attention exactly as the model computes it (timm, nanoGPT).

The baseline of every comparison. It leaves the model untouched, so the module keeps its
fused ``F.scaled_dot_product_attention`` path; applying it only checks that the model has
attention sites and records the variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from .registry import Variant, register
from .sites import AttentionSite


@register
@dataclass
class Standard(Variant):
    """Softmax attention, unchanged."""

    name: ClassVar[str] = "standard"
    rank: ClassVar[int] = 0

    def modify(self, model: nn.Module, sites: list[AttentionSite]) -> None:
        return None
