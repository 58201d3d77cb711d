"""Your own ImageFolder (``task=imagefolder``): the folder read, its label, and the recipe sized to it.

Torch-free, because the config reads it while it composes, before torch is imported: the number of
classes (``task.num_classes``), the run's label (``task.name``: ``imagefolder-<folder name>``, which
names the run folder, the log lines, the W&B group and the report's rows) and the recipe
(:func:`recipe`: batch size, epochs, augmentation, workers), through the resolver
``${image_folder:KEY,${task.data_dir},${trainer.device}}`` (:func:`resolve`, registered by
:mod:`src.resolvers`). The task (``tasks.classification.ImageFolderTask``) reads the same scan and
the same split (:func:`split`), so the classes and images the recipe counted are the ones trained on.

Layout: ``DIR/train/<class>/<image>`` and, where they exist, ``DIR/val/<class>/<image>`` and
``DIR/test/<class>/<image>`` (the ImageFolder layout; classes are the sorted subfolder names, as
torchvision's ``ImageFolder``). Without ``val/``, validation is a stratified ``val_fraction`` of
``train/``; without ``test/``, the held-out test split is a stratified ``test_fraction`` of what
``train/`` has left (:func:`hold_out`). Both are drawn with a fixed split seed, the same for every
run seed, so that the seeds of a sweep are paired on the same images.
"""

from __future__ import annotations

import functools
import math
import os
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from src.errors import DataError
from src.labels import labelled

IMAGE_SUFFIXES = frozenset({".jpeg", ".jpg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"})
#: the label's prefix: a folder named like a task of the suite (``imagenet``) stays apart from it
PREFIX = "imagefolder"
#: the folders beside ``train/`` that hold images out of training, where they exist
HELD_OUT = ("val", "test")


@dataclass(frozen=True)
class Scan:
    """What an image folder holds: its classes (sorted) and, per class, its image files (sorted
    names) under ``train/`` and, where there are, ``val/`` and ``test/`` (None: no such folder)."""

    root: Path
    classes: tuple[str, ...]
    train: tuple[tuple[str, ...], ...]
    val: tuple[tuple[str, ...], ...] | None
    test: tuple[tuple[str, ...], ...] | None = None

    @property
    def images(self) -> int:
        """The images under ``train/`` (what the recipe is sized by, before any split)."""
        return sum(len(files) for files in self.train)


def layout(root: Path | str) -> str:
    """The layout a folder must have, for the one-line refusals."""
    return (
        f"expected {root}/train/<class>/<image> (one folder per class; .jpg, .png, … images) and, "
        f"optionally, {root}/val/<class>/<image> and {root}/test/<class>/<image> with the same class folders"
    )


def images_in(folder: Path) -> tuple[str, ...]:
    """The image files directly in ``folder``, by name."""
    return tuple(sorted(e.name for e in os.scandir(folder) if Path(e.name).suffix.lower() in IMAGE_SUFFIXES))


def class_folders(split: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(split) if e.is_dir() and not e.name.startswith("."))


def scan(data_dir: Path | str | None) -> Scan:
    """The folder's classes and images, or a :class:`DataError` saying what it lacks: a missing
    ``train/``, no class folders, a class folder without images, ``val/`` with other classes."""
    if data_dir in (None, "", "None"):
        raise DataError(f"task=imagefolder needs task.data_dir=DIR: {layout('DIR')}")
    root = Path(str(data_dir)).expanduser().resolve()
    train = root / "train"
    if not train.is_dir():
        hint = " (task.data_dir is the folder above train/)" if root.name in HELD_OUT + ("train",) else ""
        raise DataError(f"task.data_dir={data_dir}: missing folder {train}{hint}; {layout(root)}")
    return _scan(root, _signature(root))


def _signature(root: Path) -> tuple:
    """What changes when images are added or removed: the mtimes of the split and class folders."""
    stamps = []
    for split in ("train", *HELD_OUT):
        folder = root / split
        if folder.is_dir():
            stamps.append((split, "", folder.stat().st_mtime_ns))
            stamps += [(split, e.name, e.stat().st_mtime_ns) for e in os.scandir(folder) if e.is_dir()]
    return tuple(sorted(stamps))


