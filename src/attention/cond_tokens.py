"""``cond_tokens``: conditioned embedded tokens (P3).

[paper] A correction ``C`` is added to the embedded-token matrix ``X ∈ R^{N×D}`` of each
sample, once, at the input of the first transformer layer; no learnable parameters.
Thm 4.4: for ``κ(X) > 2`` there is ``C`` with ``κ(X + C) ≤ 2``, built from the SVD of X.

[reading] ``C = σ_max(X) · U Vᵀ`` from the thin SVD ``X = U Σ Vᵀ``, so
``X + C = U (Σ + σ_max I) Vᵀ`` and ``κ(X + C) ≤ 2``. ``detach`` (default true): ``C`` is
computed from a detached ``X`` and acts as a constant of the step.

Option ``method``:

* ``svd`` (default): the exact thin SVD, one per sample and forward pass (the cost the
  summaries of P3 name);
* ``polar``: matmuls only. ``U Vᵀ`` is the polar factor of ``X``: ``steps`` scaled
  Newton–Schulz iterations (see :mod:`src.attention.polar`) and ``σ̂ ≈ σ_max`` from
  ``power_iters`` power iterations. The correction ``σ̂ · Y`` with ``Y ≈ U Vᵀ`` shares X's
  singular vectors, so ``κ(X + C) ≤ (1 + σ_max/σ̂) / s_min(Y)``: within 1% of the exact
  bound once ``s_min(Y) ≥ 0.995`` and ``σ̂ ≥ 0.995 σ_max``. The defaults (12 steps, 24
  power iterations) reach that for ``κ(X)`` up to about 10⁴ with one dominant direction
  (as embedded tokens have); a flat-topped spectrum needs a few more steps. Newton–Schulz
  maps an exactly zero singular value to zero, so tokens embedded through a LayerNorm with
  unit gain and zero bias (Swin and DaViT at init: every token centred, ``X·1 = 0``) keep
  ``κ = ∞`` under ``polar``; ``svd`` lifts that direction too.

Causal decoders ([reading]): a correction from the SVD of a whole sequence would let
position ``t`` depend on tokens after ``t``. For a causal entry (``TokenEntry.causal``, the
token ``nn.Embedding``) the correction conditions the embedding table ``E (V×D)`` instead:
``C = σ_max(E) · U Vᵀ`` from ``E = U Σ Vᵀ``, so ``κ(E + C) ≤ 2`` and each token's embedding
``E_i + C_i`` depends on the token alone. Since ``C_i = E_i · M`` with the ``D×D`` map
``M = σ_max (EᵀE)^{-½}`` (pseudo-inverse on ``EᵀE``'s null space), the hook adds ``X·M`` to
the embedding output ``X``; ``M`` comes from an eigendecomposition of the ``D×D`` Gram in
float64, whichever ``method`` is set (no ``V×D`` factorisation is needed).

The correction is computed in fp32 (the vocabulary map in fp64) outside autocast, then cast
to the tokens' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from .polar import polar_factor
from .registry import AttentionConfigError, Variant, find_token_entry, register
from .sites import AttentionSite


def token_correction(x: Tensor, method: str = "svd", steps: int = 12, power_iters: int = 24) -> Tensor:
    """``C = σ_max(X) · U Vᵀ`` for each token matrix of ``x (B, N, D)``, in fp32."""
    x = x.float()
    if method == "svd":
        u, s, vh = torch.linalg.svd(x, full_matrices=False)
        return s[..., :1, None] * (u @ vh)
    y, sigma = polar_factor(x, steps, power_iters)  # (B, N, D), (B,)
    return sigma[..., None, None] * y


def vocabulary_map(table: Tensor, nonzero_rtol: float = 1e-12) -> Tensor:
    """``M = σ_max(E) (EᵀE)^{-½}`` for an embedding table ``E (V, D)``: ``(E + E M)`` is
    ``E + σ_max U Vᵀ``. Eigenvalues of the Gram below ``nonzero_rtol · λ_max`` count as zero."""
    gram = table.double().mT @ table.double()  # (D, D)
    eig, vec = torch.linalg.eigh(gram)
    top = eig.max()
    inv_sqrt = torch.where(eig > nonzero_rtol * top, eig.clamp_min(torch.finfo(eig.dtype).tiny).rsqrt(), 0.0)
    return top.sqrt() * (vec * inv_sqrt) @ vec.mT  # (D, D)


class TokenConditioner(nn.Module):
    """``X -> X + C(X)`` on the tokens entering the first layer (or, for a causal decoder,
    ``X -> X + X·M`` with ``M`` from the embedding table ``table``)."""

    def __init__(
        self, method: str, detach: bool, steps: int, power_iters: int, table: nn.Embedding | None = None
    ) -> None:
        super().__init__()
        self.method, self.detach, self.steps, self.power_iters = method, detach, steps, power_iters
        self.__dict__["table"] = table  # a reference, not a submodule: the model owns it

    def forward(self, tokens: Tensor) -> Tensor:  # (B, N, D)
        source = tokens.detach() if self.detach else tokens
        with torch.autocast(tokens.device.type, enabled=False):
            if self.table is not None:
                table = self.table.weight.detach() if self.detach else self.table.weight
                correction = source.double() @ vocabulary_map(table)  # (B, N, D)
            else:
                correction = token_correction(source, self.method, self.steps, self.power_iters)
        return tokens + correction.to(tokens.dtype)

    def extra_repr(self) -> str:
        return (
            f"method={self.method}, detach={self.detach}, steps={self.steps}, power_iters={self.power_iters}"
        )


@register
@dataclass
class CondTokens(Variant):
    """Add ``σ_max(X) U Vᵀ`` to each sample's embedded tokens at the first layer."""

    name: ClassVar[str] = "cond_tokens"
    method: Literal["svd", "polar"] = "svd"
    detach: bool = True
    steps: int = 12
    power_iters: int = 24

    def modify(self, model: nn.Module, sites: list[AttentionSite]) -> None:
        entry = find_token_entry(model)
        table = entry.module if entry.causal else None
        if table is not None and not isinstance(table, nn.Embedding):
            raise AttentionConfigError(
                f"a causal token entry must be the token nn.Embedding, got {type(table).__name__}"
            )
        conditioner = TokenConditioner(self.method, self.detach, self.steps, self.power_iters, table)
        model.token_conditioner = conditioner
        entry.register(conditioner)
