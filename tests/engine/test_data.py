"""The batch stream: reproducible order, resumable mid-epoch, shardable across processes."""

from __future__ import annotations

import itertools
import random

import torch
from torch.utils.data import Dataset, TensorDataset

from src.engine.loop.data import BatchStream, Position, eval_loader


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
