"""Text, Retrieval, Image and Pathfinder read small files in their official formats into the
documented tokens, masks and labels; padding and masks; the missing-file messages."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from scipy import ndimage
from smoke.lra import write_aan, write_acl_imdb, write_cifar

from src.errors import ConfigError, DataError
from tasks.lra import Image, Pathfinder, Retrieval, Text, pad_batch, pathfinder
from tasks.lra.images import pathfinder_index

COMMON = dict(input="sequence", batch_size=4, eval_batch_size=4)


def as_bytes(text: str, limit: int) -> list[int]:
    return [b + 1 for b in text.encode("utf-8")[:limit]]


# -- padding ---------------------------------------------------------------------------------


def test_padding_and_masks_follow_the_lengths():
    seqs = [torch.tensor([5, 0, 7]), torch.tensor([], dtype=torch.long), torch.tensor([1, 2, 3, 4, 5])]
    tokens, mask = pad_batch(seqs, 6)
    assert tokens.shape == (3, 6) and mask.sum(1).tolist() == [3, 1, 5]  # an empty sequence keeps position 0
    assert tokens[0, :3].tolist() == [5, 0, 7] and mask[0, 1]  # id 0 inside a sequence is a token (pixel 0)
    assert (tokens[~mask] == 0).all()
    assert pad_batch(seqs, None)[0].shape == (3, 5)  # pad_to=longest


def test_pad_length_below_max_length_is_a_config_error():
    with pytest.raises(ConfigError, match="pad_length"):
        Text(name="lra_text", folder=".", num_classes=2, max_length=64, pad_length=32, **COMMON)


# -- Text --------------------------------------------------------------------------------------


def test_imdb_reviews_become_bytes_and_val_is_the_test_split(tmp_path):
    written = write_acl_imdb(tmp_path / "aclImdb", per_class=3)
    task = Text(name="lra_text", folder=".", num_classes=2, max_length=50, pad_length=64, **COMMON)
    train, val = task.datasets(tmp_path)
    assert len(train) == len(val) == 6
    for dataset, split in ((train, "train"), (val, "test")):
        got = sorted((seq.tolist(), label) for seq, label in dataset)
        assert got == sorted((as_bytes(text, 50), label) for text, label in written[split])
    tokens, mask, labels = task.collate_fn([train[i] for i in range(4)])
    assert tokens.shape == (4, 64) and int(tokens.max()) <= 256 and mask.sum(1).max() <= 50


@pytest.mark.parametrize("layout", ["save_to_disk", "parquet"])
def test_hugging_face_copies_of_imdb_read_the_same(tmp_path, layout):
    import datasets

    written = write_acl_imdb(tmp_path / "acl" / "aclImdb", per_class=2)
    splits = {
        split: datasets.Dataset.from_dict({"text": [t for t, _ in rows], "label": [y for _, y in rows]})
        for split, rows in written.items()
    }
    if layout == "save_to_disk":
        datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hf" / "imdb"))
    else:
        for split, table in splits.items():
            (tmp_path / "hf" / "imdb" / "plain_text").mkdir(parents=True, exist_ok=True)
            table.to_parquet(str(tmp_path / "hf" / "imdb" / "plain_text" / f"{split}-00000-of-00001.parquet"))
    task = Text(name="lra_text", folder=".", num_classes=2, max_length=30, pad_length=30, **COMMON)
    for ours, reference in zip(task.datasets(tmp_path / "hf"), task.datasets(tmp_path / "acl"), strict=True):
        assert sorted((s.tolist(), y) for s, y in ours) == sorted((s.tolist(), y) for s, y in reference)


def test_missing_imdb_names_both_layouts(tmp_path):
    task = Text(name="lra_text", folder=".", num_classes=2, max_length=30, pad_length=30, **COMMON)
    with pytest.raises(DataError, match=r"aclImdb.*imdb.*aclImdb_v1\.tar\.gz"):
        task.datasets(tmp_path)


# -- Retrieval --------------------------------------------------------------------------------


def test_aan_pairs_give_two_padded_documents(tmp_path):
    written = write_aan(tmp_path / "tsv_data", rows=5)
    task = Retrieval(
        name="lra_retrieval", folder="tsv_data", num_classes=2, max_length=40, pad_length=48, **COMMON
    )
    train, val = task.datasets(tmp_path)
    assert len(train) == len(val) == 5 and task.dual
    for (first, second, label), (y, a, b) in zip(train, written["train"], strict=True):
        assert (first.tolist(), second.tolist(), label) == (as_bytes(a, 40), as_bytes(b, 40), y)
    batch = task.collate_fn([train[i] for i in range(3)])
    assert len(batch) == 5 and batch[0].shape == batch[2].shape == (3, 48)
    assert batch[1].sum(1).tolist() == [len(as_bytes(a, 40)) for _, a, _ in written["train"][:3]]
    assert batch[3].sum(1).tolist() == [len(as_bytes(b, 40)) for _, _, b in written["train"][:3]]
    assert len(task.model_inputs(batch)) == 4 and batch[4].tolist() == [0, 1, 0]


def test_missing_aan_file_names_it(tmp_path):
    task = Retrieval(
        name="lra_retrieval", folder="tsv_data", num_classes=2, max_length=40, pad_length=48, **COMMON
    )
    with pytest.raises(DataError, match=r"tsv_data/new_aan_pairs\.train\.tsv.*lra_release/tsv_data"):
        task.datasets(tmp_path)


# -- Image --------------------------------------------------------------------------------------


def image_task(**kwargs) -> Image:
    return Image(
        name="lra_image",
        folder="cifar-10-batches-py",
        num_classes=10,
        max_length=1024,
        pad_length=1024,
        **COMMON,
        **kwargs,
    )


def test_cifar_is_grayscale_pixels_row_by_row_with_lras_splits(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    written = write_cifar(folder, per_batch=3)
    task = image_task(val_size=4)
    train, val = task.datasets(tmp_path)
    test = image_task(val_size=4, eval_split="test").datasets(tmp_path)[1]
    train_labels = np.concatenate([written[f"data_batch_{i}"][1] for i in range(1, 6)])
    assert (
        train.labels.tolist() == train_labels[:11].tolist()
        and val.labels.tolist() == train_labels[11:].tolist()
    )
    assert test.labels.tolist() == written["test_batch"][1].tolist()
    # One red pixel at row 2, column 5 of the first test image: token 2*32 + 5, value 0.2989*255.5 truncated.
    data = np.zeros((3, 3072), dtype=np.uint8)
    data[0, 2 * 32 + 5] = 255  # the red plane comes first
    data[1, :1024] = data[1, 1024:2048] = data[1, 2048:] = 255  # a white image
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": data, b"labels": [1, 2, 3]}, f, protocol=2)
    pixels = [seq for seq, _ in image_task(val_size=4, eval_split="test").datasets(tmp_path)[1]]
    assert (
        pixels[0].shape == (1024,)
        and pixels[0].nonzero().flatten().tolist() == [69]
        and int(pixels[0][69]) == 76
    )
    assert (pixels[1] == 255).all() and (pixels[2] == 0).all()
    tokens, mask, _ = task.collate_fn([train[0], train[1]])
    assert mask.all() and tokens.shape == (2, 1024)  # full length: no padding even where pixels are 0


class Payload:
    """What a crafted batch would carry: unpickling it runs a command."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_crafted_cifar_batch_runs_nothing_and_is_refused_by_name(tmp_path, protocol):
    write_cifar(tmp_path / "cifar-10-batches-py", 3)
    marker = tmp_path / "pwned"
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    with open(batch, "wb") as f:
        crafted = {b"data": np.zeros((3, 3072), np.uint8), b"labels": Payload(marker)}
        pickle.dump(crafted, f, protocol=protocol)
    with pytest.raises(DataError, match=rf"{batch} is not a CIFAR-10 batch: it refers to posix\.system"):
        image_task().datasets(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_batches_pickled_by_python_3_read_too(tmp_path, protocol):
    """The official batches are Python 2 pickles (bytes keys); a copy written from the format's
    description in Python 3 has str keys and NumPy arrays at any protocol."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (4, 3072), dtype=np.uint8)
        with open(folder / name, "wb") as f:
            batch = {"data": data, "labels": np.arange(4) % 10, "batch_label": name}
            pickle.dump(batch, f, protocol=protocol)
    train, val = image_task(val_size=4).datasets(tmp_path)
    assert len(train) == 16 and len(val) == 4 and train.labels.tolist() == [0, 1, 2, 3] * 4


def test_missing_cifar_names_the_python_release(tmp_path):
    task = image_task()
    with pytest.raises(DataError, match=r"cifar-10-batches-py/data_batch_1.*cifar-10-python\.tar\.gz"):
        task.datasets(tmp_path)


# -- Pathfinder ---------------------------------------------------------------------------------


def markers_connected(image: np.ndarray) -> bool:
    """An evaluator from the picture alone: find the two 3×3 markers, then walk the ink from one,
    stepping over gaps of at most one pixel, and say whether the walk reaches the other."""
    ink = image > 127
    centres, count = ndimage.label(ndimage.binary_erosion(ink, np.ones((3, 3))), np.ones((3, 3)))
    assert count == 2, f"expected 2 markers, found {count}"
    reachable = ndimage.binary_propagation(centres == 1, structure=np.ones((5, 5)), mask=ink)
    return bool((reachable & (centres == 2)).any())


def test_generated_pathfinder_labels_match_the_pictures(tmp_path):
    folder = pathfinder.write_release(tmp_path, 30, pathfinder.PathfinderSpec(), seed=2, per_folder=12)
    from PIL import Image as PILImage

    samples = pathfinder_index(folder)
    assert len(samples) == 30 and {label for _, label in samples} == {0, 1}
    assert sorted(p.parent.name for p in folder.glob("imgs/*/*.png"))[::12] == ["0", "1", "2"]
    for path, label in samples:
        image = np.asarray(PILImage.open(path))
        assert image.shape == (32, 32) and image.dtype == np.uint8
        assert markers_connected(image) == bool(label), path


def test_pathfinder_splits_80_10_10_and_skips_empty_images(tmp_path):
    folder = pathfinder.write_release(
        tmp_path, 40, pathfinder.PathfinderSpec(contour_length=6, distractors=1)
    )
    assert folder.name == "curv_baseline"
    (folder / "imgs" / "0" / "sample_7.png").write_bytes(b"")  # the release has a few empty files
    kwargs = dict(
        name="lra_pathfinder",
        folder="pathfinder32",
        difficulty="curv_baseline",
        num_classes=2,
        max_length=1024,
        pad_length=1024,
        **COMMON,
    )
    task = Pathfinder(**kwargs)
    parts = {split: task.load(tmp_path / "pathfinder32", split) for split in ("train", "val", "test")}
    assert [len(p) for p in parts.values()] in ([31, 4, 4], [32, 3, 4], [32, 4, 3])
    seen = np.concatenate([p.first for p in parts.values()])
    assert len(np.unique(seen, axis=0)) == 39 and seen.shape[1] == 1024  # disjoint, all but the empty one


def test_missing_pathfinder_names_the_layout(tmp_path):
    task = Pathfinder(
        name="lra_pathfinder",
        folder="pathfinder32",
        num_classes=2,
        max_length=1024,
        pad_length=1024,
        **COMMON,
    )
    with pytest.raises(DataError, match=r"curv_contour_length_14/metadata/\*\.npy.*lra_release"):
        task.datasets(tmp_path)