@functools.lru_cache(maxsize=8)
def _scan(root: Path, signature: tuple) -> Scan:
    """:func:`scan` once per folder and state (the config resolves its keys many times)."""
    classes = class_folders(root / "train")
    if not classes:
        raise DataError(f"no class folders in {root / 'train'}; {layout(root)}")
    train = tuple(images_in(root / "train" / c) for c in classes)
    empty = [c for c, files in zip(classes, train, strict=True) if not files]
    if empty:
        raise DataError(
            f"no images in {root / 'train' / empty[0]} ({len(empty)} empty class folders); {layout(root)}"
        )
    held = {split: _held_out_folder(root, split, classes) for split in HELD_OUT}
    return Scan(root, tuple(classes), train, held["val"], held["test"])


def _held_out_folder(root: Path, split: str, classes: list[str]) -> tuple[tuple[str, ...], ...] | None:
    """``split``'s images per class (``val/``, ``test/``), None without the folder; a
    :class:`DataError` where its class folders are not ``train/``'s or hold no image."""
    if not (root / split).is_dir():
        return None
    found = class_folders(root / split)
    if found != classes:
        other = sorted(set(found) ^ set(classes))
        raise DataError(
            f"{root}: train/ and {split}/ have different class folders "
            f"(in one only: {', '.join(other[:5])}); {layout(root)}"
        )
    files = tuple(images_in(root / split / c) for c in classes)
    if not any(files):
        raise DataError(f"no images in the class folders of {root / split}; {layout(root)}")
    return files


def label(data_dir: Path | str | None) -> str:
    """``imagefolder-<folder name>`` (``imagefolder`` without one): the run's ``task.name``
    (:func:`labelled`)."""
    if data_dir in (None, "", "None"):
        return PREFIX
    return labelled(PREFIX, Path(str(data_dir)).expanduser().resolve().name)


def split(files: tuple[tuple[str, ...], ...], fraction: float, seed: int = 0) -> tuple[list, list]:
    """A stratified split of each class's files into ``(train, val)``, lists of per-class lists:
    ``round(fraction · n)`` of a class's ``n`` files validate (at least one, and one left to train
    on, where the class has two), drawn by ``seed`` and the class's position alone, so the split is
    the same for every run seed and every machine."""
    train, val = [], []
    for index, names in enumerate(files):
        n = len(names)
        k = min(max(round(fraction * n), 1), n - 1) if n >= 2 else 0
        chosen = set(random.Random(f"{seed}/{index}").sample(range(n), k))
        val.append([f for i, f in enumerate(names) if i in chosen])
        train.append([f for i, f in enumerate(names) if i not in chosen])
    return train, val


def hold_out(
    files: tuple[tuple[str, ...], ...], val_fraction: float | None, test_fraction: float | None, seed: int = 0
) -> tuple[list, list | None, list | None]:
    """``(train, val, test)`` per-class lists of ``train/``'s files: validation a stratified
    ``val_fraction`` (:func:`split`; None: not drawn, ``val/`` holds it), then test a stratified
    ``test_fraction`` of the images (None or 0: none), drawn from what validation left with its
    own stream of ``seed``; every class keeps at least one image to train on."""
    if val_fraction is None:
        train, val = [list(f) for f in files], None
    else:
        train, val = split(files, val_fraction, seed)
    if not test_fraction:
        return train, val, None
    test = []
    for index, (names, left) in enumerate(zip(files, train, strict=True)):
        k = min(max(round(test_fraction * len(names)), 1), len(left) - 1) if len(left) >= 2 else 0
        chosen = set(random.Random(f"{seed}/test/{index}").sample(range(len(left)), k))
        test.append([f for i, f in enumerate(left) if i in chosen])
        train[index] = [f for i, f in enumerate(left) if i not in chosen]
    return train, val, test


