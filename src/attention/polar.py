"""Matmul-only linear algebra for ``cond_tokens`` and ``spectral``: σ_max by power iteration, the
polar factor ``U Vᵀ`` by scaled Newton–Schulz iterations, and the regularized polar factor
``X (XᵀX + τ²σ_max² I)^{-½}`` as the polar factor of ``X`` stacked on ``τσ_max I``.

They work on batches ``(…, N, D)`` and use only matrix products: no factorisation, so on a GPU
no host sync (a CUDA SVD or eigendecomposition checks its convergence on the host) and no
per-matrix loop (cuSOLVER batches only matrices up to 32×32). :func:`full_fp32` keeps their
products in IEEE fp32 where a run allows TF32.

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

import contextlib
import functools
import math
from collections.abc import Iterator

import torch
from torch import Tensor

#: The schedule assumes the singular values of ``X / σ̂`` lie in ``[1 / MAX_KAPPA, SAFETY]``;
#: SAFETY allows the power iteration's ``σ̂`` to fall 2% short of ``σ_max``.
MAX_KAPPA, SAFETY, MAX_SCALE = 1e4, 1.02, 1.65
#: Squarings of the Gram before the power iteration of :func:`regularized_polar`: each squares the
#: ratio ``(σ_2/σ_1)²`` by which an iteration converges (ViT-B's embedded tokens have σ_2/σ_1 up to
#: 0.97: 24 plain iterations leave σ̂ 1.6% short, 4 squarings and 24 iterations 10⁻⁸).
SQUARINGS = 4


def at_least_fp32(x: Tensor) -> Tensor:
    """``x`` in float32, or float64 if it is (a bf16 activation is widened, a float64 test kept)."""
    return x if x.dtype == torch.float64 else x.float()


@contextlib.contextmanager
def exact_fp32(device_type: str) -> Iterator[None]:
    """Autocast off on ``device_type`` (none exists on ``meta``) and :func:`full_fp32`: the
    products of a correction in the precision it asks for, under a bf16 run's autocast."""
    off = (
        torch.autocast(device_type, enabled=False)
        if torch.amp.is_autocast_available(device_type)
        else contextlib.nullcontext()
    )
    with off, full_fp32():
        yield


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """Float32 matrix products in IEEE fp32 inside the block, whatever the run set
    (``torch.set_float32_matmul_precision("high")`` lets CUDA use TF32, 10 bits of mantissa:
    Newton–Schulz then lifts a numerically zero direction to about 10⁻³ σ_max). The legacy
    setter, as the rest of the suite uses it (torch refuses to read a precision set through both)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


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


def gram_inverse_root_ns(
    w: Tensor, right: bool | None = None, steps: int = 14, power_iters: int = 24, squarings: int = SQUARINGS
) -> tuple[Tensor, Tensor]:
    """``(G^{-½}, λ̂_max)`` as :func:`gram_inverse_root` (float64, sides as in :func:`gram_eigh`),
    by matmuls only: the coupled Newton–Schulz iteration ``T = 1.5c I − 0.5c³ Z Y``,
    ``Y ← Y T``, ``Z ← T Z`` from ``Y = G / s``, ``Z = I`` (each eigenvalue ``μ`` follows the
    scaled cubic of the module docstring in ``u = √μ z``) and ``λ_max`` by power iteration on
    ``G^(2^squarings)``. ``Z`` equals the exact inverse root along eigenvalues above
    ``10⁻⁸ λ_max`` (``κ(W) ≤ 10⁴``) after 13 steps; below, it stays bounded (about ``2·10⁴ /
    √λ_max``) where the exact pseudo-inverse root cuts to zero or grows. Three ``m×m`` products
    a step: for ``cond_tokens``' vocabulary map, where the table ``E`` (``V×D``) is far taller
    than its Gram is wide. The Gram in float64 squares κ: rounding then bounds ``Z``'s error by
    about ``10⁻¹⁶ κ(W)³``, negligible for embedding tables (κ ≈ 1 at init).
    """
    source = w.double()
    right = source.shape[-2] > source.shape[-1] if right is None else right
    g = source.mT @ source if right else source @ source.mT  # (…, m, m)
    top = _power_iteration(g, power_iters, squarings).square()  # (…)
    a = g / top[..., None, None].clamp_min(torch.finfo(g.dtype).tiny)  # eigenvalues in [0, ~1]
    _, z, s = _coupled_newton_schulz(a, newton_schulz_scales(steps))
    return z / (s * top[..., None, None]).sqrt(), top


def _coupled_newton_schulz(a: Tensor, scales: tuple[float, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """``(Y, Z, s)`` with ``Y ≈ (A/s)^{½}``, ``Z ≈ (A/s)^{-½}`` for PSD ``a (…, m, m)`` with
    eigenvalues in ``[0, ~1]``, and the start scale ``s (…, 1, 1)``: the coupled iteration
    ``T = 1.5c I − 0.5c³ Z Y``, ``Y ← Y T``, ``Z ← T Z`` from ``Y = A/s``, ``Z = I``, whose
    eigenvalues follow the scaled cubic in ``u = √μ z`` (module docstring); ``s ≥ 1`` is lowered
    from ``‖A‖_F / ceiling²`` as in :func:`_newton_schulz`. Three ``m×m`` products a step."""
    ceiling = math.sqrt(3.0) / scales[0] if scales else SAFETY
    s = torch.maximum(torch.ones_like(a[..., 0, 0]), a.norm(dim=(-2, -1)) / (0.999 * ceiling) ** 2)
    s = s[..., None, None]
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    y, z = a / s, eye.expand_as(a)
    for c in scales:
        t = (1.5 * c) * eye - (0.5 * c**3) * (z @ y)  # (…, m, m)
        y, z = y @ t, t @ z
    return y, z, s


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


def top_singular_value(x: Tensor, iters: int = 24, squarings: int = 0) -> Tensor:
    """``σ_max`` of each matrix of ``x (…, N, D)``, shape ``(…)``, by power iteration (on the
    Gram raised to the power ``2^squarings``)."""
    return _power_iteration(gram(x), iters, squarings)


def _power_iteration(g: Tensor, iters: int, squarings: int = 0) -> Tensor:
    """``sqrt(λ_max)`` of each PSD Gram ``g (…, m, m)``: a lower bound, tight as ``iters`` grows.

    The start vector is the Gram's row sum plus a constant, which points close to the top
    singular vector of token matrices (they share a strong mean direction). Each step is a
    matrix-vector product, negligible beside one Newton–Schulz step. With ``squarings``, the
    iteration runs on ``g^(2^squarings)`` (normalised at each squaring; one ``m×m`` product
    each), converging as fast as ``2^squarings`` plain steps; the Rayleigh quotient is ``g``'s.
    """
    h = g
    for _ in range(squarings):
        h = h / h.norm(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(h.dtype).tiny)
        h = h @ h  # (…, m, m)
    v = h.sum(-1) + h.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True)  # (…, m)
    for _ in range(iters):
        v = (h @ v.unsqueeze(-1)).squeeze(-1)
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(v.dtype).tiny)
    rayleigh = (v.unsqueeze(-2) @ g @ v.unsqueeze(-1)).squeeze(-1).squeeze(-1)  # (…)
    return rayleigh.clamp_min(0).sqrt()


def _cubic(s: float) -> float:
    return 1.5 * s - 0.5 * s**3


@functools.cache
def newton_schulz_scales(steps: int, max_kappa: float = MAX_KAPPA) -> tuple[float, ...]:
    """The per-step scales ``c_k`` for singular values starting in ``[1/max_kappa, SAFETY]``."""
    lo, hi, scales = 1.0 / max_kappa, SAFETY, []
    for _ in range(steps):
        c = min(math.sqrt(3.0 / (lo * lo + lo * hi + hi * hi)), MAX_SCALE / hi)
        ends = (_cubic(c * lo), _cubic(c * hi))
        lo, hi = min(ends), (1.0 if c * lo <= 1.0 <= c * hi else max(ends))
        scales.append(c)
    return tuple(scales)


def polar_factor(
    x: Tensor, steps: int = 12, power_iters: int = 24, squarings: int = 0
) -> tuple[Tensor, Tensor]:
    """``(Y, σ̂)``: ``Y ≈ U Vᵀ``, the polar factor of each matrix of ``x (…, N, D)``, and
    ``σ̂ ≈ σ_max`` (``(…)``, from ``power_iters`` power iterations, never above ``σ_max``).

    ``Y = U f(Σ) Vᵀ`` has exactly the singular vectors of ``x``, with ``f ≥ 0`` approaching 1
    (see the module docstring for the schedule). Newton–Schulz starts from ``x / s`` with
    ``s = max(σ̂, ‖XᵀX‖_F^½ / ceiling)``, ``ceiling = √3 / c_1`` the largest value the first
    step keeps positive: since ``‖XᵀX‖_F^½ ≥ σ_max``, no singular value is ever sent
    negative, however poor ``σ̂`` is. Where ``σ̂`` is poor or the top of the spectrum is flat,
    the start is lower and more steps are needed; exact zeros stay zero (use the SVD there).
    ``squarings``: see :func:`_power_iteration`.
    """
    g = gram(x)  # (…, m, m)
    sigma = _power_iteration(g, power_iters, squarings)  # (…)
    return _newton_schulz(x, g, sigma, newton_schulz_scales(steps)), sigma


def _newton_schulz(x: Tensor, g: Tensor, top: Tensor, scales: tuple[float, ...]) -> Tensor:
    """The scaled Newton–Schulz steps ``scales`` on ``x (…, r, c)``, whose Gram is ``g`` and whose
    largest singular value is about ``top (…)`` (from below): ``U f(Σ) Vᵀ``, shape of ``x``.

    It starts from ``x / s``, ``s = max(top, ‖g‖_F^½ / ceiling)``, ``ceiling = √3 / c_1`` the
    largest value the first step keeps positive (``‖g‖_F^½ ≥ σ_max``)."""
    ceiling = math.sqrt(3.0) / scales[0] if scales else SAFETY
    start = torch.maximum(top, g.norm(dim=(-2, -1)).sqrt() / (0.999 * ceiling))
    y = x / start[..., None, None].clamp_min(torch.finfo(x.dtype).tiny)
    tall = x.shape[-2] >= x.shape[-1]
    for c in scales:
        cube = y @ (y.mT @ y) if tall else (y @ y.mT) @ y  # Y YᵀY
        y = (1.5 * c) * y - (0.5 * c**3) * cube
    return y


#: :func:`regularized_cube` works on the ``m×m`` Gram (float64) when the matrix is at least this
#: many times longer than wide (``m = min(N, D)``, ``M = max(N, D)``): its cost is about
#: ``4m²M + 100m³`` float64 flops against ``56m²(M + m)`` float32 on the matrix itself, fewer from
#: ``M = m`` on where float64 runs at float32's rate (an H100's or A100's tensor cores), from
#: ``M ≈ 3m`` on a CPU (float64 at half rate). [reading] 2: every recipe's tokens (ViT-B 197×768,
#: XCiT-M 197×512, Swin-B 3136×128, LRA 1024–4096×64, Crammed BERT 128×768) take it.
GRAM_ROUTE_RATIO = 2


def regularized_cube(x: Tensor, tau: float, steps: int = 14, power_iters: int = 24) -> Tensor:
    """``σ̂ · U ψ(Σ/σ̂)³ Vᵀ`` for each matrix ``X = U Σ Vᵀ`` of ``x (…, N, D)``, ``ψ(t) = t / √(t² +
    τ²)``, same shape and dtype, matmuls only.

    A matrix at least :data:`GRAM_ROUTE_RATIO` times longer than wide (every recipe's tokens)
    takes the Gram route, in float64: with ``G' = G/σ̂²`` its ``m×m`` Gram (eigenvalues ``t²``)
    and ``A = G' + τ²I`` (eigenvalues ``t² + τ²``, square roots in ``[τ, ~1]``), ``Z = A^{-½}``
    by ``steps`` coupled Newton–Schulz steps (:func:`_coupled_newton_schulz`, the schedule of
    the direct route: its eigenvalues follow the same cubic), then ``h = Z³ G' = V ψ³/t Vᵀ``
    (bounded: ``ψ³/t ≤ 0.39/τ``, zero at ``t = 0``) and the correction ``X h`` (or ``h X``).
    Since ``Q = X A^{-½}/σ̂``, that is ``σ̂ Q QᵀQ`` of the direct route. The Gram's rounding
    (10⁻¹⁶ in float64) stays below fp32's own; measured against the SVD (float64): 7·10⁻⁷ on
    ViT-B's tokens, 10⁻⁸–10⁻⁷ on Swin-B's and LRA Text's (``tests/attention/test_cond_tokens.py``).

    Otherwise (and for ``tau = 0``, where ``ψ³/t = 1/t`` is unbounded) the direct route:
    ``σ̂ Q QᵀQ`` with ``Q`` from :func:`regularized_polar`, in the dtype of ``x``.
    """
    n, d = x.shape[-2:]
    tall = n >= d
    if tau == 0 or max(n, d) < GRAM_ROUTE_RATIO * min(n, d):
        q, sigma = regularized_polar(x, tau, steps, power_iters)  # (…, N, D), (…)
        cube = q @ (q.mT @ q) if tall else (q @ q.mT) @ q  # U ψ³ Vᵀ
        return sigma[..., None, None] * cube
    x64 = x.double()
    g = x64.mT @ x64 if tall else x64 @ x64.mT  # (…, m, m)
    top = _power_iteration(g, power_iters, SQUARINGS).square()  # σ̂², (…)
    g = g / top[..., None, None].clamp_min(torch.finfo(g.dtype).tiny)  # G', eigenvalues t² in [0, ~1]
    eye = torch.eye(g.shape[-1], dtype=g.dtype, device=g.device)
    _, z, s = _coupled_newton_schulz(g + tau**2 * eye, newton_schulz_scales(steps, 1.1 / tau))
    z = z / s.sqrt()  # A^{-½} = V (t² + τ²)^{-½} Vᵀ, (…, m, m)
    h = z @ (z @ (z @ g))  # V ψ³/t Vᵀ: each product bounded (t²/(t²+τ²)^{k/2}, k = 1, 2, 3)
    return (x64 @ h if tall else h @ x64).to(x.dtype)


def regularized_polar(
    x: Tensor, tau: float, steps: int = 14, power_iters: int = 24, squarings: int = SQUARINGS
) -> tuple[Tensor, Tensor]:
    """``(Q, σ̂)``: ``Q = X (XᵀX + τ²σ̂² I)^{-½} = U ψ(Σ/σ̂) Vᵀ``, ``ψ(t) = t / √(t² + τ²)``, for
    each matrix of ``x (…, N, D)``, and ``σ̂ ≈ σ_max`` (``(…)``, from below). Matmuls only.

    ``Q`` is the top block of the polar factor of ``A = [X/σ̂; τ I_D]`` (or the left block of
    ``[X/σ̂, τ I_N]`` for a wide ``X``: the same matrix), whose singular values
    ``√(t² + τ²)`` all lie in ``[τ, ~1]``: Newton–Schulz converges on every direction of ``A``,
    numerically zero ones of ``X`` included (``ψ(0) = 0``: they stay zero, with slope ``1/τ``),
    so ``steps`` is set by ``1/τ`` alone (14 steps for ``τ ≥ 8·10⁻⁵``: every singular value of the
    factor within 10⁻⁵ of 1). ``σ̂`` comes from ``power_iters`` power iterations on the Gram
    raised to ``2^squarings``. The cost: one Newton–Schulz step on ``N × (D + min(N, D))``
    entries per step, ``4·min(N,D)²·(max(N,D) + min(N,D))`` flops.
    """
    n, d = x.shape[-2:]
    tall = n >= d
    g = gram(x)  # (…, m, m), m = min(N, D)
    sigma = _power_iteration(g, power_iters, squarings)  # (…)
    scale = sigma[..., None, None].clamp_min(torch.finfo(x.dtype).tiny)
    m = g.shape[-1]
    eye = torch.eye(m, dtype=x.dtype, device=x.device)  # (m, m)
    stacked = torch.cat([x / scale, (tau * eye).expand(*x.shape[:-2], m, m)], dim=-2 if tall else -1)
    g_stacked = g / scale.square() + tau**2 * eye  # the Gram of `stacked`, (…, m, m)
    top = torch.ones_like(sigma) * math.sqrt(1 + tau**2)  # σ_max(stacked) from below
    max_kappa = 1.1 / tau if tau > 0 else MAX_KAPPA
    y = _newton_schulz(stacked, g_stacked, top, newton_schulz_scales(steps, max_kappa))
    return (y[..., :n, :] if tall else y[..., :, :d]), sigma
