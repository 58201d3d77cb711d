"""mimetic: W_Q W_Kᵀ ≈ α₁Z + β₁I per head and W_V W_O ≈ α₂Z − β₂I, split by an SVD."""

from __future__ import annotations

import torch
from timm.models import vision_transformer

from src import attention
from src.attention.mimetic import low_rank_factors


def test_factors_are_the_best_low_rank_approximation():
    torch.manual_seed(0)
    m = torch.randn(3, 20, 16, dtype=torch.float64)
    a, b = low_rank_factors(m, 5)
    assert a.shape == (3, 20, 5) and b.shape == (3, 16, 5)
    tail = torch.linalg.svdvals(m)[:, 5:]
    residual = torch.linalg.matrix_norm(m - a @ b.mT)  # Eckart–Young: the tail's energy, no more
    torch.testing.assert_close(residual, tail.square().sum(-1).sqrt())
    torch.testing.assert_close(torch.linalg.matrix_rank(a @ b.mT), torch.full((3,), 5))


def test_single_head_products_have_the_mimetic_statistics():
    """With one head (d = D) the products equal the targets: diagonal ≈ ±β, spread ≈ α/√D."""
    torch.manual_seed(0)
    dim = 128
    model = vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=dim, depth=4, num_heads=1, num_classes=5
    )
    options = {"alpha1": 0.7, "beta1": 0.7, "alpha2": 0.4, "beta2": 0.4}
    attention.apply(model, "mimetic", **options)
    for site in attention.find_sites(model):
        w = site.head_weights()
        qk = (w["W_Q"][0] @ w["W_K"][0].T).double()  # (D, D)
        vo = (w["W_V"][0] @ site.out.weight.T).double()  # (D, D): W_V W_O
        for product, alpha, beta in ((qk, 0.7, 0.7), (vo, 0.4, -0.4)):
            noise = product - beta * torch.eye(dim, dtype=torch.float64)
            assert abs(product.diagonal().mean() - beta) < 4 * alpha / dim  # mean of D draws of N(0, α²/D)
            assert abs(noise.std() * dim**0.5 / alpha - 1) < 0.05
