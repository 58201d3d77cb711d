"""LRA: tiny files in each task's official on-disk format, and short sequences for 2-step runs.

The writers below are also the loader tests' fixtures (``from smoke.lra import …``): each
writes what the official release (or the dataset's own distribution) holds, at toy size.
"""

from __future__ import annotations

import csv
import pickle
import random
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from tasks.lra import listops, pathfinder

# 96 positions with at most 32 tokens: the Nyströmformer's 64 landmarks take the landmark path.
TINY = [
    "task.max_length=32",
    "task.pad_length=96",
    "task.batch_size=4",
    "task.eval_batch_size=4",
    "trainer.threads=1",
]
SMALL_LISTOPS = [
    f"task.generate.{k}={v}"
    for k, v in dict(num_train=24, num_val=8, num_test=8, min_length=5, max_length=60).items()
]

OVERRIDES = {
    "lra_listops": TINY,
    "lra_listops_small": [*TINY, *SMALL_LISTOPS],
    "lra_text": TINY,
    "lra_retrieval": TINY,
    "lra_image": [*TINY, "task.val_size=8"],
    "lra_pathfinder": TINY,
}

#: the full-size encoders' one real step: the LRA paper's 6-layer ListOps transformer (21M parameters)
FULL_SIZE_STEP = "lra/transformer_listops"


def prepare(data_dir: Path) -> None:
    write_listops(data_dir / "listops-1000", num_train=24, num_val=8, num_test=8)
    write_acl_imdb(data_dir / "aclImdb", per_class=6)
    write_aan(data_dir / "tsv_data", rows=12)
    write_cifar(data_dir / "cifar-10-batches-py", per_batch=4)
    pathfinder.write_release(data_dir, 40, pathfinder.PathfinderSpec())


def synthetic_batch(task, size: int = 2) -> tuple[tuple[Tensor, ...], tuple[int, ...]]:
    """``(tokens (B, L), mask (B, L))`` per tower (two for retrieval) at the task's ``pad_length``,
    then ``labels (B,)``, on the default device; and the logits' shape ``(B, num_classes)``."""
    towers = []
    for _ in range(2 if task.dual else 1):
        towers += [
            torch.randint(0, task.vocab_size, (size, task.pad_length)),
            torch.ones(size, task.pad_length, dtype=torch.bool),
        ]
    return (*towers, torch.randint(0, task.num_classes, (size,))), (size, task.num_classes)


def write_listops(folder: Path, num_train: int, num_val: int, num_test: int, seed: int = 0) -> dict:
    """``basic_{train,val,test}.tsv`` of short generated expressions; returns the rows written."""
    spec = listops.ListOpsSpec(num_train, num_val, num_test, min_length=5, max_length=60, seed=seed)
    splits = listops.generate(spec)
    listops.write_release(folder, splits)
    return splits


def random_text(rng: random.Random, words: int) -> str:
    vocab = ["film", "great", "awful", "plot", "é", "naïve", "<br />", "10/10", "—", "actors", "😀"]
    return " ".join(rng.choice(vocab) for _ in range(words))


def write_acl_imdb(folder: Path, per_class: int, seed: int = 0) -> dict[str, list[tuple[str, int]]]:
    """The Stanford layout ``{train,test}/{neg,pos}/<id>_<rating>.txt``; returns the (text, label) pairs."""
    rng, written = random.Random(seed), {}
    for split in ("train", "test"):
        written[split] = []
        for label, polarity in enumerate(("neg", "pos")):
            (folder / split / polarity).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                text = random_text(rng, rng.randint(3, 40))
                rating = rng.randint(7, 10) if label else rng.randint(1, 4)
                (folder / split / polarity / f"{i}_{rating}.txt").write_text(text, encoding="utf-8")
                written[split].append((text, label))
    return written


def write_aan(folder: Path, rows: int, seed: int = 0) -> dict[str, list[tuple[int, str, str]]]:
    """``new_aan_pairs.{train,eval,test}.tsv`` rows ``label id1 id2 text1 text2``, no header, as released."""
    rng, written = random.Random(seed), {}
    folder.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train"), ("val", "eval"), ("test", "test")):
        written[split] = [
            (i % 2, random_text(rng, rng.randint(1, 30)), random_text(rng, rng.randint(1, 30)))
            for i in range(rows)
        ]
        with open(folder / f"new_aan_pairs.{name}.tsv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(
                f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n"
            )
            for i, (label, a, b) in enumerate(written[split]):
                writer.writerow([f"{float(label)}", f"{split}-{i}a", f"{split}-{i}b", a, b])
    return written


def write_cifar(folder: Path, per_batch: int, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The python release: ``data_batch_1..5`` and ``test_batch``, pickled (protocol 2, bytes keys)."""
    rng, written = np.random.default_rng(seed), {}
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [f"img_{i}.png".encode() for i in range(per_batch)],
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
        written[name] = (data, np.asarray(labels))
    return written
