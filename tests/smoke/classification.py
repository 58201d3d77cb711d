"""Digits needs no data (scikit-learn ships it); ImageNet and imagefolder get a generated ImageFolder."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import make_image_folder
from torch import Tensor

TINY_IMAGENET = [
    "task.img_size=32",
    "task.batch_size=4",
    "task.eval_batch_size=4",
    "task.num_classes=3",
    "task.repeated_aug=0",  # 12 images: DeiT's repeated epoch rounds down to 256s (tests/engine/test_data.py)
    "trainer.num_workers=0",
]

#: task=imagefolder on the same folder (train/ and val/), its recipe sized to it (12 images: batch 8)
TINY_IMAGEFOLDER = ["task.data_dir=${paths.data_dir}/imagenet", "task.eval_batch_size=4"]

OVERRIDES = {"digits": [], "imagenet": TINY_IMAGENET, "imagefolder": TINY_IMAGEFOLDER}
#: full-size backbones build and step on the meta device in ImageNet's configuration; on the others
#: (imagefolder: its recipe reads a folder) they compose
FULL_SIZE_STEPS_ON = ["imagenet"]

#: the full-size backbones' one real step: ViT-B/16 on the tiny ImageFolder, the DeiT recipe
FULL_SIZE_STEP = "paper/imagenet"
#: each full-size backbone's depth, heads and stages at 2-4 channels per head
REDUCED_WIDTH = {
    "vit_base": ["++backbone.model.embed_dim=24"],  # 12 heads of 2
    "deit_base": ["++backbone.model.embed_dim=24"],
    "swin_base": ["++backbone.model.embed_dim=16"],  # stages of 4, 8, 16, 32 heads of 4
    "davit_base": ["++backbone.model.embed_dims=[16,32,64,128]"],  # the same
    "xcit_medium": ["++backbone.model.embed_dim=16"],  # 8 heads of 2
}


def prepare(data_dir: Path) -> None:
    make_image_folder(data_dir)


def synthetic_batch(task, size: int = 2) -> tuple[tuple[Tensor, Tensor], tuple[int, ...]]:
    """``(images (B, C, H, W), labels (B,))`` of the task's sizes on the default device, and the
    logits' shape ``(B, num_classes)``. Two images: mixup needs an even batch."""
    images = torch.randn(size, task.in_chans, task.img_size, task.img_size)
    labels = torch.randint(0, task.num_classes, (size,))
    return (images, labels), (size, task.num_classes)
