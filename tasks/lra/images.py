"""Images as pixel sequences for LRA: grayscale CIFAR-10 (Image) and Pathfinder.

Both are ``32×32`` grayscale images read row by row into 1024 tokens, the pixel value
(0-255) being the token id (256 ids, no padding: every sequence is full length).

CIFAR-10, the python release ``cifar-10-batches-py/``: ``data_batch_1`` … ``data_batch_5``
and ``test_batch``, pickled dicts with ``data`` (``10000×3072`` uint8, the red, green and
blue planes of each image, row-major) and ``labels``. Grayscale as LRA's pipeline computes
it (``tf.image.rgb_to_grayscale`` on uint8): ``0.2989 R + 0.5870 G + 0.1140 B`` on [0, 1],
scaled back by 255.5 and truncated. LRA's splits: train is the first 45,000 training images,
val the last 5,000 (``val_size``), test the 10,000 test images.

Pathfinder, the release's ``pathfinder32/<difficulty>/`` (``curv_baseline``,
``curv_contour_length_9``, ``curv_contour_length_14``): ``imgs/<k>/sample_<i>.png`` and
``metadata/<k>.npy`` -- despite the suffix, text files with one line per image,
``<folder> <file> <index> <label> …`` (space-separated). Empty PNG files (a few in the
release) are skipped, as LRA does. LRA splits the images 80/10/10 into train, val and test;
here the split follows a fixed shuffle (seed 0, whatever the run's seed) of the images in
metadata order.
"""

from __future__ import annotations

import codecs
import pickle
from pathlib import Path

import numpy as np

from src.errors import DataError

np_core = np._core if hasattr(np, "_core") else np.core  # NumPy 2 renamed numpy.core
np_multiarray, np_numeric = np_core.multiarray, np_core.numeric

PIXEL_VOCAB_SIZE = 256
GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140])

CIFAR_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
CIFAR_HINT = (
    "CIFAR-10's python release (https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz, unpacked) puts "
    "data_batch_1..5 and test_batch in cifar-10-batches-py/; set paths.data_dir to the folder that holds it"
)
PATHFINDER_HINT = (
    "the official LRA release (https://storage.googleapis.com/long-range-arena/lra_release.gz) puts "
    "pathfinder32/<difficulty>/{metadata/*.npy,imgs/*/*.png} in lra_release/; set paths.data_dir to the "
    "folder that holds pathfinder32/, or generate a set in the same layout with "
    "`python -m tasks.lra.generate pathfinder <folder>`"
)


# -- CIFAR-10 ------------------------------------------------------------------------------


def read_cifar_batches(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """RGB images ``(n, 3, 32, 32)`` uint8 and labels ``(n,)`` of CIFAR-10's ``train`` or ``test`` files."""
    images, labels = [], []
    for name in CIFAR_FILES[split]:
        path = Path(folder) / name
        if not path.is_file():
            raise DataError(f"missing CIFAR-10 file {path}: {CIFAR_HINT}")
        batch = load_cifar_batch(path)
        data, targets = (_entry(batch, key, path) for key in ("data", "labels"))
        try:
            images.append(np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.append(np.asarray(targets, dtype=np.int64).reshape(-1))
        except (TypeError, ValueError) as error:
            message = f"{path}: 'data' must be N×3072 pixels and 'labels' N integers ({error})"
            raise DataError(message) from error
        if len(labels[-1]) != len(images[-1]):
            raise DataError(f"{path}: {len(images[-1])} images but {len(labels[-1])} labels")
    return np.concatenate(images), np.concatenate(labels)


class CifarUnpickler(pickle.Unpickler):
    """Unpickles what CIFAR-10's batches hold and nothing else: dicts, lists, bytes, numbers and
    NumPy arrays. Any other global a file names (``os.system``, a class whose ``__reduce__`` runs
    code) is refused before it is looked up, so a crafted batch can never execute anything."""

    ALLOWED = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,  # bytes, as Python 3 pickles them at protocol 2
        **{
            (f"numpy.{core}.multiarray", name): getattr(np_multiarray, name)
            for core in ("core", "_core")
            for name in ("_reconstruct", "scalar")
        },
        **{(f"numpy.{core}.numeric", "_frombuffer"): np_numeric._frombuffer for core in ("core", "_core")},
    }

    def find_class(self, module: str, name: str):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}") from None


