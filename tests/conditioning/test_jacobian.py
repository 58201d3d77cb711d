"""The attention Jacobian: autograd against the Kronecker expressions of
docs/methods.md#jacobian-bound, and the bound."""

from __future__ import annotations

import pytest
import torch

from src.conditioning import (
    attention_jacobian,
    attention_probs,
    jacobian_bound,
    kappa,
    kronecker_jacobian,
    softmax_jacobian,
    softmax_jacobian_kappa,
)
from src.conditioning.jacobian import commutation, vec

N, D, d = 4, 6, 3


def draw(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    return (x, *(torch.randn(D, d, generator=g, dtype=torch.float64) for _ in range(3)))


@pytest.mark.parametrize("scale", [1.0, d**-0.5])
def test_autograd_jacobian_equals_the_closed_form(scale):
    for seed in range(5):
        j = attention_jacobian(*draw(seed), scale=scale)
        assert j.shape == (N * d, 3 * D * d)
        torch.testing.assert_close(j, kronecker_jacobian(*draw(seed), scale=scale), atol=1e-12, rtol=1e-10)


def test_jacobian_matches_finite_differences():
    x, q, k, v = draw(0)
    j = attention_jacobian(x, q, k, v)
    direction = [torch.randn(D, d, dtype=torch.float64) for _ in range(3)]
    h = 1e-6
    plus = attention_probs(x, q + h * direction[0], k + h * direction[1]) @ x @ (v + h * direction[2])
    minus = attention_probs(x, q - h * direction[0], k - h * direction[1]) @ x @ (v - h * direction[2])
    numeric = vec(plus - minus) / (2 * h)
    torch.testing.assert_close(j @ torch.cat([vec(t) for t in direction]), numeric, atol=1e-7, rtol=1e-6)


def test_commutation_matrix_transposes_vec():
    m = torch.arange(12.0, dtype=torch.float64).reshape(3, 4)
    torch.testing.assert_close(commutation(3, 4) @ vec(m), vec(m.T))


def test_softmax_jacobian_kappa_needs_no_n_squared_matrix():
    p = attention_probs(*draw(1)[:3])
    torch.testing.assert_close(
        softmax_jacobian_kappa(p), kappa(softmax_jacobian(p), nonzero_rtol=1e-7), rtol=1e-8, atol=0
    )


def test_bound_holds_on_fifty_random_draws():
    for seed in range(50):
        x, q, k, v = draw(seed)
        assert jacobian_bound(x, q, k, v) >= kappa(attention_jacobian(x, q, k, v)), f"draw {seed}"
