"""Mask R-CNN's training step without data or weights, for a plan (``python -m launch.plan``).

The detector is built from the run's own mmdet config (:func:`tasks.detection.config.detector`) on
the meta device and computes in the parts mmdet runs (:class:`DetectionStep`), on one typical
training image (:func:`typical_image`). :class:`tasks.detection.CocoInstanceSegmentation` answers a
plan with these (its ``planned_model`` and ``example_inputs``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

#: **[reading]** COCO's typical image, 640 × 480 (its most common size; train2017's median width
#: is 640), which the detection recipe resizes to its training scales.
COCO_IMAGE = (640, 480)


def typical_image(img_scale: Sequence[int], augment: str) -> tuple[int, int]:
    """``(H, W)`` of a typical training image, padded to 32: :data:`COCO_IMAGE` resized as the
    recipe's ``augment`` does at its mean scale (**[reading]**): ``single`` to the shorter side
    ``img_scale[1]``, the multi-scale recipes (``ms``, ``ms_crop``: shorter side 480-800 in steps
    of 32) to their mean, 640; the longer side at most ``img_scale[0]``."""
    from .config import MS_SCALES

    longer_max, shorter = (int(v) for v in img_scale)
    if str(augment) != "single":
        shorter = round(sum(s for _, s in MS_SCALES) / len(MS_SCALES))
    width, height = COCO_IMAGE
    scale = min(shorter / min(width, height), longer_max / max(width, height))
    return tuple(32 * math.ceil(v * scale / 32) for v in (height, width))


def planned_detector(cfg: DictConfig, num_classes: int, sizes: dict, device: str) -> tuple[Any, str]:
    """The run's Mask R-CNN (mmdet's, from the run's own mmdet config, ``sizes`` its
    ``task.detector``) without weights on ``device``, as a :class:`DetectionStep`, and a note."""
    import torch
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import ConfigDict
    from mmengine.registry import DefaultScope

    from src.models.detection import out_channels

    from .config import backbone_dict, base_config, detector

    register_all_modules(init_default_scope=False)  # the modules mmdet's config names
    backbone = backbone_dict(cfg)
    spec = detector(base_config().model, backbone, out_channels(backbone), num_classes, sizes)
    note = ""
    with DefaultScope.overwrite_default_scope("mmdet"), torch.device(device):
        try:
            model = MODELS.build(ConfigDict(spec))
        except Exception as e:  # noqa: BLE001  a variant whose setup needs real weights
            note = f"{cfg.attn.variant} not applied ({type(e).__name__}): the backbone's FLOPs"
            spec["backbone"] = {**backbone, "attn": None}
            model = MODELS.build(ConfigDict(spec))
    return DetectionStep(model, spec), note


class DetectionStep:
    """Mask R-CNN's training computation on one image, in the parts mmdet runs: backbone + FPN,
    the RPN head on every level, the box head on the sampler's ``num`` RoIs (7 × 7 features) and
    the mask head on its positives, ``pos_fraction × num`` (14 × 14): **[reading]** the sampler's
    cap (mmdet's RandomSampler keeps fewer where an image has fewer positive proposals). RoIAlign,
    anchor assignment, NMS and the losses are not matmuls and not counted."""

    def __init__(self, model: Any, spec: dict) -> None:
        self.model, self.spec = model, spec

    def __call__(self, x: Any) -> Any:  # x (1, 3, H, W)
        import torch

        roi, sampler = self.spec["roi_head"], self.spec["train_cfg"]["rcnn"]["sampler"]
        width = roi["bbox_head"]["in_channels"]
        box_side = roi["bbox_roi_extractor"]["roi_layer"]["output_size"]
        mask_side = roi["mask_roi_extractor"]["roi_layer"]["output_size"]
        rois = int(sampler["num"]) * x.shape[0]
        positives = round(float(sampler["pos_fraction"]) * rois)
        feats = self.model.extract_feat(x)  # 5 levels of (1, C, H/s, W/s)
        scores, deltas = self.model.rpn_head(feats)
        # the RoI features RoIAlign would gather from the FPN levels (the gradient flows back to them)
        box_in = torch.zeros(rois, width, box_side, box_side, device=x.device, requires_grad=True)
        mask_in = torch.zeros(positives, width, mask_side, mask_side, device=x.device, requires_grad=True)
        classes, boxes = self.model.roi_head.bbox_head(box_in)  # (R, K + 1), (R, 4K)
        masks = self.model.roi_head.mask_head(mask_in)  # (P, K, 28, 28)
        outs = [*scores, *deltas, classes, boxes, masks]
        return sum(o.float().sum() for o in outs)

    def parameters(self) -> Any:
        return self.model.parameters()

    def train(self) -> None:
        self.model.train()
