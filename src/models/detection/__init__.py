"""Detection backbones for mmdetection (needs the ``detection`` extra: mmcv with its ops, mmdet).

Importing this package registers :class:`SuiteViT`, :class:`SuiteXCiT`, :class:`SuiteSwin` and
:class:`SuiteMaskRCNN` (Mask R-CNN with a bf16 backbone and FPN, :mod:`.detector`) in mmdet's
``MODELS`` registry; an mmdet config loads it with
``custom_imports = dict(imports=["src.models.detection"], allow_failed_imports=False)``.
"""

from .backbones import PlainBackbone, SuiteSwin, SuiteViT, SuiteXCiT, TimmDetectionBackbone, out_channels
from .detector import SuiteMaskRCNN
from .pyramid import SimpleFeaturePyramid

__all__ = [
    "PlainBackbone",
    "SimpleFeaturePyramid",
    "SuiteMaskRCNN",
    "SuiteSwin",
    "SuiteViT",
    "SuiteXCiT",
    "TimmDetectionBackbone",
    "out_channels",
]
