"""Batches in a reproducible order that a resumed run can pick up mid-epoch.

The order of epoch ``e`` is a permutation drawn from ``(seed, e)`` alone, shared by every
process and split between them (rank ``r`` of ``W`` takes positions ``r, r+W, …``), so one
process with batch ``W·B`` sees, step for step, the union of what ``W`` processes with batch
``B`` see. Random augmentation is seeded per sample from ``(seed, e, index)``, so it does
not depend on which worker loads a sample or on where a resumed run starts.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from src.errors import ConfigError


@dataclass
class Position:
    """Where the stream stands: ``batch`` batches of ``epoch`` already served."""

    epoch: int = 0
    batch: int = 0


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """The permutation of ``range(n)`` for ``epoch`` (identity without ``shuffle``)."""
    if not shuffle:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


class SeededSamples(Dataset):
    """Wraps a dataset whose transforms draw random numbers: item ``(epoch, i)`` is drawn with
    the RNGs seeded from ``(seed, epoch, i)``. In the main process the RNG states are
    restored afterwards, so loading never disturbs the training loop's randomness.
    A dataset with ``draws_random = False`` is read directly, skipping the tens of
    microseconds that saving, seeding and restoring three generators cost per sample."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        if not getattr(self.dataset, "draws_random", True):  # a dataset may declare it draws none
            return self.dataset[index]
        sample_seed = hash((self.seed, epoch, index)) & 0xFFFF_FFFF  # ints hash without salt
        if get_worker_info() is not None:  # a worker process: its RNGs are its own
            _seed_all(sample_seed)
            return self.dataset[index]
        states = random.getstate(), np.random.get_state(), torch.get_rng_state()
        try:
            _seed_all(sample_seed)
            return self.dataset[index]
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.set_rng_state(states[2])


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)  # the CPU generator only: torch.manual_seed also
    # queues a CUDA reseed, which records a stack trace (about 0.1 ms) each time


class BatchStream:
    """An endless stream of training batches over epochs, resumable at a :class:`Position`."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
        num_workers: int = 0,
        collate_fn=None,
        position: Position | None = None,
    ) -> None:
        self.samples = SeededSamples(dataset, seed)
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        self.num_workers, self.collate_fn = num_workers, collate_fn
        self.position = position or Position()
        if self.batches_per_epoch < 1:
            raise ConfigError(
                f"{len(self.samples)} training samples make no batch of task.batch_size={batch_size} "
                f"on each of {world} processes: lower task.batch_size"
            )

    @property
    def batches_per_epoch(self) -> int:
        return len(self.samples) // self.world // self.batch_size

    def __iter__(self) -> Iterator:
        while True:
            epoch, start = self.position.epoch, self.position.batch
            mine = epoch_order(len(self.samples), self.seed, epoch)[self.rank :: self.world]
            keys = [
                (epoch, int(i))
                for i in mine[start * self.batch_size : self.batches_per_epoch * self.batch_size]
            ]
            loader = DataLoader(
                self.samples,
                batch_size=self.batch_size,
                sampler=keys,
                num_workers=self.num_workers,
                collate_fn=self.collate_fn,
                generator=torch.Generator().manual_seed(self.seed + epoch),  # never the global RNG
            )
            for batch in loader:
                self.position = Position(epoch, self.position.batch + 1)
                yield batch
            self.position = Position(epoch + 1, 0)


def eval_loader(
    dataset: Dataset, batch_size: int, rank: int, world: int, num_workers: int = 0, collate_fn=None
):
    """This process's share of an evaluation set, in order (rank ``r`` takes ``r, r+W, …``)."""
    indices = list(range(rank, len(dataset), world))  # type: ignore[arg-type]
    return DataLoader(
        dataset, batch_size=batch_size, sampler=indices, num_workers=num_workers, collate_fn=collate_fn
    )


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a batch (tuples, lists, dicts) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
