"""``spectral``: spectral conditioning of the Q, K, V projections (P2).

[paper] Each projection ``W`` becomes ``W + C``:
``SpecA(X) = softmax(X(W_Q+C_Q)(W_K+C_K)ᵀXᵀ) X(W_V+C_V)``.

Option ``targets`` ([reading]): which of the projections receive ``C``: any of ``q``, ``k``,
``v``, ``qk``, ``qv``, ``kv``, ``qkv``. The text gives each of Q, K, V a ``C = lam·I_{D×d}``;
laid on a fused ``qkv`` weight (``3D×D``, as timm's ViT has it) as one rectangular identity,
``lam·I_{3D×D}`` has its ones in the Q block only, which is ``targets=q``. ``targets=qkv``
adds ``lam·I_{D×D}`` to each block (the literal per-projection reading). Default ``q``: the
literal ``qkv`` with ``lam=10`` makes every token attend only to itself at init (ViT-Ti:
median attention entropy 0.000, κ(P) = 1 because P = I), which cannot give P2's reported
gains; the collapse needs both Q and K shifted (docs/methods.md#readings-of-spectral: on
digits, 1000 steps, Q only trains to .94–.96 against .96–.98 for ``standard``; Q and K to
.35–.44).

Two corrections, option ``mode``:

* ``identity`` (default; P2 Thm 3.8): ``C = lam · I_{D×d}``, a fixed buffer set once and
  never trained; no extra parameters. With a fused ``qkv`` projection, each targeted block
  gets ``lam·I_{D×D}``, so head ``h`` sees the shifted rectangular identity (ones at rows
  ``h*d + i``, columns ``h*d + i``). Speed: the weight is parametrized as ``W + C`` (one
  element-wise add of a buffer per forward), so no extra matmul runs. The buffer is not
  persistent: it is rebuilt from ``lam``.
* ``svd`` (P2 Thm 3.5): per head, with ``W = U S Vᵀ``, ``C = σ_max U Vᵀ`` so that
  ``W + C = U (S + σ_max I) Vᵀ`` and ``κ(W + C) ≤ 2``. Recomputed from the current weight
  at every forward (the paper's 1.41× epoch time); ``U Vᵀ`` comes from a ``d×d`` eigen-
  decomposition of each head's Gram rather than an SVD of the ``D×d`` block (the same
  matrix, at a fraction of the cost). [reading] ``detach`` (default true):
  ``C`` is treated as a constant of the step, so the gradient reaches ``W`` unchanged.

Note (docs/methods.md#readings-of-spectral): with LayerNorm'd inputs ``lam = 10`` on both Q and K
scales the logits by about 100; ``lam`` and ``targets`` are sweep axes
(``conf/reading/spectral_*.yaml``). The svd mode's literal form is ``targets=qkv`` too; its shift
keeps the weights' scale (``S`` → ``S + σ_max``), so it does not collapse attention.

Implementation: ``torch.nn.utils.parametrize`` on the projection's ``weight``; the trained
parameter becomes ``<linear>.parametrizations.weight.original`` (load pretrained weights
before applying the variant).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from .polar import gram_polar
from .registry import Variant, register
from .sites import AttentionSite, Projection


class AddFixedCorrection(nn.Module):
    """Parametrization ``W -> W + C`` with ``C`` a fixed, untrained buffer."""

    def __init__(self, correction: Tensor) -> None:
        super().__init__()
        self.register_buffer("correction", correction, persistent=False)

    def forward(self, weight: Tensor) -> Tensor:
        return weight + self.correction


class AddSpectralShift(nn.Module):
    """Parametrization ``W_h -> W_h + σ_max(W_h) U_h V_hᵀ`` for each head block ``W_h``.

    ``blocks`` lists ``(start, num_heads, head_dim)`` row ranges of the weight.
    """

    def __init__(self, blocks: list[tuple[int, int, int]], detach: bool) -> None:
        super().__init__()
        self.blocks, self.detach = blocks, detach

    def forward(self, weight: Tensor) -> Tensor:
        parts, end = [], 0
        for start, heads, d in sorted(self.blocks):
            parts.append(weight[end:start])
            block = weight[start : start + heads * d].unflatten(0, (heads, d))  # (H, d, D)
            parts.append((block + spectral_shift(block, self.detach)).flatten(0, 1))
            end = start + heads * d
        parts.append(weight[end:])
        return torch.cat(parts)

    def extra_repr(self) -> str:
        return f"blocks={self.blocks}, detach={self.detach}"


def spectral_shift(w: Tensor, detach: bool = True) -> Tensor:
    """``σ_max(W) · U Vᵀ`` for each matrix of the batch ``w (…, r, c)``, ``W = U S Vᵀ``, without
    an SVD (:func:`.polar.gram_polar`: the smaller Gram's eigendecomposition, in float64, as
    the Gram squares κ). A rank-deficient ``W`` gets no correction along its null directions.
    """
    polar, top = gram_polar(w.detach() if detach else w)
    return (top[..., None, None] * polar).to(w.dtype)


def identity_correction(linear: nn.Linear, projections: list[Projection], lam: float) -> Tensor:
    """``lam · I`` on the rows of each projection that lives in ``linear``."""
    correction = torch.zeros_like(linear.weight)
    for p in projections:
        correction[p.rows] = lam * torch.eye(p.width, linear.in_features, dtype=correction.dtype)
    return correction


@register
@dataclass
class Spectral(Variant):
    """Add a spectral correction ``C`` to the projections ``targets`` names (of W_Q, W_K, W_V)."""

    name: ClassVar[str] = "spectral"
    rank: ClassVar[int] = 2
    mode: Literal["identity", "svd"] = "identity"
    lam: float = 10.0
    targets: Literal["q", "k", "v", "qk", "qv", "kv", "qkv"] = "q"
    detach: bool = True

    def modify(self, model: nn.Module, sites: list[AttentionSite]) -> None:
        by_linear: dict[nn.Linear, list[tuple[Projection, AttentionSite]]] = defaultdict(list)
        for site in sites:
            for key, proj in site.projections().items():
                if key[-1].lower() in self.targets:  # "W_Q" -> "q"
                    by_linear[proj.linear].append((proj, site))
        for linear, owned in by_linear.items():
            if self.mode == "identity":
                correction = identity_correction(linear, [p for p, _ in owned], self.lam)
                parametrization: nn.Module = AddFixedCorrection(correction)
            else:
                blocks = [(p.start, s.num_heads, s.head_dim) for p, s in owned]
                parametrization = AddSpectralShift(blocks, self.detach)
            parametrize.register_parametrization(linear, "weight", parametrization)

    def touches(self) -> dict[str, str]:
        return {f"W_{t.upper()}": "parametrize" for t in self.targets}

    def collapse_cause(self) -> str:
        if self.mode == "identity" and "q" in self.targets and "k" in self.targets:
            return (
                f"attn.lam={self.lam:g} on both W_Q and W_K (attn.targets={self.targets}) scales the "
                f"attention logits by about lam² = {self.lam**2:g}; attn.targets=q or a smaller attn.lam "
                "keeps the softmax open"
            )
        return super().collapse_cause()
