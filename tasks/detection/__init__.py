"""Detection and instance segmentation on COCO through mmdetection (Mask R-CNN + FPN).

| task | data under ``paths.data_dir`` |
| --- | --- |
| ``coco`` | ``coco/annotations/instances_{train,val}2017.json``, ``coco/{train,val}2017/`` (COCO 2017) |
| ``coco_shapes`` | ``coco_shapes/`` in the same layout, generated on first use |

The backbones are ``src.models.detection``'s, registered in mmdet's ``MODELS``. mmdet, mmcv
(with its compiled ops) and mmengine are the optional ``detection`` extra: this package
imports them only when a run starts.
"""

from .shapes import ShapesSpec, write_coco_shapes
from .task import CocoInstanceSegmentation, CocoShapes, require_detection_stack

__all__ = [
    "CocoInstanceSegmentation",
    "CocoShapes",
    "ShapesSpec",
    "require_detection_stack",
    "write_coco_shapes",
]
