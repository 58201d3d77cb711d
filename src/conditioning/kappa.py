"""Condition numbers: ``κ(M) = σ_max(M) / σ_min(M)``, batched, with the non-zero rule.

[reading] A singular matrix (``Λ(P)``, whose rows sum to zero) has ``κ = ∞``;
docs/methods.md#condition-numbers takes κ over the non-zero singular values instead, those above
``nonzero_rtol · σ_max``. Callers pass the threshold and report it (the monitor names it in its
keys' docs).
Singular values are computed in float64: the diagnostics are small and their smallest
singular values are what matters.
"""

from __future__ import annotations

import torch
from torch import Tensor

from src.attention.polar import gram_eigh

#: The relative threshold docs/methods.md#condition-numbers uses for "non-zero" singular values.
DEFAULT_NONZERO_RTOL = 1e-7


def kappa_of_values(sv: Tensor, nonzero_rtol: float | None = None) -> Tensor:
    """κ from singular values ``sv (…, k)`` (any order); ``nonzero_rtol`` drops the near-zero ones."""
    top = sv.amax(-1)
    if nonzero_rtol is None:
        return top / sv.amin(-1)
    kept = torch.where(sv > nonzero_rtol * top[..., None], sv, torch.full_like(sv, float("inf")))
    return top / kept.amin(-1)


def kappa(m: Tensor, nonzero_rtol: float | None = None) -> Tensor:
    """``κ`` of each matrix of ``m (…, r, c)``, shape ``(…)``, over its ``min(r, c)`` singular values.

    With ``nonzero_rtol``, ``σ_min`` is the smallest singular value above
    ``nonzero_rtol · σ_max`` (docs/methods.md#condition-numbers); without it a singular matrix
    gives ``inf``.
    """
    return kappa_of_values(torch.linalg.svdvals(m.detach().double()), nonzero_rtol)


def kappa_from_gram(m: Tensor, nonzero_rtol: float | None = None) -> Tensor:
    """:func:`kappa` from the eigenvalues of each matrix's smaller Gram (``σ² = eig(MᵀM)``),
    in float64: for a tall ``D×d`` head block a ``d×d`` eigenproblem instead of an SVD, and
    for an embedding table ``V×D`` a ``D×D`` one. Exact to float64's precision on ``σ²``, so
    for ``κ`` up to about ``10⁷`` (the monitor's weights and tables stay far below that; use
    :func:`kappa` for anything closer to singular). The non-zero rule applies to ``σ``.
    """
    tall = m.shape[-2] >= m.shape[-1]
    eig, _ = gram_eigh(m.detach(), right=tall, vectors=False)  # (…, min(r, c)): σ²
    return kappa_of_values(eig.clamp_min(0), None if nonzero_rtol is None else nonzero_rtol**2).sqrt()
