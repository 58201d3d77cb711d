"""What every LRA task shares: token sequences, padding into batches, the model, loss and accuracy.

A batch is ``(tokens, mask, labels)``, or ``(tokens1, mask1, tokens2, mask2, labels)`` for
the two-document retrieval task: ``tokens (B, L)`` int64 ids, ``mask (B, L)`` bool (true at
tokens, false at padding), ``labels (B,)``. ``model(*batch[:-1])`` gives the logits, which
is what :meth:`LRATask.model_inputs` returns for the conditioning monitor.

Padding, as LRA does it: every sequence is truncated to ``max_length`` tokens and padded
with id 0 to ``pad_length`` (LRA pads to ``max_length``; the Nyströmformer code to the next
power of two, which is what the task configs use). ``pad_to: longest`` pads each batch only
to its longest sequence instead: faster on short data, exactly the same logits for the
softmax encoder with ``masked_mean`` pooling, different for the Nyströmformer (its landmark
segments follow the padded length). The mask is built from the lengths, never from the
ids (pixel value 0 is a token); position 0 is always a token, so that an empty document
never leaves a row of attention with nothing to attend to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import Tensor, nn
from torch.utils.data import Dataset

from src.engine.task import ClassificationTask
from src.errors import ConfigError

Split = Literal["train", "val", "test"]


class Sequences(Dataset):
    """Examples of one or two token sequences (``int`` arrays of any length) and a label."""

    draws_random = False  # no augmentation: the loop may skip per-sample seeding

    def __init__(self, labels: Any, first: Any, second: Any = None) -> None:
        self.labels = np.asarray(labels, dtype=np.int64)
        self.first, self.second = first, second
        if len(self.first) != len(self.labels) or (second is not None and len(second) != len(self.labels)):
            raise ValueError("every example needs its sequence(s) and its label")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple:
        seqs = (self.first[i],) if self.second is None else (self.first[i], self.second[i])
        return (*(torch.as_tensor(np.asarray(s, dtype=np.int64)) for s in seqs), int(self.labels[i]))


def pad_batch(seqs: list[Tensor], length: int | None) -> tuple[Tensor, Tensor]:
    """``tokens (B, L)`` padded with 0 and ``mask (B, L)`` (true at tokens); ``L = length`` or the longest."""
    longest = max(len(s) for s in seqs)
    width = max(length or longest, 1)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for row, s in enumerate(seqs):
        tokens[row, : len(s)] = s[:width]
        mask[row, : len(s)] = True
    mask[:, 0] = True
    return tokens, mask


class LRATask(ClassificationTask):
    """A Long Range Arena classification task; subclasses say how to read each split.

    Args (beside every task's, :class:`src.engine.task.Task`):
        num_classes: classes of the label.
        max_length: tokens kept per sequence (per document for retrieval).
        pad_length: the length every batch is padded to (at least ``max_length``); the
            backbone gets this many positions.
        pad_to: ``fixed`` (``pad_length``, LRA's way) or ``longest`` (the batch's longest).
        eval_split: the split the loop validates on, ``val`` or ``test`` (the papers report
            test accuracy). Evaluation reads either split on its own
            (:meth:`eval_dataset`: ``val`` is the one the loop validates on).
        folder: where the task's files lie under ``paths.data_dir``.
    """

    dual = False
    vocab_size: int
    eval_splits = ("val", "test")

    def __init__(
        self,
        num_classes: int,
        max_length: int,
        pad_length: int,
        folder: str,
        pad_to: Literal["fixed", "longest"] = "fixed",
        eval_split: Split = "val",
        **common: Any,
    ) -> None:
        super().__init__(**common)
        self.num_classes, self.folder = num_classes, folder
        self.max_length, self.pad_length, self.pad_to = max_length, pad_length, pad_to
        self.eval_split = eval_split
        if pad_length < max_length:
            raise ConfigError(f"task.pad_length={pad_length} must be at least task.max_length={max_length}")
        if pad_to not in ("fixed", "longest"):
            raise ConfigError(f"task.pad_to must be fixed or longest, got {pad_to!r}")
        if eval_split not in ("val", "test"):
            raise ConfigError(f"task.eval_split must be val or test, got {eval_split!r}")

    # -- data ------------------------------------------------------------------------------

    def load(self, root: Path, split: Split) -> Sequences:
        """One split read from ``root`` (``data_dir / folder``)."""
        raise NotImplementedError

    def datasets(self, data_dir: Path) -> tuple[Dataset, Dataset]:
        root = Path(data_dir) / self.folder
        return self.load(root, "train"), self.load(root, self.eval_split)

    def eval_dataset(self, data_dir: Path, split: str) -> Dataset:
        """``val``: the split the loop validates on (``eval_split``); ``test``: the test split.
        Only that split is read."""
        self.check_split(split)
        return self.load(Path(data_dir) / self.folder, self.eval_split if split == "val" else "test")

    def collate_fn(self, items: list[tuple]) -> tuple[Tensor, ...]:
        length = self.pad_length if self.pad_to == "fixed" else None
        columns = list(zip(*items, strict=True))
        out: list[Tensor] = []
        for seqs in columns[:-1]:
            out += pad_batch(list(seqs), length)
        return (*out, torch.tensor(columns[-1], dtype=torch.long))

    # -- the model (loss and metrics: ClassificationTask's) -----------------------------------

    def build_model(self, backbone: DictConfig) -> nn.Module:
        """The backbone's model, told the vocabulary, classes, positions and towers of this task."""
        return instantiate(backbone.model, _convert_="all", **self.model_arguments())

    def model_arguments(self) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "num_classes": self.num_classes,
            "max_positions": self.pad_length,
            "dual": self.dual,
        }

    def example_inputs(self, device: str | torch.device = "cpu") -> tuple[Tensor, ...]:
        """``(ids, mask)`` of ``pad_length`` tokens, every one real (twice for retrieval's two towers)."""
        ids = torch.zeros(1, self.pad_length, dtype=torch.long, device=device)  # (1, N)
        mask = torch.ones(1, self.pad_length, dtype=torch.bool, device=device)  # (1, N), True: a token
        return (ids, mask, ids, mask) if self.dual else (ids, mask)