@dataclass(frozen=True)
class Recipe:
    """The training recipe :func:`recipe` sizes; every field is a key of ``conf/task/imagefolder.yaml``."""

    batch_size: int
    max_epochs: int
    warmup_epochs: int
    auto_augment: str | None  # timm's RandAugment string, None: crop and flip only
    re_prob: float  # random erasing
    mixup_alpha: float
    cutmix_alpha: float
    num_workers: int
    lr: float  # AdamW's peak learning rate (optim.lr)


#: the learning rate at batch :data:`BASE_BATCH`, scaled by the square root of the batch (:func:`recipe`)
BASE_LR, BASE_BATCH = 1e-3, 128


#: the augmentation tiers by training images: (at least this many images, RandAugment, erasing, mixup, cutmix)
TIERS = (
    (0, None, 0.0, 0.0, 0.0),  # a few thousand images: random-resized crop and flip
    (5_000, "rand-m7-mstd0.5-inc1", 0.1, 0.2, 0.0),
    (100_000, "rand-m9-mstd0.5-inc1", 0.25, 0.8, 1.0),  # DeiT's (task=imagenet's)
)


def recipe(images: int, gpu: bool, cpus: int) -> Recipe:
    """The recipe for ``images`` training images on a GPU (``gpu``) or a CPU with ``cpus`` usable CPUs.

    * batch: the power of two nearest below ``images / 16`` (at least 16 steps an epoch), within
      [16, 128], and no more than the images;
    * epochs: about 100,000 images seen, within [10, 300] (300: DeiT's), warm-up a 20th of them;
    * augmentation: the tier of :data:`TIERS` the images reach: light under 5,000 (crop and flip),
      RandAugment m7 with a little erasing and mixup up to 100,000, DeiT's from there;
    * workers: none under 1,000 images (start-up costs more than decoding), else up to 8 on a GPU
      and 2 on a CPU (where they share the cores the model trains on), at most ``cpus - 1``;
    * learning rate: :data:`BASE_LR` at batch :data:`BASE_BATCH` (a small ViT from scratch with
      AdamW), times ``sqrt(batch / 128)``: the square-root rule timm's ``train.py`` applies to
      adaptive optimizers when it scales a learning rate by the batch (3.5e-4 at batch 16).

    The device sizes only the workers, which are out of the run's identity: batch, epochs and
    augmentation follow the data alone, so the same command on another machine (a requeue on
    another node, a CPU check of a GPU run) is the same run and resumes it."""
    if images < 1:
        raise ValueError(f"recipe: {images} images")
    batch = min(max(2 ** int(math.log2(max(images / 16, 1))), 16), 128, 2 ** int(math.log2(images)))
    epochs = min(max(round(100_000 / images), 10), 300)
    _, auto_augment, re_prob, mixup, cutmix = [t for t in TIERS if images >= t[0]][-1]
    workers = 0 if images < 1_000 else min(8 if gpu else 2, max(cpus - 1, 0))
    lr = BASE_LR * math.sqrt(batch / BASE_BATCH)
    return Recipe(batch, epochs, max(epochs // 20, 1), auto_augment, re_prob, mixup, cutmix, workers, lr)


def has_gpu(device: str) -> bool:
    """Whether ``trainer.device`` trains on a GPU; ``auto`` asks torch where it is already imported
    (in a run), else looks for an NVIDIA device the process may use (before torch, in the precheck:
    it sizes the workers only)."""
    if device != "auto":
        return str(device).startswith("cuda")
    if "torch" in sys.modules:
        return bool(sys.modules["torch"].cuda.is_available())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible not in ("", "-1") and os.path.exists("/dev/nvidia0")


def resolve(key: str, data_dir: str | None, device: str = "auto", cpus: int = 1) -> object:
    """``${image_folder:KEY,${task.data_dir},${trainer.device}}`` (:mod:`src.resolvers` adds the usable
    ``cpus``): ``num_classes``, ``images`` (training images before a split) or a :class:`Recipe`
    field, for the folder."""
    found = scan(data_dir)
    if key == "num_classes":
        return len(found.classes)
    if key == "images":
        return found.images
    sized = asdict(recipe(found.images, has_gpu(device), cpus))
    if key not in sized:
        raise KeyError(f"image_folder: no key {key!r} (num_classes, images, {', '.join(sized)})")
    return sized[key]
