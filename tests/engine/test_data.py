"""The batch stream: reproducible order, resumable mid-epoch, shardable across processes."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from contextlib import nullcontext

import pytest
import torch
from conftest import compose
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from src.engine import train
from src.engine.distributed import Dist
from src.engine.loop.data import BatchStream, EpochBatches, Position, SeededSamples, epoch_order, eval_loader
from src.engine.loop.evaluation import evaluate
from src.engine.record import checkpoint
from src.engine.task import Task
from src.errors import ConfigError


def dataset(n: int = 50) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def take(stream: BatchStream, k: int) -> list[list[int]]:
    return [b[0].tolist() for b in itertools.islice(iter(stream), k)]


def test_order_depends_on_seed_and_epoch_only():
    a, b, c = (take(BatchStream(dataset(), 8, seed=s), 12) for s in (3, 3, 4))
    assert a == b and a != c
    assert sorted(sum(a[:6], [])) == sorted(set(sum(a[:6], [])))  # no repeats within an epoch (6 batches)


def test_a_resumed_stream_continues_where_it_stopped():
    stream = BatchStream(dataset(), 8, seed=1)
    it = iter(stream)
    first = [next(it)[0].tolist() for _ in range(9)]  # into the second epoch
    resumed = BatchStream(dataset(), 8, seed=1, position=stream.position)
    assert stream.position == Position(epoch=1, batch=3)
    assert take(resumed, 5) == take(BatchStream(dataset(), 8, seed=1), 14)[9:] and len(first) == 9


def test_two_processes_together_see_the_batch_of_one():
    single = take(BatchStream(dataset(), 8, seed=2), 10)
    ranks = [take(BatchStream(dataset(), 4, seed=2, rank=r, world=2), 10) for r in (0, 1)]
    for step in range(10):
        assert sorted(ranks[0][step] + ranks[1][step]) == sorted(single[step])


class NoisyDataset(Dataset):
    """An item with random augmentation: its value depends on the RNG state when loaded."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor([i + torch.rand(()).item() + random.random()])


def test_augmentation_is_seeded_per_sample_and_leaves_the_loop_rng_alone():
    torch.manual_seed(0)
    random.seed(0)
    state = torch.get_rng_state()
    main = take(BatchStream(NoisyDataset(), 4, seed=5), 6)
    assert torch.equal(torch.get_rng_state(), state)  # loading drew nothing from the loop's RNG
    workers = take(BatchStream(NoisyDataset(), 4, seed=5, num_workers=2), 6)
    assert main == workers  # the same values whichever process loads them
    stream = BatchStream(NoisyDataset(), 4, seed=5)
    it = iter(stream)
    next(it), next(it)
    assert take(BatchStream(NoisyDataset(), 4, seed=5, position=stream.position), 4) == main[2:]


def test_evaluation_shards_cover_the_set_once():
    shards = [torch.cat([b[0] for b in eval_loader(dataset(11), 3, rank=r, world=2)]) for r in (0, 1)]
    assert sorted(torch.cat(shards).tolist()) == list(range(11))


# -- repeated augmentation (DeiT's RASampler) ------------------------------------------------------


def epoch_of(n: int, world: int, batch: int, repeats: int = 3, epoch: int = 0) -> list[list[tuple]]:
    """Each rank's keys ``(epoch, index, copy)`` of one epoch, as the stream's sampler deals them."""
    ranks = []
    for rank in range(world):
        sampler = EpochBatches(n, batch, seed=7, rank=rank, world=world, repeats=repeats)
        sampler.start = Position(epoch, 0)
        ranks.append([key for b in sampler for key in b])
    return ranks


