"""Matmul-only linear algebra for ``cond_tokens``: σ_max by power iteration, the polar factor
``U Vᵀ`` by scaled Newton–Schulz iterations.

Both work on batches ``(…, N, D)`` and use only matrix products, so they run on tensor
cores and need no SVD.

Also the suite's one exact Gram helper (:func:`gram_eigh`, :func:`gram_inverse_root`,
:func:`gram_polar`): the eigendecomposition of a matrix's Gram in float64, behind ``spectral``'s
and ``cond_init``'s polar factors, ``cond_tokens``' vocabulary map and the monitor's κ.

The Newton–Schulz step ``y ← f(c·y)`` with ``f(s) = (3s − s³)/2`` maps every singular value
``s`` of ``y`` through the same scalar polynomial and keeps the singular vectors. Plain
Newton–Schulz (``c = 1``) grows small singular values by 1.5× a step, so ``κ = 10³`` needs
about 20 steps. The scale ``c`` is chosen per step from the interval ``[lo, hi]`` the
singular values are known to lie in, so that ``f(c·lo) = f(c·hi)`` (the interval's two ends
meet, the greedy minimax choice for this cubic), capped so that ``c·hi`` stays well below
``√3`` where ``f`` turns negative. Small values then grow by up to 2.5× a step and the
schedule returns to plain Newton–Schulz (``c → 1``) as the interval closes on 1: 12 steps
cover ``κ ≤ 10⁴`` to within 0.1%.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

#: The schedule assumes the singular values of ``X / σ̂`` lie in ``[1 / MAX_KAPPA, SAFETY]``;
#: SAFETY allows the power iteration's ``σ̂`` to fall 2% short of ``σ_max``.
MAX_KAPPA, SAFETY, MAX_SCALE = 1e4, 1.02, 1.65


def gram(x: Tensor) -> Tensor:
    """The smaller Gram matrix of each ``(N, D)`` matrix: ``XᵀX (D×D)`` or ``XXᵀ (N×N)``."""
    n, d = x.shape[-2:]
    return x.mT @ x if d <= n else x @ x.mT


def gram_eigh(w: Tensor, right: bool | None = None, vectors: bool = True) -> tuple[Tensor, Tensor | None]:
    """Eigenvalues (ascending, ``(…, m)``) and, with ``vectors``, eigenvectors (``(…, m, m)``) of the
    Gram of each matrix of ``w (…, r, c)``, in float64: ``WᵀW`` (``right=True``, ``m = c``) or
    ``WWᵀ`` (``m = r``); by default the smaller one (``WᵀW`` for a tall ``W``).

    The one place the suite factorises a Gram: :func:`gram_polar` (``spectral``, ``cond_init``),
    ``cond_tokens``' vocabulary map and the monitor's :func:`~src.conditioning.kappa.kappa_from_gram`.
    Float64 because the Gram squares κ.
    """
    source = w.double()
    right = source.shape[-2] > source.shape[-1] if right is None else right
    g = source.mT @ source if right else source @ source.mT  # (…, m, m)
    if vectors:
        return torch.linalg.eigh(g)
    return torch.linalg.eigvalsh(g), None


def gram_inverse_root(
    w: Tensor, right: bool | None = None, nonzero_rtol: float = 1e-12
) -> tuple[Tensor, Tensor]:
    """``(G^{-½}, λ_max)`` for the Gram ``G`` of each matrix of ``w`` (sides as in :func:`gram_eigh`),
    in float64: ``(…, m, m)`` and ``(…)``. Eigenvalues below ``nonzero_rtol · λ_max`` count as zero
    (a pseudo-inverse root: a rank-deficient ``W`` gets nothing along its null directions)."""
    eig, vec = gram_eigh(w, right)  # (…, m), (…, m, m); ascending
    top = eig[..., -1:]
    inv_sqrt = torch.where(eig > nonzero_rtol * top, eig.clamp_min(torch.finfo(eig.dtype).tiny).rsqrt(), 0.0)
    return (vec * inv_sqrt[..., None, :]) @ vec.mT, top[..., 0]


def gram_polar(w: Tensor, nonzero_rtol: float = 1e-12) -> tuple[Tensor, Tensor]:
    """The exact polar factor ``U Vᵀ`` and ``σ_max`` of each matrix of ``w (…, r, c)``
    (``W = U S Vᵀ``), from the eigendecomposition of its smaller Gram in float64:
    ``U Vᵀ = (W Wᵀ)^{-½} W``, or ``W (WᵀW)^{-½}`` for a tall ``W``. For a ``D×d`` head block
    that is a ``d×d`` eigenproblem, far cheaper than the SVD of the block. Directions with
    eigenvalues below ``nonzero_rtol · λ_max`` (a rank-deficient ``W``) are left out of the
    factor. Returns ``(polar (…, r, c), σ_max (…))`` in float64.
    """
    source = w.double()
    tall = source.shape[-2] > source.shape[-1]
    root, top = gram_inverse_root(source, right=tall, nonzero_rtol=nonzero_rtol)  # Gram^{-1/2}
    return (source @ root if tall else root @ source), top.sqrt()


def top_singular_value(x: Tensor, iters: int = 24) -> Tensor:
    """``σ_max`` of each matrix of ``x (…, N, D)``, shape ``(…)``, by power iteration."""
    return _power_iteration(gram(x), iters)


def _power_iteration(g: Tensor, iters: int) -> Tensor:
    """``sqrt(λ_max)`` of each PSD Gram ``g (…, m, m)``: a lower bound, tight as ``iters`` grows.

    The start vector is the Gram's row sum plus a constant, which points close to the top
    singular vector of token matrices (they share a strong mean direction). Each step is a
    matrix-vector product, negligible beside one Newton–Schulz step.
    """
    v = g.sum(-1) + g.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True)  # (…, m)
    for _ in range(iters):
        v = (g @ v.unsqueeze(-1)).squeeze(-1)
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(v.dtype).tiny)
    rayleigh = (v.unsqueeze(-2) @ g @ v.unsqueeze(-1)).squeeze(-1).squeeze(-1)  # (…)
    return rayleigh.clamp_min(0).sqrt()


def _cubic(s: float) -> float:
    return 1.5 * s - 0.5 * s**3


@functools.cache
def newton_schulz_scales(steps: int) -> tuple[float, ...]:
    """The per-step scales ``c_k`` for singular values starting in ``[1/MAX_KAPPA, SAFETY]``."""
    lo, hi, scales = 1.0 / MAX_KAPPA, SAFETY, []
    for _ in range(steps):
        c = min(math.sqrt(3.0 / (lo * lo + lo * hi + hi * hi)), MAX_SCALE / hi)
        ends = (_cubic(c * lo), _cubic(c * hi))
        lo, hi = min(ends), (1.0 if c * lo <= 1.0 <= c * hi else max(ends))
        scales.append(c)
    return tuple(scales)


def polar_factor(x: Tensor, steps: int = 12, power_iters: int = 24) -> tuple[Tensor, Tensor]:
    """``(Y, σ̂)``: ``Y ≈ U Vᵀ``, the polar factor of each matrix of ``x (…, N, D)``, and
    ``σ̂ ≈ σ_max`` (``(…)``, from ``power_iters`` power iterations, never above ``σ_max``).

    ``Y = U f(Σ) Vᵀ`` has exactly the singular vectors of ``x``, with ``f ≥ 0`` approaching 1
    (see the module docstring for the schedule). Newton–Schulz starts from ``x / s`` with
    ``s = max(σ̂, ‖XᵀX‖_F^½ / ceiling)``, ``ceiling = √3 / c_1`` the largest value the first
    step keeps positive: since ``‖XᵀX‖_F^½ ≥ σ_max``, no singular value is ever sent
    negative, however poor ``σ̂`` is. Where ``σ̂`` is poor or the top of the spectrum is flat,
    the start is lower and more steps are needed; exact zeros stay zero (use the SVD there).
    """
    scales = newton_schulz_scales(steps)
    ceiling = math.sqrt(3.0) / scales[0] if scales else SAFETY
    g = gram(x)  # (…, m, m)
    sigma = _power_iteration(g, power_iters)  # (…)
    start = torch.maximum(sigma, g.norm(dim=(-2, -1)).sqrt() / (0.999 * ceiling))
    y = x / start[..., None, None].clamp_min(torch.finfo(x.dtype).tiny)
    tall = x.shape[-2] >= x.shape[-1]
    for c in scales:
        cube = y @ (y.mT @ y) if tall else (y @ y.mT) @ y  # Y YᵀY
        y = (1.5 * c) * y - (0.5 * c**3) * cube
    return y, sigma
