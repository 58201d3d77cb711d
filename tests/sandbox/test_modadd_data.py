"""The sparse modular addition data: labels, sizes, determinism, and the task's config checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import compose
from hydra.utils import instantiate

from src.errors import ConfigError, user_error
from tasks.modadd import partial_sums, sparse_modular_addition


@pytest.mark.parametrize("p, seq_len, k", [(2, 12, 5), (3, 7, 7), (7, 10, 1), (11, 16, 4)])
def test_labels_equal_the_sum_of_the_first_k_tokens_modulo_p(p, seq_len, k):
    x, y = sparse_modular_addition(500, p, seq_len, k, torch.Generator().manual_seed(p))
    expected = [sum(int(t) for t in row[:k]) % p for row in x.tolist()]  # plain Python, token by token
    assert y.tolist() == expected
    assert x.shape == (500, seq_len) and x.min() >= 0 and x.max() <= p - 1
    assert partial_sums(x, k).remainder(p).tolist() == expected


def test_tokens_are_uniform_and_the_later_tokens_do_not_change_the_label():
    p, seq_len, k, n = 5, 12, 3, 20_000
    x, y = sparse_modular_addition(n, p, seq_len, k, torch.Generator().manual_seed(0))
    counts = torch.bincount(x.flatten(), minlength=p).double()
    expected = n * seq_len / p
    assert ((counts - expected).abs() < 5 * (expected * (1 - 1 / p)) ** 0.5).all()  # within 5 sigma
    shuffled = x.clone()
    shuffled[:, k:] = torch.randint(0, p, (n, seq_len - k), generator=torch.Generator().manual_seed(1))
    assert torch.equal(shuffled[:, :k].sum(1) % p, y)


def modadd_task(tmp_path, *overrides):
    return instantiate(compose(["task=modadd", *overrides], tmp_path).task)


def test_the_task_draws_train_then_test_from_its_data_seed(tmp_path):
    task = modadd_task(tmp_path, "task.train_size=100", "task.test_size=50")
    assert task.data_seed == compose(["task=modadd"], tmp_path).seed
    a = task.datasets(Path("unused"))
    b = modadd_task(tmp_path, "task.train_size=100", "task.test_size=50").datasets(Path("unused"))
    c = modadd_task(tmp_path, "task.train_size=100", "task.test_size=50", "seed=3").datasets(Path("unused"))
    assert [len(s) for s in a] == [100, 50]
    assert all(torch.equal(s.tensors[0], t.tensors[0]) for s, t in zip(a, b, strict=True))
    assert not torch.equal(a[0].tensors[0], c[0].tensors[0])  # data_seed follows the run's seed
    g = torch.Generator().manual_seed(task.data_seed)
    train, test = (sparse_modular_addition(n, 2, 12, 5, g) for n in (100, 50))
    assert torch.equal(a[0].tensors[0], train[0]) and torch.equal(a[1].tensors[1], test[1])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["task.k=13"], "1 ≤ k ≤ seq_len"),
        (["task.p=1"], "p ≥ 2"),
        (["+task.sandbox.colour=red"], "unknown task.sandbox option"),
    ],
)
def test_bad_task_options_fail_with_one_clear_message(tmp_path, overrides, message):
    with pytest.raises(Exception) as info:  # Hydra's instantiate wraps what the target raises
        modadd_task(tmp_path, *overrides)
    error = user_error(info.value)
    assert isinstance(error, ConfigError) and message in str(error)