def load_cifar_batch(path: Path) -> dict:
    """One pickled batch, read with :class:`CifarUnpickler`; a :class:`DataError` for anything else."""
    try:
        with open(path, "rb") as f:
            batch = CifarUnpickler(f, encoding="bytes").load()
    except pickle.UnpicklingError as error:
        raise DataError(
            f"{path} is not a CIFAR-10 batch: {error}, which the official batches never do; refused "
            f"without running it. {CIFAR_HINT}"
        ) from error
    except (EOFError, ValueError, TypeError, AttributeError, IndexError) as error:
        reason = f"{type(error).__name__}: {error}"
        raise DataError(f"{path} is damaged or not a CIFAR-10 batch ({reason})") from error
    if not isinstance(batch, dict):
        raise DataError(f"{path} is not a CIFAR-10 batch (a pickled {type(batch).__name__}, not a dict)")
    return batch


def _entry(batch: dict, key: str, path: Path):
    """``batch[b"data"]`` (the release, pickled by Python 2) or ``batch["data"]`` (a Python 3 copy)."""
    for candidate in (key.encode(), key):
        if candidate in batch:
            return batch[candidate]
    raise DataError(f"{path}: no '{key}' entry (it has {', '.join(map(repr, batch))}): {CIFAR_HINT}")


def to_grayscale(rgb: np.ndarray) -> np.ndarray:
    """``(n, 3, H, W)`` uint8 -> ``(n, H, W)`` uint8, as ``tf.image.rgb_to_grayscale`` on uint8."""
    gray = np.tensordot(GRAY_WEIGHTS, rgb.astype(np.float64) / 255.0, axes=([0], [1]))  # (n, H, W) in [0, 1]
    return np.clip(np.floor(gray * 255.5), 0, 255).astype(np.uint8)


def cifar_split(folder: Path, split: str, val_size: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    """Grayscale pixel sequences ``(n, 1024)`` uint8 and labels of LRA's ``train``, ``val`` or ``test``.

    ``val`` is the last ``val_size`` training images, ``train`` the ones before them.
    """
    rgb, labels = read_cifar_batches(folder, "test" if split == "test" else "train")
    if split != "test":
        if not 0 < val_size < len(labels):
            raise DataError(
                f"{folder}: val_size={val_size} must leave images for both train and val ({len(labels)})"
            )
        cut = len(labels) - val_size
        rgb, labels = (rgb[:cut], labels[:cut]) if split == "train" else (rgb[cut:], labels[cut:])
    return to_grayscale(rgb).reshape(len(labels), -1), labels


# -- Pathfinder ----------------------------------------------------------------------------


def pathfinder_index(folder: Path) -> list[tuple[Path, int]]:
    """``[(image path, label), …]`` from ``metadata/*.npy``, in metadata order (files by number)."""
    meta = Path(folder) / "metadata"
    files = sorted(meta.glob("*.npy"), key=lambda p: (int(p.stem) if p.stem.isdigit() else 0, p.name))
    if not files:
        raise DataError(f"no metadata files {meta}/*.npy: {PATHFINDER_HINT}")
    samples = []
    for path in files:
        for line, text in enumerate(path.read_text().splitlines(), start=1):
            fields = text.split()
            if not fields:
                continue
            if len(fields) < 4 or not fields[3].lstrip("-").isdigit():
                raise DataError(f"{path}:{line}: expected '<folder> <file> <index> <label> …', got {text!r}")
            samples.append((Path(folder) / fields[0] / fields[1], int(fields[3])))
    return samples


def read_pathfinder(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Pixel sequences ``(n, H*W)`` uint8 and labels of the ``train``, ``val`` or ``test`` part."""
    from PIL import Image

    samples = pathfinder_index(folder)
    order = np.random.default_rng(0).permutation(len(samples))
    cut = (int(0.8 * len(samples)), int(0.9 * len(samples)))
    chosen = {"train": order[: cut[0]], "val": order[cut[0] : cut[1]], "test": order[cut[1] :]}[split]
    pixels, labels = [], []
    for i in sorted(chosen):
        path, label = samples[i]
        if not path.is_file():
            raise DataError(f"{path} is listed in {folder / 'metadata'} but missing: {PATHFINDER_HINT}")
        if path.stat().st_size == 0:
            continue  # the release has a few empty images; LRA skips them
        with Image.open(path) as image:
            pixels.append(np.asarray(image.convert("L"), dtype=np.uint8).reshape(-1))
        labels.append(label)
    if not labels:
        raise DataError(f"{folder}: no images in the {split} split ({len(samples)} listed in metadata)")
    return np.stack(pixels), np.asarray(labels, dtype=np.int64)