def deit_epoch_length(n: int, world: int) -> int:
    """DeiT's ``RASampler.__len__``: each process's samples, ``floor(n // 256 * 256 / world)``."""
    return math.floor(n // 256 * 256 / world)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("n", [1000, 1100])
def test_repeated_augmentation_draws_each_index_three_times_in_deits_epoch(n, world):
    """Over the processes, an epoch draws each index it draws 3 times, each copy its own (copies
    0, 1, 2), but for the one triple the epoch's end may cut; each process draws DeiT's length;
    and world 2 draws, together, what world 1 draws."""
    ranks = epoch_of(n, world, batch=8)
    assert [len(r) for r in ranks] == [deit_epoch_length(n, world) // 8 * 8] * world
    drawn = sorted(key for rank in ranks for key in rank)
    copies = Counter(index for _, index, _ in drawn)
    assert all(c == 3 for c in copies.values()) or sorted(copies.values())[1:] == [3] * (len(copies) - 1)
    assert len(set(drawn)) == len(drawn)  # no copy twice: the same index, three augmentations
    assert len(copies) == math.ceil(sum(len(r) for r in ranks) / 3)  # about a third of the images
    assert drawn == sorted(epoch_of(n, 1, batch=8 * world)[0])


def test_repeated_copies_go_to_different_processes():
    """With 3 processes, each index's 3 copies are on 3 processes (DeiT's point: each GPU sees
    its own augmentation of the image)."""
    where: dict[int, set[int]] = {}
    for rank, keys in enumerate(epoch_of(1000, 3, batch=8)):
        for _, index, _ in keys:
            where.setdefault(index, set()).add(rank)
    assert where and all(ranks == {0, 1, 2} for ranks in where.values())


def test_the_epoch_and_its_copies_depend_on_the_epoch():
    first, second = (sorted(i for _, i, _ in epoch_of(1000, 1, batch=8, epoch=e)[0]) for e in (0, 1))
    assert first != second


@pytest.mark.parametrize("world", [1, 2])
def test_a_resumed_repeated_stream_continues_where_it_stopped(world):
    """Mid-epoch, then across the epoch's end: the resumed stream serves what the uninterrupted one
    does, on every process."""
    for rank in range(world):
        common = dict(seed=3, rank=rank, world=world, repeats=3)
        whole = take(BatchStream(dataset(600), 16, **common), 30)  # 512 // world // 16 a epoch
        stream = BatchStream(dataset(600), 16, **common)
        it = iter(stream)
        for _ in range(5):
            next(it)
        assert stream.position == Position(0, 5)
        assert take(BatchStream(dataset(600), 16, position=stream.position, **common), 25) == whole[5:]


def test_repeated_copies_are_augmented_apart_and_the_first_as_without_repetition():
    """Copy c of index i is drawn with its own seed: the three differ; copy 0 is what the stream
    without repetition draws for (epoch, i)."""
    samples = SeededSamples(NoisyDataset(), seed=5)
    copies = [samples[(0, 3, c)].item() for c in range(3)]
    assert len(set(copies)) == 3 and copies[0] == samples[(0, 3)].item()


def test_repeated_augmentation_on_a_set_shorter_than_deits_round_is_one_clear_error():
    with pytest.raises(ConfigError, match="rounded down to 256s, has 0; task.repeated_aug=0 turns it off"):
        BatchStream(dataset(200), 8, seed=0, repeats=3)


def test_without_repetition_the_sampler_serves_the_per_process_order_of_before():
    """repeats 0, 1 or None: positions ``r, r+W, …`` of the epoch's permutation, in whole batches
    (the order the loop had before repeated augmentation, bit for bit)."""
    for repeats in (None, 0, 1):
        sampler = EpochBatches(50, 8, seed=2, rank=1, world=2, repeats=repeats)
        keys = [i for batch in sampler for _, i, _ in batch]
        assert keys == epoch_order(50, 2, 0)[1::2][: 50 // 2 // 8 * 8].tolist()


# -- evaluation: the same examples on any number of processes -------------------------------------


def test_eval_batches_mean_the_same_examples_at_world_one_and_two():
    """``eval_batches × batch_size`` examples: the set's first ones, shared by the processes; rank
    0's and rank 1's shares together are what one process evaluates."""
    one = torch.cat([b[0] for b in eval_loader(dataset(50), 4, rank=0, world=1, limit=3 * 4)])
    shares = [
        torch.cat([b[0] for b in eval_loader(dataset(50), 4, rank=r, world=2, limit=12)]) for r in (0, 1)
    ]
    assert one.tolist() == list(range(12))
    assert sorted(torch.cat(shares).tolist()) == one.tolist() and all(len(s) == 6 for s in shares)


def test_steps_per_epoch_and_the_schedule_follow_the_repeated_epoch(tmp_path):
    """Digits' two-way split (``task.test_fraction=0``: 1,437 training images, batch 64) with
    ``task.repeated_aug=3``: DeiT's epoch is 1,280
    samples, 20 steps (22 without); the run says so, and after 20 steps the stream has served all
    of epoch 0's batches and no more: the schedule's epoch and the sampler's end together."""
    cfg = compose(
        [
            "task.test_fraction=0",
            "task.repeated_aug=3",
            "trainer.max_steps=20",
            "trainer.val_every=0",
            "trainer.monitor_every=0",
        ],
        tmp_path,
    )
    summary = train(cfg, tmp_path / "run")
    saved = checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")
    assert summary["steps_per_epoch"] == 20 and saved["loop"]["position"] == {"epoch": 0, "batch": 20}


class Recording(Task):
    """Evaluation that records which examples (their values are their indices) it was given."""

    def __init__(self) -> None:
        super().__init__(name="recording", input="sequence", batch_size=4, eval_batch_size=4)
        self.seen: list[int] = []

    def eval_sums(self, model, batch):
        self.seen += batch[0].tolist()
        return {"val/x": (batch[0].double().sum(), len(batch[0]))}


class Alone(Dist):
    """Rank ``rank`` of a simulated world: the collectives reduce nothing (each share seen alone)."""

    def all_sum(self, values: torch.Tensor) -> torch.Tensor:
        return values


def test_evaluation_with_eval_batches_sees_the_same_examples_at_world_one_and_two():
    """``trainer.eval_batches=3`` of 4 examples: one process evaluates examples 0-11; in a world of
    two, rank 0 and rank 1 evaluate 6 each, and together the same 12."""
    seen = {}
    for rank, world in ((0, 1), (0, 2), (1, 2)):
        task = Recording()
        _, samples = evaluate(
            task, nn.Identity(), dataset(50), Alone(rank, world), nullcontext(), eval_batches=3
        )
        seen[rank, world] = (task.seen, samples)
    assert seen[0, 1] == (list(range(12)), 12)
    assert seen[0, 2][1] == seen[1, 2][1] == 6
    assert sorted(seen[0, 2][0] + seen[1, 2][0]) == seen[0, 1][0]
