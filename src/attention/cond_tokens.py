"""``cond_tokens``: conditioned embedded tokens (P3).

[paper] A correction ``C`` is added to the embedded-token matrix ``X ∈ R^{N×D}`` of each
sample, once, at the input of the first transformer layer; no learnable parameters.
Thm 4.4: for ``κ(X) > 2`` there is ``C`` with ``κ(X + C) ≤ 2``, built from the SVD of X.

[reading] From the thin SVD ``X = U Σ Vᵀ``, ``C = σ_max · U Φ Vᵀ`` with Tikhonov filter
factors ``φ_i = σ_i² / (σ_i² + (τ σ_max)²)`` (option ``tau``). Then
``X + C = U (Σ + σ_max Φ) Vᵀ``: directions with ``σ_i ≫ τ σ_max`` get the full lift
``σ_i + σ_max`` and ``κ(X + C) ≤ 2 (1 + (τ κ(X))²)`` over X's non-zero singular values
(2.03 for ``κ(X) = 1.25·10³`` at the default ``τ = 10⁻⁴``); an exactly zero singular value
stays zero. ``C = σ_max X (XᵀX)^{½} (XᵀX + τ²σ_max² I)^{-1}`` is a continuous function of X
(Lipschitz about ``0.65/τ``), flat at zero: the rounding noise of a numerically zero direction
is not amplified. ``τ = 0`` is the exact reading ``C = σ_max U Vᵀ`` (``κ(X + C) ≤ 2``), which
is discontinuous where X is rank-deficient: tokens that leave a LayerNorm (Swin's patch
embedding, DaViT's stem; at init every token is centred, ``X·1 = 0``) have one numerically
zero singular value, and ``σ_max u vᵀ`` along it follows the rounding noise. Measured on the
tiny Swin and DaViT of ``tests/conftest.py``, a 10⁻⁶ change of the input moves the logits by
1.6·10⁻² at ``τ = 0``, 1.4·10⁻⁷ at ``τ = 10⁻⁴`` (standard: 0.7–0.9·10⁻⁷); eager and
``torch.compile`` differ by 3·10⁻³ and 3·10⁻⁸. The square-root filter ``σ_i / √(σ_i² + τ²)``
(``X (XᵀX + τ²σ_max² I)^{-½}``) is smooth too but has slope ``1/τ`` at zero: it amplifies that
noise, 50–150× the standard's logit change. ``detach`` (default true): ``C`` is computed from
a detached ``X`` and acts as a constant of the step.

Option ``where`` ([reading], default ``block``): P3's text puts ``C`` "at the input of the
first transformer layer", after class token and positions (``block``); its figure ("fed into
the first layer of the transformer (positional encoding not shown)") allows correcting the
patch embeddings before they join (``embed``, ``attn.where=embed``), which would explain P3's
``κ ≈ 10¹`` at the block. It does not here: on a ViT-Ti/16 at init (1/f-noise images)
``embed`` leaves ``κ ≈ 2.0–2.1`` at the block entry (positions are small beside the patch
embeddings), so the text's reading is the default. The conditioning monitor measures
``kappa/tokens`` at the block entry either way; on Swin and DaViT both entries are the same
tensor (no absolute positions; DaViT's first stage does not downsample).

Option ``method`` (how ``C`` is computed; docs/methods.md#cond_tokens, docs/benchmark.md):

* ``regularized`` (default): matmuls only, autocast off. ``Q = X (XᵀX +
  τ'²σ̂² I)^{-½} = U ψ(Σ) Vᵀ``, ``ψ(t) = t / √(t² + τ'²)`` (``t = σ_i/σ_max``), is the top block
  of the polar factor of ``X`` stacked on ``τ'σ̂ I`` (:func:`.polar.regularized_polar`,
  ``steps`` Newton–Schulz steps: that stacked matrix has singular values in ``[τ', 1]``, so
  the iteration converges on every direction, X's numerically zero ones included), and
  ``C = σ̂ · Q QᵀQ = σ̂ U ψ(Σ)³ Vᵀ``, ``σ̂`` from ``power_iters`` power iterations on the Gram
  squared four times. A matrix at least twice as long as wide (every recipe's tokens) computes
  the same function through its ``m×m`` Gram in float64, ``C = X (XᵀX + τ'²σ̂² I)^{-3/2} XᵀX``
  with the inverse root by ``steps`` coupled Newton–Schulz steps
  (:func:`.polar.regularized_cube`; 0.37 of the direct route's flops at ViT-B's shape, 0.12
  at Swin-B's); a squarer one iterates on ``X`` itself in IEEE fp32. [reading] With
  ``τ' = τ·√(2/3)`` the filter
  ``ψ³ = (t² / (t² + ⅔τ²))^{3/2}`` is ``svd``'s ``φ`` to ``O(τ⁴/t⁴)`` (``1 − τ²/t²`` both):
  where no singular value lies within a decade of ``τ σ_max`` the two corrections agree to the
  iteration's precision; inside that decade the filters differ by at most 0.06 (``φ`` at
  ``t = τ`` is 0.50, ``ψ³`` 0.47). Like ``φ``, ``ψ³`` is flat at zero (``ψ³ ≈ (t/τ')³``): a
  numerically zero direction stays zero. Measured against ``svd`` on ViT-B/16 (197×768),
  Swin-B first-stage (3136×128) and LRA (4096×64) tokens at init:
  ``tests/attention/test_cond_tokens.py``. Why it is the default: on a GPU the SVD is a
  per-sample cuSOLVER call (batched SVD takes only matrices up to 32×32) with a host sync;
  this is a few batched products (the costs at every recipe's shape:
  ``python -m launch.tools.bench --skip block model memory overhead --shapes``; docs/benchmark.md).
* ``svd``: the exact thin SVD, one per sample and forward pass (the cost the summaries of P3
  name), and the filter factors ``φ`` above; the method the readings ``cond_tokens_block`` and
  ``cond_tokens_embed`` were measured with (they pin it);
* ``polar``: matmuls only, unfiltered. ``U Vᵀ`` is the polar factor of ``X``: ``steps``
  scaled Newton–Schulz iterations (see :mod:`src.attention.polar`) and ``σ̂ ≈ σ_max`` from
  ``power_iters`` power iterations. The correction ``σ̂ · Y`` with ``Y ≈ U Vᵀ`` shares X's
  singular vectors, so ``κ(X + C) ≤ (1 + σ_max/σ̂) / s_min(Y)``: within 1% of the exact
  bound once ``s_min(Y) ≥ 0.995`` and ``σ̂ ≥ 0.995 σ_max``. 12 steps and 24 power iterations
  reach that for ``κ(X)`` up to about 10⁴ with one dominant direction (as embedded tokens
  have); a flat-topped spectrum needs a few more steps. ``Y`` is a polynomial in X, hence
  already continuous (``tau`` does not apply): its own filter maps an exactly zero singular
  value to zero and small ones with slope about ``2·10⁴`` (the product of the 12 steps'
  ``1.5 c_k``), so a numerically zero direction is amplified (the tiny Swin and DaViT: logits
  move by 1–2·10⁻⁴ for a 10⁻⁶ input change) and an exactly zero one keeps ``κ = ∞``. It is
  the unfiltered reading (``tau = 0``) computed by matmuls, not the default's.

Causal decoders ([reading], the suite's own method, not P3's): a correction from the SVD of a
whole sequence would let position ``t`` depend on tokens after ``t``. For a causal entry
(``TokenEntry.causal``: the output of the token ``nn.Embedding``, whatever ``where`` says) the
correction conditions the embedding table ``E (V×D)`` instead: ``C = σ_max(E) · U Vᵀ`` from
``E = U Σ Vᵀ``, so ``κ(E + C) ≤ 2`` and each token's embedding ``E_i + C_i`` depends on the
token alone. Since ``C_i = E_i · M`` with the ``D×D`` map ``M = σ_max (EᵀE)^{-½}``
(pseudo-inverse on ``EᵀE``'s null space), the hook adds ``X·M`` to the embedding output ``X``;
``M`` comes from the ``D×D`` Gram in float64 (no ``V×D`` factorisation is needed): by its
eigendecomposition for ``method=svd``, by the coupled Newton–Schulz iteration for the matmul
methods (:func:`.polar.gram_inverse_root_ns`; the same ``M`` for ``κ(E) ≤ 10⁴``). ``tau`` does not
apply to the table. The conditioning monitor measures the conditioned table through the entry
(``TokenEntry.table``).

The correction is computed in fp32 (the Gram route and the vocabulary map in fp64) outside
autocast, with float32 products in IEEE fp32 (no TF32), then cast to the tokens' dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from timm.layers import register_notrace_module
from torch import Tensor, nn

from .polar import (
    at_least_fp32,
    exact_fp32,
    gram_inverse_root,
    gram_inverse_root_ns,
    polar_factor,
    regularized_cube,
)
from .registry import AttentionConfigError, Variant, find_token_entry, register
from .sites import AttentionSite, Where

#: The default ``tau``: see the module docstring (measurements in ``conf/attn/cond_tokens.yaml``).
DEFAULT_TAU = 1e-4
#: The default ``steps``: ``regularized`` converges in 13 for ``τ' ≥ 8·10⁻⁵`` (every singular value
#: of its stacked polar factor within 10⁻⁵ of 1); one more for margin. ``polar`` needs 12.
DEFAULT_STEPS = 14
#: ``regularized``'s ``τ'/τ``: ``ψ³`` then matches ``φ`` to ``O(τ⁴/t⁴)`` (module docstring).
CUBE_TAU = math.sqrt(2.0 / 3.0)


def filter_factors(s: Tensor, tau: float) -> Tensor:
    """``φ_i = σ_i² / (σ_i² + (τ σ_max)²)`` for singular values ``s (…, k)``, largest first;
    all ones for ``tau = 0`` (the exact reading, zero singular values included)."""
    if tau == 0:
        return torch.ones_like(s)
    s2 = s.square()
    damping = (tau * s[..., :1]).square()  # (…, 1)
    return s2 / (s2 + damping).clamp_min(torch.finfo(s.dtype).tiny)  # X = 0: φ = 0


def token_correction(
    x: Tensor,
    method: str = "regularized",
    steps: int = DEFAULT_STEPS,
    power_iters: int = 24,
    tau: float = DEFAULT_TAU,
) -> Tensor:
    """``C`` for each token matrix of ``x (B, N, D)``, in fp32 (fp64 for fp64 ``x``), shape ``(B, N, D)``.

    ``regularized``: ``σ̂ · Q QᵀQ``, ``Q = U ψ(Σ) Vᵀ`` by Newton–Schulz (module docstring).
    ``svd``: ``σ_max · U diag(φ) Vᵀ`` with :func:`filter_factors` (``tau = 0``: ``σ_max U Vᵀ``).
    ``polar``: ``σ̂ · Y``, ``Y ≈ U Vᵀ`` by Newton–Schulz (``tau`` does not apply).
    Run it under :func:`.polar.exact_fp32` on a device whose run uses autocast or TF32 (the
    conditioner does).
    """
    x = at_least_fp32(x)
    if method == "svd":
        u, s, vh = torch.linalg.svd(x, full_matrices=False)  # (B, N, k), (B, k), (B, k, D)
        return s[..., :1, None] * (u * filter_factors(s, tau)[..., None, :]) @ vh
    if method == "regularized":
        return regularized_cube(x, CUBE_TAU * tau, steps, power_iters)  # σ̂ U ψ³ Vᵀ
    y, sigma = polar_factor(x, steps, power_iters)  # (B, N, D), (B,)
    return sigma[..., None, None] * y


def vocabulary_map(table: Tensor, nonzero_rtol: float = 1e-12, method: str = "eigh") -> Tensor:
    """``M = σ_max(E) (EᵀE)^{-½}`` for an embedding table ``E (V, D)``: ``(E + E M)`` is
    ``E + σ_max U Vᵀ``. ``eigh``: eigenvalues of the Gram below ``nonzero_rtol · λ_max`` count as
    zero. ``newton_schulz``: :func:`.polar.gram_inverse_root_ns`, matmuls only (the same ``M``
    for ``κ(E) ≤ 10⁴``)."""
    if method == "eigh":
        root, top = gram_inverse_root(table, right=True, nonzero_rtol=nonzero_rtol)  # (D, D), ()
    else:
        root, top = gram_inverse_root_ns(table, right=True)
    return top.sqrt() * root  # (D, D)


@register_notrace_module  # FX: a per-sample factorisation is opaque to tracing, kept as one call
class TokenConditioner(nn.Module):
    """``X -> X + C(X)`` on a token matrix ``(B, N, D)`` (or, for a causal decoder,
    ``X -> X + X·M`` with ``M`` from the embedding table ``table``).

    Registered as a leaf for ``torch.fx`` (timm's ``register_notrace_module``): timm's and
    torchvision's FX feature extractors call it as one module instead of tracing the SVD.
    """

    def __init__(
        self,
        method: str,
        detach: bool,
        steps: int,
        power_iters: int,
        table: nn.Embedding | None = None,
        tau: float = DEFAULT_TAU,
    ) -> None:
        super().__init__()
        self.method, self.detach, self.steps, self.power_iters = method, detach, steps, power_iters
        self.tau = tau
        self.__dict__["table"] = table  # a reference, not a submodule: the model owns it

    def forward(self, tokens: Tensor) -> Tensor:  # (B, N, D)
        source = tokens.detach() if self.detach else tokens
        with exact_fp32(tokens.device.type):
            if self.table is not None:
                table = self.table.weight.detach() if self.detach else self.table.weight
                how = "eigh" if self.method == "svd" else "newton_schulz"
                correction = source.double() @ vocabulary_map(table, method=how)  # (B, N, D)
            else:
                correction = token_correction(source, self.method, self.steps, self.power_iters, self.tau)
        return tokens + correction.to(tokens.dtype)

    def extra_repr(self) -> str:
        return (
            f"method={self.method}, tau={self.tau}, detach={self.detach}, steps={self.steps}, "
            f"power_iters={self.power_iters}"
        )


@register
@dataclass
class CondTokens(Variant):
    """Add ``σ_max(X) U diag(φ) Vᵀ`` to each sample's embedded tokens ``X`` (module docstring)."""

    name: ClassVar[str] = "cond_tokens"
    rank: ClassVar[int] = 4
    writes: ClassVar[dict[str, str]] = {"X": "hook"}
    method: Literal["regularized", "svd", "polar"] = "regularized"
    where: Where = "block"
    tau: float = DEFAULT_TAU
    detach: bool = True
    steps: int = DEFAULT_STEPS
    power_iters: int = 24

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tau < 0:
            raise AttentionConfigError(f"attention variant 'cond_tokens': tau={self.tau} must be >= 0")

    def modify(self, model: nn.Module, sites: list[AttentionSite]) -> None:
        entry = find_token_entry(model, self.where)
        table = entry.module if entry.causal else None
        conditioner = TokenConditioner(
            self.method, self.detach, self.steps, self.power_iters, table=table, tau=self.tau
        )
        model.token_conditioner = conditioner
        entry.register(conditioner)
