"""Detection: a tiny COCO in the official format (COCO's 80 categories and their ids, shapes drawn
as some of them) and a tiny COCO shapes; a Mask R-CNN small enough for 2 CPU steps in seconds.

``write_coco_fixture`` is also the loader tests' fixture (``from smoke.detection import …``).
"""

from __future__ import annotations

from pathlib import Path

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
