"""Digits' three splits: disjoint, stratified, fixed whatever the seed, validation unchanged by the
test split, and a bad fraction refused in one line."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from src.errors import ConfigError
from tasks.classification import Digits

COMMON = dict(
    name="digits", input="image", img_size=8, in_chans=1, num_classes=10, batch_size=64, eval_batch_size=512
)


def test_the_three_splits_are_disjoint_stratified_and_validation_is_the_two_way_splits():
    from sklearn.datasets import load_digits

    labels = load_digits().target
    three = Digits(**COMMON).split_indices(labels)
    two = Digits(**COMMON, test_fraction=0).split_indices(labels)
    sizes = {name: len(index) for name, index in three.items()}
    assert sizes == {"train": 1078, "val": 360, "test": 359}
    assert set(three["train"]) | set(three["val"]) | set(three["test"]) == set(range(1797))
    assert not set(three["train"]) & set(three["test"]) and not set(three["val"]) & set(three["test"])
    assert three["val"] == two["val"] and two["test"] == [] and len(two["train"]) == 1437
    everywhere = Counter(labels.tolist())
    for name in ("val", "test"):  # stratified: each class within one image of its share
        share = Counter(labels[three[name]].tolist())
        assert all(abs(share[c] - everywhere[c] * sizes[name] / 1797) <= 1 for c in everywhere)


def test_the_test_set_is_what_eval_dataset_gives_and_the_splits_name_it():
    task = Digits(**COMMON)
    test = task.eval_dataset(None, "test")
    train, val = task.datasets(None)
    assert task.eval_splits == ("val", "test") and len(test) == 359 and len(train) == 1078
    assert torch.equal(task.eval_dataset(None, "val").tensors[0], val.tensors[0])
    assert Digits(**COMMON, test_fraction=0).eval_splits == ("val",)
    with pytest.raises(ConfigError, match="has no 'test' split"):
        Digits(**COMMON, test_fraction=0).eval_dataset(None, "test")


@pytest.mark.parametrize("fraction", [0.8, 0.9, -0.1])
def test_a_test_fraction_that_leaves_nothing_to_train_is_refused(fraction):
    with pytest.raises(ConfigError, match=r"task.test_fraction=.* must be in \[0, 0.8\)"):
        Digits(**COMMON, test_fraction=fraction)


def test_a_run_reads_what_load_digits_gives_and_remembers_sklearns_split(tmp_path, monkeypatch):
    """The pixels and labels read from scikit-learn's file are ``load_digits``' own; the split is
    drawn by ``train_test_split`` once, then read from the cache folder (a second draw would
    fail here); a cache that cannot be read is drawn again and rewritten whole."""
    import numpy as np
    from sklearn.datasets import load_digits

    from tasks.classification import digits_arrays

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    pixels, labels = digits_arrays()
    reference = load_digits()
    assert np.array_equal(pixels, reference.data) and np.array_equal(labels, reference.target)
    task = Digits(**COMMON)
    drawn = task.drawn_split(labels)
    assert task.split_indices(labels) == drawn
    (remembered,) = (tmp_path / "conditioned-attention" / "digits").glob("split-*.json")
    monkeypatch.setattr(Digits, "drawn_split", lambda *_: pytest.fail("drawn again"))
    assert task.split_indices(labels) == drawn  # from the file
    other = Digits(**COMMON, test_fraction=0)
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert other.split_indices(labels)["val"] == drawn["val"]  # its own file: another key
    for foreign in ('{"train": [1, 2', '{"train": [], "val": [], "test": [1797]}', "[]", '{"a": 1}'):
        remembered.write_text(foreign)  # torn, out of range, not the splits
        assert task.split_indices(labels) == drawn and json.loads(remembered.read_text()) == drawn


def test_without_scikit_learns_file_the_error_names_it(monkeypatch):
    import importlib.util

    from src.errors import DataError
    from tasks.classification import digits_arrays

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match=r"digits\.csv\.gz: not found; pip install scikit-learn"):
        digits_arrays()
