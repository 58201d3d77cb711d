"""COCO's training pipeline (the recipe's ``augment=ms_crop``: multi-scale resizes, or DETR's
resize-crop-resize) drawn 10,000 times through the task's own dataset config from real-size images
in the modes a COCO-format folder holds: what a run draws millions of times, drawn thousands here.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compose
from hydra.utils import instantiate
from PIL import Image

pytest.importorskip("mmdet")
pytest.importorskip("mmcv._ext")

from smoke.detection import SHAPES_AS, coco_categories  # noqa: E402

from tasks.detection.config import MS_SCALES, dataset, train_pipeline  # noqa: E402
from tasks.detection.shapes import ShapesSpec, write_coco_shapes  # noqa: E402

#: 12 training images of 640 × 640 (COCO's longer side), 1-6 objects from 8 to 300 px
SPEC = ShapesSpec(num_train=12, num_val=2, img_size=640, min_shapes=1, max_shapes=6, min_size=8, max_size=300)
#: how some of the training JPEGs are written again: the other forms a real folder holds
REWRITTEN = {
    1: lambda im: save(im.convert("L"), "JPEG"),
    2: lambda im: save(im.convert("CMYK"), "JPEG"),
    3: lambda im: save(im, "PNG"),  # a PNG under a .jpg name
    4: lambda im: save(im, "JPEG", progressive=True),
}


def save(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    ids = {c["name"]: c["id"] for c in coco_categories()}
    write_coco_shapes(
        root / "coco", SPEC, categories=coco_categories(), shape_ids=[ids[n] for n in SHAPES_AS]
    )
    files = sorted((root / "coco" / "train2017").iterdir())
    for i, write in REWRITTEN.items():
        files[i].write_bytes(write(Image.open(files[i]).convert("RGB")))
    return root


@pytest.mark.slow  # 10,000 draws of 640 px images, resized up to 1333 × 800, on one core: about 2 minutes
@pytest.mark.minutes(3)
def test_ten_thousand_draws_of_cocos_training_pipeline_never_raise(coco_root, tmp_path):
    """The recipe's pipeline (conf/task/coco.yaml, ``augment=ms_crop``) through the suite's
    dataset config and ``SuiteCocoDataset``: 10,000 draws, none raises; each is a uint8
    ``(3, H, W)`` image within the multi-scale bounds (shorter side ≤ 800, longer ≤ 1333), with as
    many masks as boxes and every box inside the image; both branches (resize, crop) were drawn."""
    from mmdet.registry import DATASETS
    from mmdet.utils import register_all_modules

    import tasks.detection.dataset  # noqa: F401  registers SuiteCocoDataset

    register_all_modules()
    cfg = compose(["task=coco", f"paths.data_dir={coco_root}"], tmp_path)
    task = instantiate(cfg.task)
    assert task.augment == "ms_crop"
    data = DATASETS.build(dataset(task, coco_root / "coco", "train", train_pipeline(task), 0))
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    shorter = {short for _, short in MS_SCALES}
    sizes = set()
    for k in range(10_000):
        sample = data[k % len(data)]
        image, truth = sample["inputs"], sample["data_samples"].gt_instances
        height, width = image.shape[1:]
        assert image.dtype == torch.uint8 and image.shape[0] == 3
        assert min(height, width) <= 800 and max(height, width) <= 1333
        boxes = truth.bboxes.tensor
        assert len(truth.masks) == len(boxes) == len(truth.labels)
        assert (boxes[:, 0::2] >= 0).all() and (boxes[:, 0::2] <= width).all()
        assert (boxes[:, 1::2] >= 0).all() and (boxes[:, 1::2] <= height).all()
        sizes.add((height, width))
    squares = {h for h, w in sizes if h == w}  # the resize branch keeps the square photos square
    assert squares == shorter and any(h != w for h, w in sizes)  # every scale, and the crop branch
