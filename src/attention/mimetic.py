"""``mimetic``: mimetic initialization of self-attention (Trockman & Kolter, ICML 2023).

The baseline P4 compares against. Initialize so that, per head,
``W_Q W_Kᵀ ≈ alpha1 · Z + beta1 · I`` and, over all heads together,
``W_V W_O ≈ alpha2 · Z − beta2 · I``, with ``Z`` Gaussian of variance ``1/D``; each target
is split into its two factors by an SVD (the best low-rank factorization, Eckart–Young),
``A = U_r S_r^½``, ``B = V_r S_r^½``. Common settings ``alpha1 = beta1 = 0.7``,
``alpha2 = beta2 = 0.4``. Initialization only; biases keep the model's initialization.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from .registry import Variant, register
from .sites import AttentionSite


def low_rank_factors(m: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """``A (…, r, rank)``, ``B (…, c, rank)`` with ``A Bᵀ`` the best rank-``rank`` approximation of ``m``."""
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    root = s[..., :rank].sqrt()
    return u[..., :rank] * root[..., None, :], vh[..., :rank, :].transpose(-1, -2) * root[..., None, :]


def mimetic_target(heads: int, rows: int, cols: int, alpha: float, beta: float) -> Tensor:
    """``alpha · Z + beta · I`` for ``heads`` draws of ``Z ~ N(0, 1/rows)``; ``(heads, rows, cols)``."""
    z = torch.randn(heads, rows, cols, dtype=torch.float64) / rows**0.5
    return alpha * z + beta * torch.eye(rows, cols, dtype=torch.float64)


@register
@dataclass
class Mimetic(Variant):
    """Initialize W_Q W_Kᵀ near ``alpha1 Z + beta1 I`` and W_V W_O near ``alpha2 Z − beta2 I``."""

    name: ClassVar[str] = "mimetic"
    rank: ClassVar[int] = 5
    writes: ClassVar[dict[str, str]] = {"W_Q": "init", "W_K": "init", "W_V": "init", "W_O": "init"}
    alpha1: float = 0.7
    beta1: float = 0.7
    alpha2: float = 0.4
    beta2: float = 0.4

    @torch.no_grad()
    def modify(self, model: nn.Module, sites: list[AttentionSite]) -> None:
        for site in sites:
            if site.out.weight.is_meta:  # no values to initialise (timm inspects models on meta)
                continue
            h, d, dim = site.num_heads, site.head_dim, site.dim
            w_q, w_k = low_rank_factors(mimetic_target(h, dim, dim, self.alpha1, self.beta1), d)  # (H, D, d)
            site.q.raw().copy_(w_q.transpose(1, 2).flatten(0, 1))
            site.k.raw().copy_(w_k.transpose(1, 2).flatten(0, 1))
            width, dim_out = h * d, site.out.out_features
            target = mimetic_target(1, dim, dim_out, self.alpha2, -self.beta2)[0]  # (D, D_out)
            w_v, w_o = low_rank_factors(target, width)  # (D, H*d), (D_out, H*d)
            site.v.raw().copy_(w_v.T)
            site.out.weight.copy_(w_o)
