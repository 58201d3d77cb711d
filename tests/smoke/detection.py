"""Detection: a tiny COCO in the official format (COCO's 80 categories and their ids, shapes drawn
as some of them) and a tiny COCO shapes; a Mask R-CNN small enough for 2 CPU steps in seconds.

``write_coco_fixture`` is also the loader tests' fixture (``from smoke.detection import …``).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor, nn

from tasks.detection.shapes import ShapesSpec, write_coco_shapes

#: what the detection tasks import (the optional `detection` extra): without them they are skipped
REQUIRES = ["mmdet", "mmengine", "mmcv._ext", "pycocotools"]

#: COCO 2017's category ids, in the order of its 80 names (the official files skip 12, 26, 29, …)
COCO_IDS = [
    *range(1, 12), *range(13, 26), 27, 28, *range(31, 45), *range(46, 66), 67, 70,
    *range(72, 83), *range(84, 91),
]  # fmt: skip
#: the COCO categories the three shape classes are written as (ids 18, 59, 90: not contiguous)
SHAPES_AS = ("dog", "pizza", "toothbrush")
TINY_SPEC = ShapesSpec(num_train=6, num_val=4, img_size=64, min_size=12, max_size=28, seed=1)

TINY_DETECTOR = [
    "task.batch_size=2",
    "task.eval_batch_size=2",
    "task.augment=single",
    "task.img_scale=[64,64]",
    "task.min_size=0",
    "task.warmup_iters=1",
    "task.detector.neck_channels=16",
    "task.detector.fc_channels=32",
    "task.detector.mask_channels=16",
    "task.detector.anchor_scale=4",
    "task.detector.train_proposals=32",
    "task.detector.test_proposals=32",
    "task.detector.roi_samples=16",
    "trainer.num_workers=0",
    "trainer.threads=1",
]
TINY_SHAPES = [f"task.generate.{k}={v}" for k, v in vars(TINY_SPEC).items()]

OVERRIDES = {"coco": TINY_DETECTOR, "coco_shapes": [*TINY_DETECTOR, *TINY_SHAPES]}

#: the full-size backbones' one real step: Mask R-CNN with XCiT-S12/16 on the tiny COCO
FULL_SIZE_STEP = "paper/coco"
#: each full-size backbone's depth, heads and stages at 2-4 channels per head
REDUCED_WIDTH = {
    "vit_base_det": ["++backbone.model.embed_dim=24"],  # 12 heads of 2
    "xcit_small_det": ["++backbone.model.embed_dim=16"],  # 8 heads of 2
    "xcit_medium_det": ["++backbone.model.embed_dim=16"],
    "swin_tiny_det": ["++backbone.model.embed_dim=12"],  # stages of 3, 6, 12, 24 heads of 4
}
#: the strides of the FPN's five levels (the last is its max-pooled extra level)
FPN_STRIDES = (4, 8, 16, 32, 64)


def coco_categories() -> list[dict]:
    """COCO 2017's 80 categories as its annotation files list them (names as mmdet spells them)."""
    from mmdet.datasets import CocoDataset

    names = CocoDataset.METAINFO["classes"]
    return [{"id": i, "name": n, "supercategory": "thing"} for i, n in zip(COCO_IDS, names, strict=True)]


def write_coco_fixture(root: Path, spec: ShapesSpec = TINY_SPEC) -> dict[int, str]:
    """Shapes written as COCO categories (:data:`SHAPES_AS`) in COCO's official format and layout
    at ``root``, the file listing all 80; returns the category names by id."""
    categories = coco_categories()
    ids = {c["name"]: c["id"] for c in categories}
    write_coco_shapes(root, spec, categories=categories, shape_ids=[ids[n] for n in SHAPES_AS])
    return {c["id"]: c["name"] for c in categories}


def prepare(data_dir: Path) -> None:
    try:
        write_coco_fixture(data_dir / "coco")
    except ImportError:  # the detection extra is optional: its tasks are skipped without it
        pass


def build_as_trained(task, cfg) -> nn.Module:
    """Mask R-CNN as the task's Runner builds it (``build_config``'s model, the variant applied by
    the backbone's constructor), then initialised as the Runner does (``init_weights``, which reads
    values: not on the meta device)."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules

    import src.models.detection  # noqa: F401  registers the backbones
    from tasks.detection.config import build_config

    register_all_modules()
    mm = build_config(task, cfg, Path(cfg.paths.output_dir) / "mmdet", Path(cfg.paths.data_dir) / task.folder)
    model = MODELS.build(mm.model)
    if not next(model.parameters()).is_meta:
        model.init_weights()
    return model


def synthetic_batch(task, size: int = 2) -> tuple[Tensor, list[tuple[int, ...]]]:
    """Images ``(B, 3, H, W)`` of the task's ``img_scale`` (longer, shorter side) on the default
    device, and the shapes of the FPN's five maps for them: the backbone pads each side to a
    multiple of 32, level ``s`` is ``ceil(side / s)``."""
    width, height = task.img_scale
    padded = [math.ceil(side / 32) * 32 for side in (height, width)]
    channels = task.detector["neck_channels"]
    maps = [(size, channels, *(math.ceil(side / s) for side in padded)) for s in FPN_STRIDES]
    return torch.randn(size, 3, height, width), maps


def step(task, model: nn.Module, images: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
    """``(loss, maps)`` through backbone and FPN. The heads' losses pick proposals and samples by
    value (NMS, sampling), which the meta device has not: this loss is the maps' mean square."""
    maps = model.extract_feat(images)  # five (B, C, H / s, W / s)
    return sum(m.float().square().mean() for m in maps), maps
