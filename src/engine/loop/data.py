"""Batches in a reproducible order that a resumed run can pick up mid-epoch.

The order of epoch ``e`` is a permutation drawn from ``(seed, e)`` alone, shared by every
process and split between them (rank ``r`` of ``W`` takes positions ``r, r+W, …``), so one
process with batch ``W·B`` sees, step for step, the union of what ``W`` processes with batch
``B`` see. Random augmentation is seeded per sample from ``(seed, e, index)``, so it does
not depend on which worker loads a sample or on where a resumed run starts.

Repeated augmentation (``repeats`` ≥ 2; DeiT's ``RASampler``, Touvron et al. 2021, and Hoffer et
al. 2020) puts each index of the permutation ``repeats`` times in a row, copy ``c`` of index ``i``
augmented from its own seed ``(seed, e, i, c)``, so that the copies, dealt round the ranks, land on
different processes; and an epoch is as long as DeiT's: the data set's length rounded down to a
multiple of 256 (:func:`epoch_samples`), so that an epoch sees about ``1/repeats`` of the images,
each ``repeats`` times, and costs what an epoch without repetition does.

The training :class:`~torch.utils.data.DataLoader` is built once per stream and re-iterated every
epoch (its workers persist between epochs); its batch sampler (:class:`EpochBatches`) serves the
epoch's keys from the stream's :class:`Position`. Pinned memory is for a CUDA device only.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from src.errors import ConfigError

#: DeiT's ``RASampler`` rounds the epoch down to a multiple of 256 samples (``len // 256 * 256``).
REPEATED_ROUND = 256


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


def repeating(repeats: int | None) -> int:
    """The number of copies of each drawn sample: ``repeats``, where 0, 1 or None mean 1 (off)."""
    return max(1, int(repeats or 1))


def epoch_samples(n: int, repeats: int | None = None) -> int:
    """The samples one epoch serves over all processes (before each process's batches round it
    down): ``n``; with repeated augmentation DeiT's ``n // 256 * 256``."""
    return n if repeating(repeats) == 1 else n // REPEATED_ROUND * REPEATED_ROUND


def epoch_keys(
    n: int, seed: int, epoch: int, rank: int = 0, world: int = 1, repeats: int | None = None
) -> torch.Tensor:
    """This process's share of epoch ``epoch``, in order: ``(K, 2)`` rows ``(index, copy)``.

    Without repetition, positions ``rank, rank+W, …`` of :func:`epoch_order` (copy 0). With
    ``repeats = r`` ≥ 2, the permutation with each index ``r`` times in a row, dealt the same way,
    each process keeping its first ``floor(epoch_samples / W)``, as DeiT's ``RASampler`` does."""
    order = epoch_order(n, seed, epoch)  # (n,)
    r = repeating(repeats)
    if r == 1:
        mine = order[rank::world]
        return torch.stack([mine, torch.zeros_like(mine)], 1)
    keep = epoch_samples(n, r) // world  # DeiT: floor(len // 256 * 256 / world) per process
    repeated = torch.stack([order.repeat_interleave(r), torch.arange(n * r) % r], 1)  # (n·r, 2)
    return repeated[rank::world][:keep]


class EpochBatches(Sampler):
    """The training loader's batch sampler: this process's batches of keys ``(epoch, index, copy)``
    for the epoch of :attr:`start`, from its batch on (the stream sets :attr:`start` before each
    pass). A batch is whole: the epoch's last, partial one is dropped."""

    def __init__(
        self, n: int, batch_size: int, seed: int, rank: int, world: int, repeats: int | None
    ) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world, self.repeats = rank, world, repeats
        self.start = Position()

    @property
    def batches_per_epoch(self) -> int:
        return epoch_samples(self.n, self.repeats) // self.world // self.batch_size

    def __len__(self) -> int:
        return max(0, self.batches_per_epoch - self.start.batch)

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        epoch, first = self.start.epoch, self.start.batch
        keys = epoch_keys(self.n, self.seed, epoch, self.rank, self.world, self.repeats)  # (K, 2)
        size = self.batch_size
        for b in range(first, self.batches_per_epoch):  # Python ints a batch at a time, not the epoch's
            yield [(epoch, index, copy) for index, copy in keys[b * size : (b + 1) * size].tolist()]


