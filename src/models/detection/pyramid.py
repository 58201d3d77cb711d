"""A simple feature pyramid: stride-16 maps of a plain backbone -> strides 4, 8, 16, 32.

Li, Mao, Girshick & He, *Exploring Plain Vision Transformer Backbones for Object Detection*
(ViTDet, ECCV 2022): the last map of a plain ViT is resampled with transposed convolutions
(×4, ×2), kept (×1) or max-pooled (×½); the FPN neck that follows adds the lateral and output
convolutions. XCiT's detection code (facebookresearch/xcit, ``detection/backbone/xcit.py``)
does the same to four intermediate blocks, one per level. Two styles, an option:

* ``vitdet``: ×4 is ConvT, LayerNorm, GELU, ConvT; channels ``D/4, D/2, D, D``;
* ``xcit``: ×4 is ConvT, BatchNorm, GELU, ConvT; every level keeps ``D`` channels.
"""

from __future__ import annotations

from collections.abc import Sequence

from timm.layers import LayerNorm2d
from torch import Tensor, nn

SCALES = (4.0, 2.0, 1.0, 0.5)


def resampler(dim: int, scale: float, style: str = "vitdet") -> tuple[nn.Module, int]:
    """The operation for one ``scale`` on a ``dim``-channel map, and its output channels."""
    if style == "xcit" and scale in (4.0, 2.0):
        up = [nn.ConvTranspose2d(dim, dim, kernel_size=2, stride=2)]
        if scale == 4.0:
            up += [nn.BatchNorm2d(dim), nn.GELU(), nn.ConvTranspose2d(dim, dim, kernel_size=2, stride=2)]
        return nn.Sequential(*up), dim
    if style not in ("vitdet", "xcit"):
        raise ValueError(f"simple feature pyramid: style {style!r} is not one of vitdet, xcit")
    if scale == 4.0:
        ops = nn.Sequential(
            nn.ConvTranspose2d(dim, dim // 2, kernel_size=2, stride=2),
            LayerNorm2d(dim // 2),
            nn.GELU(),
            nn.ConvTranspose2d(dim // 2, dim // 4, kernel_size=2, stride=2),
        )
        return ops, dim // 4
    if scale == 2.0:
        return nn.ConvTranspose2d(dim, dim // 2, kernel_size=2, stride=2), dim // 2
    if scale == 1.0:
        return nn.Identity(), dim
    if scale == 0.5:
        return nn.MaxPool2d(kernel_size=2, stride=2), dim
    raise ValueError(f"simple feature pyramid: scale {scale} is not one of {SCALES}")


class SimpleFeaturePyramid(nn.Module):
    """Maps ``(B, D, H, W)`` at stride ``s`` to ``(B, D_l, H·r, W·r)`` for ``r`` in ``scales``.

    ``forward`` takes one map (every scale resampled from it, as ViTDet does) or one map per
    scale (XCiT's detection code resamples four intermediate blocks, one per level).
    """

    def __init__(self, dim: int, scales: Sequence[float] = SCALES, style: str = "vitdet") -> None:
        super().__init__()
        ops, channels = zip(*(resampler(dim, s, style) for s in scales), strict=True)
        self.scales = tuple(scales)
        self.levels = nn.ModuleList(ops)
        self.out_channels = list(channels)

    def forward(self, maps: Tensor | Sequence[Tensor]) -> tuple[Tensor, ...]:
        if isinstance(maps, Tensor):
            maps = [maps] * len(self.levels)
        if len(maps) != len(self.levels):
            raise ValueError(f"simple feature pyramid: {len(maps)} maps for {len(self.levels)} levels")
        return tuple(op(x) for op, x in zip(self.levels, maps, strict=True))  # each (B, D_l, H·r, W·r)
