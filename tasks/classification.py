"""Image classification: the embedded digits task, ImageNet with the DeiT recipe, and your own
ImageFolder with a recipe sized to it (:class:`ImageFolderTask`, ``task=imagefolder``).

Both train a timm backbone (``backbone.model``) with cross-entropy and report top-1
accuracy as ``val/acc`` (the main metric) and the loss as ``val/loss``. ImageNet's images leave
the loader as uint8 and are normalised (and randomly erased, in training) on the device, as
timm's ``PrefetchLoader`` does (:meth:`ImageNet.on_device`); its RandAugment is timm's with
posterize made safe for Pillow ≥ 13 (:func:`safe_augment`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, Mixup, auto_augment, create_transform
from timm.data.random_erasing import RandomErasing
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch import Tensor, nn
from torch.utils.data import Dataset, TensorDataset

from src import image_folder
from src.engine.task import ClassificationTask, held_out_share
from src.errors import DataError

log = logging.getLogger(__name__)


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

    def example_inputs(self, device: str | torch.device = "cpu") -> tuple[Tensor]:
        return (torch.zeros(1, self.in_chans, self.img_size, self.img_size, device=device),)  # (1, C, H, W)

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

    Three fixed stratified splits, drawn whatever the run's seed: ``val`` (``val_fraction`` of the
    images, seed 0: the same 360 images as before the test split existed), then ``test``
    (``test_fraction`` of all images, seed 1, from what is left) and the rest for training
    (1,078 images at 0.2 and 0.2). Validation serves everything chosen while runs go on (budgets,
    readings, best checkpoints, the settle loop's looks); ``test`` is evaluated once, when training
    ends (``trainer.test_after``), and the verdicts the README states are computed on it.
    ``test_fraction=0`` (or null) gives the older two-way split (1,437 training images, no test
    split); null also keeps the identity of runs recorded before the option existed (null values
    leave the identity, :mod:`src.engine.record.identity`), so their records resume.
    Pixels are scaled to [0, 1] and standardised with the training set's mean and std.
    """

    def __init__(self, val_fraction: float = 0.2, test_fraction: float | None = 0.2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        test_fraction = held_out_share(test_fraction, val_fraction, "images")
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.eval_splits = ("val", "test") if test_fraction else ("val",)

    def split_indices(self, labels: Any) -> dict[str, list[int]]:
        """``{"train", "val", "test"}`` → indices into the 1,797 images (``test`` empty at 0), as
        scikit-learn's ``train_test_split`` draws them; remembered per machine
        (:func:`remembered_split`), so that a run does not import scikit-learn (2 s) to draw the
        same indices again."""
        return remembered_split(labels, self.val_fraction, self.test_fraction, self.drawn_split)

    def drawn_split(self, labels: Any) -> dict[str, list[int]]:
        """:meth:`split_indices` drawn by scikit-learn."""
        from sklearn.model_selection import train_test_split

        rest, val = train_test_split(
            range(len(labels)), test_size=self.val_fraction, random_state=0, stratify=labels
        )
        if not self.test_fraction:
            return {"train": list(rest), "val": list(val), "test": []}
        held = round(self.test_fraction * len(labels))
        train, test = train_test_split(rest, test_size=held, random_state=1, stratify=labels[rest])
        return {"train": list(train), "val": list(val), "test": list(test)}

    def splits(self) -> dict[str, Dataset]:
        """The three splits as tensor data sets (``test`` only where ``test_fraction`` > 0)."""
        pixels, target = digits_arrays()
        images = torch.tensor(pixels, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0  # (N, 1, 8, 8)
        labels = torch.tensor(target, dtype=torch.long)
        index = self.split_indices(target)
        mean, std = images[index["train"]].mean(), images[index["train"]].std()
        images = (images - mean) / std
        sets = {name: TensorDataset(images[i], labels[i]) for name, i in index.items() if i}
        for data in sets.values():
            data.draws_random = False  # no augmentation: the loop skips per-sample seeding
        return sets

    def datasets(self, data_dir: Path) -> tuple[Dataset, Dataset]:
        sets = self.splits()
        return sets["train"], sets["val"]

    def eval_dataset(self, data_dir: Path, split: str) -> Dataset:
        self.check_split(split)
        return self.splits()[split]


def digits_arrays() -> tuple[Any, Any]:
    """``(pixels (1797, 64) in 0..16, labels (1797,))``: the file scikit-learn ships and its
    ``load_digits`` reads (``sklearn/datasets/data/digits.csv.gz``: 64 pixels and the label per
    row), found without importing scikit-learn."""
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(folders[0] if folders else "sklearn") / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise DataError(f"task=digits reads scikit-learn's {path}: not found; pip install scikit-learn")
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def remembered_split(
    labels: Any, val_fraction: float, test_fraction: float, draw: Callable[[Any], dict[str, list[int]]]
) -> dict[str, list[int]]:
    """``draw(labels)`` (a split of ``labels``' indices), kept in the user's cache folder
    (``$XDG_CACHE_HOME``, else ``~/.cache``, ``/conditioned-attention/digits/``) under the
    scikit-learn version, the fractions and the labels' digest, and read from there after. A file
    that cannot be read, or holds anything but the three splits' indices, is drawn again; it is
    written whole or not at all."""
    import hashlib
    import json
    import os
    from importlib.metadata import version

    digest = hashlib.sha256(bytes(memoryview(labels.astype("int64")))).hexdigest()[:16]
    name = f"split-{version('scikit-learn')}-{val_fraction}-{test_fraction or 0}-{digest}.json"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = cache / "conditioned-attention" / "digits" / name
    try:
        kept = json.loads(path.read_text())
        if set(kept) == {"train", "val", "test"} and all(
            type(i) is int and 0 <= i < len(labels) for index in kept.values() for i in index
        ):
            return kept
    except (OSError, ValueError, TypeError, AttributeError):  # no file, a torn or a foreign one
        pass
    split = draw(labels)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({k: [int(i) for i in v] for k, v in split.items()}))
        partial.replace(path)
    except OSError:
        pass
    return split


IMAGE_SUFFIXES = image_folder.IMAGE_SUFFIXES


class ImageNet(ImageClassification):
    """ImageNet-1k in the ImageFolder layout, ``<data_dir>/<folder>/{train,val}/<class>/<image>``,
    with timm's transforms: the DeiT recipe's RandAugment, random erasing and bicubic
    resizing in training (``augment``, the keys of timm's ``create_transform``), a centre crop in
    evaluation. The loader gives uint8 images ``(3, H, W)``; :meth:`on_device` normalises them with
    ImageNet's mean and std and, in training, erases at random (``augment``'s ``re_*``) there."""

    #: ImageNet-1k's training images (ILSVRC-2012; Russakovsky et al., 2015), for a plan
    train_size = 1_281_167

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
        self._normalise: dict[torch.device, tuple[Tensor, Tensor, RandomErasing | None]] = {}

    def transforms(self) -> tuple[Any, Any]:
        """``(train, eval)`` transforms: PIL image in, uint8 tensor ``(C, img_size, img_size)`` out."""
        size = {"input_size": (self.in_chans, self.img_size, self.img_size), "use_prefetcher": True}
        train = safe_augment(create_transform(is_training=True, **size, **self.augment))
        interpolation = self.augment.get("interpolation", "bilinear")
        val = create_transform(is_training=False, crop_pct=self.crop_pct, interpolation=interpolation, **size)
        return train, val

    def datasets(self, data_dir: Path) -> tuple[Dataset, Dataset]:
        from torchvision.datasets import ImageFolder

        root = Path(data_dir) / self.folder
        check_image_folder(root)
        train_transform, val_transform = self.transforms()
        train = ImageFolder(str(root / "train"), transform=train_transform, loader=read_image)
        val = ImageFolder(str(root / "val"), transform=val_transform, loader=read_image)
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

    def on_device(self, batch: tuple[Tensor, Tensor], train: bool) -> tuple[Tensor, Tensor]:
        """uint8 images ``(B, C, H, W)`` to float32 normalised with ImageNet's mean and std, and in
        training timm's random erasing after it (``augment.re_prob``, ``re_mode``, ``re_count``),
        on the batch's device; its draws come from the global RNGs, which checkpoints carry."""
        images, labels = batch
        if images.dtype != torch.uint8:  # already normalised (a batch built by hand)
            return batch
        mean, std, erasing = self._device_step(images.device)
        images = images.float().sub_(mean).div_(std)  # (B, C, H, W) float32
        if train and erasing is not None:
            images = erasing(images)
        return images, labels

    def _device_step(self, device: torch.device) -> tuple[Tensor, Tensor, RandomErasing | None]:
        if device not in self._normalise:
            shape = (1, -1, 1, 1)  # (1, C, 1, 1)
            mean = torch.tensor([255 * m for m in IMAGENET_DEFAULT_MEAN], device=device).view(shape)
            std = torch.tensor([255 * s for s in IMAGENET_DEFAULT_STD], device=device).view(shape)
            prob = self.augment.get("re_prob", 0.0)
            erasing = None
            if prob > 0:
                mode, count = self.augment.get("re_mode", "const"), self.augment.get("re_count", 1)
                erasing = RandomErasing(prob, mode=mode, max_count=count, device=device)
            self._normalise[device] = (mean, std, erasing)
        return self._normalise[device]


class ImageFiles(Dataset):
    """``(transform(image), label)`` for a list of ``(path, label)`` samples."""

    def __init__(self, samples: list[tuple[str, int]], transform: Any) -> None:
        self.samples, self.transform = samples, transform
        self.targets = [label for _, label in samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        path, label = self.samples[index]
        return self.transform(read_image(path)), label


class ImageFolderTask(ImageNet):
    """Your own ImageFolder, ``data_dir/train/<class>/<image>`` and ``data_dir/val/…``,
    ``data_dir/test/…`` where they exist (:mod:`src.image_folder`: the scan, the label, the recipe
    sized to it), trained as :class:`ImageNet` is (timm's transforms, uint8 to the device, normalised
    there). Without ``val/``, a stratified ``val_fraction`` of ``train/`` validates; without
    ``test/``, a stratified ``test_fraction`` of ``train/`` (from what validation left; 0 or null:
    no test split) is held out and evaluated once when training ends (``trainer.test_after``). Both
    are drawn with ``split_seed`` alone (:func:`src.image_folder.hold_out`), so every run seed trains,
    validates and tests on the same images. ``summary.json``'s ``statistics`` say which split it was
    (:meth:`statistics`); the log says it as the data is read."""

    def __init__(
        self,
        data_dir: str | None = None,
        val_fraction: float = 0.2,
        test_fraction: float | None = 0.1,
        split_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        mixup = kwargs.pop("mixup", None)
        if mixup and not (mixup.get("mixup_alpha") or mixup.get("cutmix_alpha")):
            mixup = None  # both alphas 0: no mixing (timm's Mixup refuses it)
        super().__init__(folder="", mixup=mixup, **kwargs)
        test_fraction = held_out_share(test_fraction, val_fraction, "images")
        self.data_dir, self.val_fraction, self.split_seed = data_dir, val_fraction, split_seed
        self.test_fraction = test_fraction
        self.split_statement: dict[str, Any] | None = None
        self._samples: dict[str, list[tuple[str, int]]] | None = None

    @property
    def train_size(self) -> int:
        """The images trained on, after the split (what ``launch.plan`` counts epochs with): read
        from the folder's listing, no image opened."""
        return (
            sum(self.split_statement["train_per_class"])
            if self.split_statement
            else len(self.samples()["train"])
        )

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """``val``, and ``test`` where the folder has ``test/`` or ``test_fraction`` holds images out
        (a class needs 3 images to give one to each split)."""
        return ("val", "test") if "test" in self.samples() else ("val",)

    def samples(self) -> dict[str, list[tuple[str, int]]]:
        """``{"train", "val"[, "test"]}`` → ``(path, label)`` lists; sets :attr:`split_statement`.
        The folder is listed once per task (training, each evaluation and the split checks ask
        for it; a large folder's listing takes seconds): one split for the whole run."""
        if self._samples is None:
            self._samples = self._listed_samples()
        return self._samples

    def _listed_samples(self) -> dict[str, list[tuple[str, int]]]:
        """:meth:`samples`' work: the folder scanned and split."""
        found = image_folder.scan(self.data_dir)
        if len(found.classes) != self.num_classes:
            raise DataError(
                f"{found.root}: {len(found.classes)} class folders but task.num_classes={self.num_classes} "
                "(leave num_classes to the folder)"
            )
        drawn = f"split seed {self.split_seed}"
        train, val, test = image_folder.hold_out(
            found.train,
            None if found.val is not None else self.val_fraction,
            None if found.test is not None else self.test_fraction,
            self.split_seed,
        )
        held = {
            "val": ("val", found.val, "val/")
            if found.val is not None
            else ("train", val, f"a stratified {self.val_fraction:g} of train/, {drawn}"),
            "test": ("test", found.test, "test/")
            if found.test is not None
            else ("train", test, f"a stratified {self.test_fraction:g} of train/, {drawn}"),
        }
        if held["test"][1] is None or not any(held["test"][1]):  # nothing held out: no test split
            del held["test"]

        def listed(folder: str, files: Any) -> list[tuple[str, int]]:
            root = found.root / folder
            return [(str(root / c / f), i) for i, c in enumerate(found.classes) for f in files[i]]

        def digest(files: Any) -> str:
            return files_digest(
                [f"{c}/{f}" for c, names in zip(found.classes, files, strict=True) for f in names]
            )

        self.split_statement = {"classes": list(found.classes), "train_per_class": [len(f) for f in train]}
        for split, (_, files, source) in held.items():
            self.split_statement |= {
                f"{split}_from": source,
                f"{split}_per_class": [len(f) for f in files],
                f"{split}_files": digest(files),
            }
        return {"train": listed("train", train)} | {s: listed(f, files) for s, (f, files, _) in held.items()}

    def datasets(self, data_dir: Path) -> tuple[Dataset, Dataset]:
        """The folder's ``(train, val)`` (``data_dir``, the suite's data root, is not read: the folder
        is ``task.data_dir``)."""
        found = self.samples()
        statement = self.split_statement
        test = f", {len(found['test'])} test" if "test" in found else ""
        log.info(
            "%s: %d classes, %d training, %d validation%s images; validation: %s%s",
            self.name,
            len(statement["classes"]),
            len(found["train"]),
            len(found["val"]),
            test,
            statement["val_from"],
            f"; test: {statement['test_from']}" if test else "",
        )
        train_transform, val_transform = self.transforms()
        return ImageFiles(found["train"], train_transform), ImageFiles(found["val"], val_transform)

    def eval_dataset(self, data_dir: Path, split: str) -> Dataset:
        """``val`` or ``test`` (``test/``, or the held-out share of ``train/``), read as validation is."""
        self.check_split(split)
        return ImageFiles(self.samples()[split], self.transforms()[1])

    def statistics(self, run_dir: Path) -> dict[str, Any] | None:
        """The split it trained on, for ``summary.json``: where validation (and test) came from, the
        classes, the images per class in each split and a digest of the held-out files' names."""
        if self.split_statement is None:
            self.samples()
        return {"split": self.split_statement}


def files_digest(names: list[str]) -> str:
    """A short digest of a list of file names (sorted): equal for the same validation images."""
    import hashlib

    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def posterize(img: Image.Image, bits_to_keep: int, **_: Any) -> Image.Image:
    """timm's posterize where Pillow ≥ 13 refuses to keep 0 bits (``bits must be between or equal to
    1 and 8``): RandAugment's ``PosterizeIncreasing`` asks for 0 when its magnitude, drawn around
    ``m`` with ``mstd``, clips at 10 (with DeiT's m9 mstd0.5, about one image in 700). 0 bits kept
    gives a black image: what Pillow < 13 returned (the mask keeps no bit) and TensorFlow's
    posterize, whose RandAugment timm follows, computes (a shift by 8). The recipe's magnitude
    stands; only the op Pillow refuses is done here."""
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)  # every channel 0
    return auto_augment.posterize(img, bits_to_keep)


def safe_augment(transform: Any) -> Any:
    """``transform`` with every timm augmentation op that posterizes (RandAugment's, AutoAugment's
    and AugMix's ops, searched through composed transforms) calling :func:`posterize`."""
    for op in augment_ops(transform):
        if op.aug_fn is auto_augment.posterize:
            op.aug_fn = posterize
    return transform


def augment_ops(transform: Any) -> list[auto_augment.AugmentOp]:
    """The timm augmentation ops inside a transform: a ``Compose``'s ``transforms``, RandAugment's
    and AugMix's ``ops``, AutoAugment's ``policy`` (sub-policies of ops)."""
    if isinstance(transform, auto_augment.AugmentOp):
        return [transform]
    if isinstance(transform, (list, tuple)):
        return [op for part in transform for op in augment_ops(part)]
    parts = [getattr(transform, name, None) for name in ("transforms", "ops", "policy")]
    return [op for part in parts if isinstance(part, (list, tuple)) for op in augment_ops(part)]


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