class SeededSamples(Dataset):
    """Wraps a dataset whose transforms draw random numbers: item ``(epoch, i, copy)`` is drawn with
    the RNGs seeded from ``(seed, epoch, i)`` (and ``copy`` where it is not 0: repeated
    augmentation's other copies). In the main process the RNG states are restored afterwards, so
    loading never disturbs the training loop's randomness.
    A dataset with ``draws_random = False`` is read directly, skipping the tens of
    microseconds that saving, seeding and restoring three generators cost per sample."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, ...]):
        epoch, index, *copy = key
        if not getattr(self.dataset, "draws_random", True):  # a dataset may declare it draws none
            return self.dataset[index]
        drawn = (self.seed, epoch, index, *copy) if any(copy) else (self.seed, epoch, index)
        sample_seed = hash(drawn) & 0xFFFF_FFFF  # ints hash without salt
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
    """An endless stream of training batches over epochs, resumable at a :class:`Position`.

    ``repeats``: repeated augmentation's copies (0 or 1: none). ``pin_memory``: page-locked
    batches for a CUDA device's asynchronous copies. With ``num_workers`` the loader's workers
    persist from epoch to epoch and each keeps ``prefetch_factor`` batches ahead; they stop when
    the iteration over the stream ends (or is dropped)."""

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
        repeats: int | None = None,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
    ) -> None:
        self.samples = SeededSamples(dataset, seed)
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        self.num_workers, self.collate_fn = num_workers, collate_fn
        self.pin_memory, self.prefetch_factor = pin_memory, prefetch_factor
        self.position = position or Position()
        self.sampler = EpochBatches(len(self.samples), batch_size, seed, rank, world, repeats)
        if self.batches_per_epoch < 1:
            rounded = (
                f" (repeated augmentation: DeiT's epoch, rounded down to {REPEATED_ROUND}s, has "
                f"{epoch_samples(len(self.samples), repeats)}; task.repeated_aug=0 turns it off)"
                if repeating(repeats) > 1
                else ""
            )
            raise ConfigError(
                f"{len(self.samples)} training samples{rounded} make no batch of task.batch_size="
                f"{batch_size} on each of {world} processes: lower task.batch_size"
            )

    @property
    def batches_per_epoch(self) -> int:
        return self.sampler.batches_per_epoch

    def loader(self) -> DataLoader:
        """The training loader, re-iterated every epoch: its order is :attr:`sampler`'s."""
        workers = self.num_workers
        return DataLoader(
            self.samples,
            batch_sampler=self.sampler,
            num_workers=workers,
            collate_fn=self.collate_fn,
            pin_memory=self.pin_memory,
            persistent_workers=workers > 0,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            generator=torch.Generator(),  # the workers' base seed: never from the global RNG
        )

    def __iter__(self) -> Iterator:
        loader = self.loader()
        try:
            while True:
                epoch = self.position.epoch
                self.sampler.start = self.position
                loader.generator.manual_seed(self.seed + epoch)
                for batch in loader:
                    self.position = Position(epoch, self.position.batch + 1)
                    yield batch
                self.position = Position(epoch + 1, 0)
        finally:
            del loader  # its persistent workers stop with it


def eval_loader(
    dataset: Dataset,
    batch_size: int,
    rank: int,
    world: int,
    num_workers: int = 0,
    collate_fn=None,
    limit: int | None = None,
    pin_memory: bool = False,
):
    """This process's share of an evaluation set, in order (rank ``r`` takes ``r, r+W, …``) of its
    first ``limit`` examples (all without), so that every world size evaluates the same ones."""
    n = len(dataset)  # type: ignore[arg-type]
    indices = list(range(rank, n if limit is None else min(n, limit), world))
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=indices,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
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
