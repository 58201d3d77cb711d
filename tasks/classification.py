"""Image classification: the embedded digits task and ImageNet with the DeiT recipe.

Both train a timm backbone (``backbone.model``) with cross-entropy and report top-1
accuracy as ``val/acc`` (the main metric) and the loss as ``val/loss``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, Mixup, create_transform
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch import Tensor, nn
from torch.utils.data import Dataset, TensorDataset

from src.engine.task import ClassificationTask
from src.errors import DataError


class ImageClassification(ClassificationTask):
    """A timm backbone, cross-entropy (soft targets under mixup/cutmix), top-1 accuracy."""

    def __init__(
        self,
        img_size: int,
        in_chans: int,
        num_classes: int,
        label_smoothing: float = 0.0,
        mixup: dict[str, Any] | DictConfig | None = None,
        **common: Any,
    ) -> None:
        super().__init__(**common)
        self.img_size, self.in_chans, self.num_classes = img_size, in_chans, num_classes
        mixup = OmegaConf.to_container(mixup) if isinstance(mixup, DictConfig) else mixup
        self.mixup = (
            Mixup(**mixup, label_smoothing=label_smoothing, num_classes=num_classes) if mixup else None
        )
        if self.mixup is not None:
            self.criterion: nn.Module = SoftTargetCrossEntropy()
        elif label_smoothing:
            self.criterion = LabelSmoothingCrossEntropy(label_smoothing)
        else:
            self.criterion = nn.CrossEntropyLoss()

    def logits(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        return mean_logits(model(batch[0]))

    def train_loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        images, labels = batch
        if self.mixup is not None:
            images, labels = self.mixup(images, labels)
        return self.criterion(mean_logits(model(images)), labels)


def mean_logits(output: Tensor | tuple[Tensor, ...]) -> Tensor:
    """A distilled DeiT returns (class, distillation) logits in training: average them."""
    return sum(output) / len(output) if isinstance(output, tuple) else output


class Digits(ImageClassification):
    """scikit-learn's 8×8 handwritten digits (1,797 images, shipped with the package).

    A fixed stratified split (``val_fraction``, drawn with seed 0 whatever the run's seed),
    pixels scaled to [0, 1] and standardised with the training set's mean and std.
    """

    def __init__(self, val_fraction: float = 0.2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.val_fraction = val_fraction

    def datasets(self, data_dir: Path) -> tuple[Dataset, Dataset]:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
        labels = torch.tensor(digits.target, dtype=torch.long)
        train_idx, val_idx = train_test_split(
            range(len(labels)), test_size=self.val_fraction, random_state=0, stratify=digits.target
        )
        mean, std = images[train_idx].mean(), images[train_idx].std()
        images = (images - mean) / std
        train = TensorDataset(images[train_idx], labels[train_idx])
        val = TensorDataset(images[val_idx], labels[val_idx])
        train.draws_random = val.draws_random = False  # no augmentation: the loop skips per-sample seeding
        return train, val


IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}


class ImageNet(ImageClassification):
    """ImageNet-1k in the ImageFolder layout, ``<data_dir>/<folder>/{train,val}/<class>/<image>``,
    with timm's transforms: the DeiT recipe's RandAugment, random erasing and bicubic
    resizing in training (``augment``), a centre crop in evaluation."""

    def __init__(
        self,
        folder: str = "imagenet",
        augment: dict[str, Any] | DictConfig | None = None,
        crop_pct: float = 0.875,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.folder, self.crop_pct = folder, crop_pct
        self.augment = (
            OmegaConf.to_container(augment) if isinstance(augment, DictConfig) else dict(augment or {})
        )

    def datasets(self, data_dir: Path) -> tuple[Dataset, Dataset]:
        from torchvision.datasets import ImageFolder

        root = Path(data_dir) / self.folder
        check_image_folder(root)
        common = {
            "input_size": (self.in_chans, self.img_size, self.img_size),
            "mean": IMAGENET_DEFAULT_MEAN,
            "std": IMAGENET_DEFAULT_STD,
        }
        train = ImageFolder(
            str(root / "train"),
            transform=create_transform(is_training=True, **common, **self.augment),
            loader=read_image,
        )
        val = ImageFolder(
            str(root / "val"),
            loader=read_image,
            transform=create_transform(
                is_training=False,
                crop_pct=self.crop_pct,
                interpolation=self.augment.get("interpolation", "bilinear"),
                **common,
            ),
        )
        if train.classes != val.classes:
            raise DataError(
                f"{root}: train/ and val/ have different class folders "
                f"({len(train.classes)} and {len(val.classes)}); both need the same <class> names"
            )
        if len(train.classes) > self.num_classes:
            raise DataError(
                f"{root}: {len(train.classes)} class folders but task.num_classes={self.num_classes}"
            )
        return train, val


def read_image(path: str):
    """An RGB image, or a :class:`DataError` naming the file that cannot be decoded."""
    from torchvision.datasets.folder import default_loader

    try:
        return default_loader(path)
    except (OSError, ValueError) as error:  # PIL: truncated, not an image, unsupported
        raise DataError(f"cannot read image {path} ({error}); replace or remove the file") from error


def check_image_folder(root: Path) -> None:
    """Fail with one message naming the folder and the layout expected."""
    layout = (
        f"expected {root}/train/<class>/<image> and {root}/val/<class>/<image> "
        "(the ImageFolder layout; for ImageNet-1k, val/ sorted into its 1,000 class folders). "
        "Set paths.data_dir (or DATA_DIR) to the folder that holds it"
    )
    for split in ("train", "val"):
        folder = root / split
        if not folder.is_dir():
            raise DataError(f"missing data folder {folder}: {layout}")
        classes = [d for d in folder.iterdir() if d.is_dir()]
        if not classes or not any(f.suffix.lower() in IMAGE_SUFFIXES for d in classes for f in d.iterdir()):
            raise DataError(f"no images in class folders under {folder}: {layout}")
