"""COCO shapes: a generated instance-segmentation set in COCO's official format and layout.

Images of filled squares, circles and triangles (rotated, 1-4 per image, not overlapping) on
a shaded, noisy background, each shape with its polygon, box and area, written as COCO 2017
is released::

    <root>/annotations/instances_train2017.json   <root>/train2017/000000000001.jpg …
    <root>/annotations/instances_val2017.json     <root>/val2017/…

so that the COCO loader reads it unchanged. A tiny Mask R-CNN learns it on a CPU in minutes
(the embedded default of the detection family, ``task=coco_shapes``); ``categories`` lets the
tests write the same pictures under COCO's own 80 categories (a fixture in the official format).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from src.engine.generated import ensure_generated, read_marker
from src.engine.record import atomic

CLASSES = ("square", "circle", "triangle")
SPLITS = {"train": "train2017", "val": "val2017"}
CIRCLE_VERTICES = 32
MARKER = "generator.json"  # the spec of a generated set, written last


@dataclass(frozen=True)
class ShapesSpec:
    """What to generate: image counts and size, shapes per image, shape sizes (px), the seed."""

    num_train: int = 1000
    num_val: int = 200
    img_size: int = 128
    min_shapes: int = 1
    max_shapes: int = 4
    min_size: int = 16  # the side of a shape's bounding square, in pixels
    max_size: int = 48
    seed: int = 0


def default_categories() -> list[dict[str, Any]]:
    """One COCO category per shape class, ids from 1."""
    return [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(CLASSES)]


def polygon(kind: str, cx: float, cy: float, radius: float, angle: float) -> np.ndarray:
    """The vertices ``(K, 2)`` of a ``kind`` shape centred at ``(cx, cy)`` within ``radius``."""
    corners = {"square": 4, "triangle": 3, "circle": CIRCLE_VERTICES}[kind]
    t = angle + 2 * math.pi * np.arange(corners) / corners
    return np.stack([cx + radius * np.cos(t), cy + radius * np.sin(t)], axis=1)


def polygon_area(xy: np.ndarray) -> float:
    """The shoelace area of a simple polygon ``(K, 2)``."""
    x, y = xy[:, 0], xy[:, 1]
    return float(abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2)


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A linear colour gradient with pixel noise, ``(size, size, 3)`` uint8."""
    start, end = rng.uniform(40, 215, 3), rng.uniform(40, 215, 3)
    ramp = np.linspace(0, 1, size)[:, None, None]
    image = start + (end - start) * (ramp if rng.random() < 0.5 else ramp.transpose(1, 0, 2))
    image = np.broadcast_to(image, (size, size, 3)) + rng.normal(0, 8, (size, size, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def contrasting_colour(rng: np.random.Generator, against: np.ndarray) -> tuple[int, int, int]:
    """A colour at least 120 away (Euclidean, RGB) from the mean colour ``against``."""
    for _ in range(100):
        colour = rng.integers(0, 256, 3)
        if np.linalg.norm(colour - against) >= 120:
            break
    return tuple(int(c) for c in colour)


def draw_image(
    rng: np.random.Generator, spec: ShapesSpec
) -> tuple[Image.Image, list[tuple[int, np.ndarray]]]:
    """One image and its shapes ``(class index, polygon)``; shapes' bounding squares never overlap."""
    size = spec.img_size
    image = Image.fromarray(background(rng, size))
    draw, placed, shapes = ImageDraw.Draw(image), [], []
    for _ in range(int(rng.integers(spec.min_shapes, spec.max_shapes + 1))):
        for _attempt in range(50):
            side = rng.uniform(spec.min_size, spec.max_size)
            x0, y0 = rng.uniform(0, size - side, 2)
            box = (x0, y0, x0 + side, y0 + side)
            if all(box[2] <= b[0] or b[2] <= box[0] or box[3] <= b[1] or b[3] <= box[1] for b in placed):
                break
        else:
            continue  # no room left
        placed.append(box)
        label = int(rng.integers(len(CLASSES)))
        xy = polygon(CLASSES[label], x0 + side / 2, y0 + side / 2, side / 2, rng.uniform(0, 2 * math.pi))
        region = np.asarray(image)[int(y0) : int(y0 + side), int(x0) : int(x0 + side)]
        draw.polygon([tuple(p) for p in xy], fill=contrasting_colour(rng, region.reshape(-1, 3).mean(0)))
        shapes.append((label, xy))
    return image, shapes


def annotation(ann_id: int, image_id: int, category_id: int, xy: np.ndarray) -> dict[str, Any]:
    """A COCO instance annotation: polygon, ``[x, y, w, h]`` box, area, not a crowd."""
    x0, y0 = xy.min(0)
    x1, y1 = xy.max(0)
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "segmentation": [[round(float(v), 2) for v in xy.reshape(-1)]],
        "area": round(polygon_area(xy), 2),
        "bbox": [round(float(v), 2) for v in (x0, y0, x1 - x0, y1 - y0)],
        "iscrowd": 0,
    }


def write_split(
    root: Path,
    split: str,
    count: int,
    spec: ShapesSpec,
    categories: list[dict[str, Any]],
    shape_ids: Sequence[int],
    first_id: int,
) -> dict[str, Any]:
    """Write ``count`` images of ``split`` under ``root`` and return its COCO annotation dict."""
    rng = np.random.default_rng([spec.seed, list(SPLITS).index(split)])
    folder = root / SPLITS[split]
    folder.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for image_id in range(first_id, first_id + count):
        image, shapes = draw_image(rng, spec)
        name = f"{image_id:012d}.jpg"
        image.save(folder / name, quality=95)
        images.append({"id": image_id, "file_name": name, "height": spec.img_size, "width": spec.img_size})
        for label, xy in shapes:
            annotations.append(annotation(len(annotations) + 1, image_id, shape_ids[label], xy))
    return {
        "info": {"description": "COCO shapes (generated)", "generator": dataclasses.asdict(spec)},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }


def write_coco_shapes(
    root: Path,
    spec: ShapesSpec = ShapesSpec(),
    categories: list[dict[str, Any]] | None = None,
    shape_ids: Sequence[int] | None = None,
) -> None:
    """Write both splits in COCO's layout under ``root``. ``categories`` (default: the three
    shape classes) is the file's category list; ``shape_ids`` the category id each shape class
    of :data:`CLASSES` is written as (default: 1, 2, 3)."""
    categories = categories or default_categories()
    shape_ids = list(shape_ids or range(1, len(CLASSES) + 1))
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    counts = {"train": spec.num_train, "val": spec.num_val}
    first_id = 1
    for split, count in counts.items():
        coco = write_split(root, split, count, spec, categories, shape_ids, first_id)
        first_id += count
        path = root / "annotations" / f"instances_{SPLITS[split]}.json"
        atomic.write_text(path, json.dumps(coco))  # the annotation file appears last: the split is complete


def ensure_coco_shapes(root: Path, spec: ShapesSpec) -> None:
    """The set of ``spec`` under ``root``, generated unless it is there; its spec is kept in
    ``generator.json`` and another spec generates it again (:mod:`src.engine.generated`)."""
    annotations = [root / "annotations" / f"instances_{folder}.json" for folder in SPLITS.values()]

    def damage(saved: dict) -> str | None:
        missing = [str(p.relative_to(root)) for p in annotations if not p.is_file()]
        return f"missing {', '.join(missing)}" if missing else None

    what = f"COCO shapes ({spec.num_train:,} train / {spec.num_val:,} val images, {spec.img_size} px)"
    ensure_generated(
        root / MARKER, dataclasses.asdict(spec), lambda: write_coco_shapes(root, spec), damage, what=what
    )


def generated_with(root: Path) -> ShapesSpec | None:
    """The spec the set under ``root`` was generated with, or None."""
    saved = read_marker(root / MARKER)
    try:
        return ShapesSpec(**saved) if saved is not None else None
    except TypeError:  # a marker of other options
        return None
