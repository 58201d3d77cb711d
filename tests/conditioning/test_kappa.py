"""κ: the ratio of extreme singular values, batched, with the non-zero rule."""

from __future__ import annotations

import math

import pytest
import torch

from src.conditioning import kappa, kappa_from_gram


def test_kappa_of_a_diagonal_is_the_ratio_of_its_extremes():
    torch.manual_seed(0)
    values = torch.rand(5, 4) + 0.1
    q1 = torch.linalg.qr(torch.randn(5, 6, 4))[0]
    q2 = torch.linalg.qr(torch.randn(5, 4, 4))[0]
    m = q1 @ torch.diag_embed(values) @ q2.mT  # (5, 6, 4) with known singular values
    torch.testing.assert_close(kappa(m), (values.amax(-1) / values.amin(-1)).double(), rtol=1e-5, atol=0)


def test_kappa_is_scale_invariant_and_one_for_orthogonal_matrices():
    torch.manual_seed(0)
    m = torch.randn(3, 7, 7)
    torch.testing.assert_close(kappa(10 * m), kappa(m), rtol=1e-5, atol=0)
    torch.testing.assert_close(kappa(torch.linalg.qr(m.double())[0]), torch.ones(3, dtype=torch.float64))


def test_nonzero_rule_ignores_the_null_space():
    m = torch.diag(torch.tensor([4.0, 2.0, 0.0]))
    assert math.isinf(kappa(m).item()) or kappa(m).item() > 1e15
    assert kappa(m, nonzero_rtol=1e-7).item() == 2.0
    assert kappa(torch.diag(torch.tensor([4.0, 2.0, 1e-9])), nonzero_rtol=1e-7).item() == 2.0


def test_kappa_from_the_gram_equals_kappa_from_the_svd():
    torch.manual_seed(0)
    values = torch.logspace(0, 5, 8, dtype=torch.float64)  # κ = 10⁵
    q1 = torch.linalg.qr(torch.randn(3, 40, 8, dtype=torch.float64))[0]
    q2 = torch.linalg.qr(torch.randn(3, 8, 8, dtype=torch.float64))[0]
    tall = q1 @ torch.diag_embed(values) @ q2.mT  # (3, 40, 8): a head block
    for m in (tall, tall.mT, torch.randn(4, 9, 30)):  # tall, wide, Gaussian
        torch.testing.assert_close(kappa_from_gram(m), kappa(m), rtol=1e-6, atol=0)
    rank_two = torch.diag(torch.tensor([4.0, 2.0, 0.0]))
    assert kappa_from_gram(rank_two, nonzero_rtol=1e-7).item() == pytest.approx(2.0)


@pytest.mark.parametrize("shape", [(3, 12, 4), (3, 4, 12), (5, 5)])
def test_one_gram_helper_serves_polar_factor_vocabulary_map_and_kappa(shape):
    """``gram_inverse_root`` is ``(WᵀW)^{-½}`` (or ``(WWᵀ)^{-½}``) from the SVD; ``gram_polar``,
    ``cond_tokens``' vocabulary map and ``kappa_from_gram`` built on it give ``U Vᵀ``,
    ``σ_max (EᵀE)^{-½}`` and κ."""
    from src.attention.cond_tokens import vocabulary_map
    from src.attention.polar import gram_inverse_root, gram_polar

    torch.manual_seed(0)
    w = torch.randn(*shape, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    right, _ = gram_inverse_root(w, right=True)
    left, top = gram_inverse_root(w, right=False)
    if shape[-2] >= shape[-1]:  # WᵀW has full rank
        torch.testing.assert_close(right, vh.mT @ torch.diag_embed(1 / s) @ vh)
    if shape[-2] <= shape[-1]:  # WWᵀ has full rank
        torch.testing.assert_close(left, u @ torch.diag_embed(1 / s) @ u.mT)
    torch.testing.assert_close(top, s[..., 0] ** 2)
    polar, sigma = gram_polar(w)
    torch.testing.assert_close(polar, u @ vh)
    torch.testing.assert_close(sigma, s[..., 0])
    torch.testing.assert_close(kappa_from_gram(w), s[..., 0] / s[..., -1])
    if w.dim() == 2 and shape[0] >= shape[1]:
        torch.testing.assert_close(w + w @ vocabulary_map(w), u @ torch.diag(s + s[0]) @ vh)
