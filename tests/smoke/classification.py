"""Digits needs no data (scikit-learn ships it); ImageNet gets a generated ImageFolder."""

from __future__ import annotations

from pathlib import Path

from conftest import make_image_folder

TINY_IMAGENET = [
    "task.img_size=32",
    "task.batch_size=4",
    "task.eval_batch_size=4",
    "task.num_classes=3",
    "trainer.num_workers=0",
]

OVERRIDES = {"digits": [], "imagenet": TINY_IMAGENET}


def prepare(data_dir: Path) -> None:
    make_image_folder(data_dir)
