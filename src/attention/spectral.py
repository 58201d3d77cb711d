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
  at every forward (the paper's 1.41× epoch time). [reading] ``detach`` (default true):
  ``C`` is treated as a constant of the step, so the gradient reaches ``W`` unchanged.

  Option ``method`` (how ``U Vᵀ`` and ``σ_max`` are computed; the same matrix either way):

  - ``newton_schulz`` (default; ``null`` in ``conf/attn/spectral.yaml`` means it): matmuls
    only, in IEEE fp32 with autocast off: ``NS_STEPS`` scaled Newton–Schulz steps on each
    head's ``d×D`` block (:func:`.polar.polar_factor`) and ``σ_max`` by power iteration on
    the squared Gram. It converges to ``U Vᵀ`` for every direction above ``10⁻⁴ σ_max``
    (``κ(W_h) ≤ 10⁴``): there ``W + C`` equals ``eigh``'s up to fp32's rounding along the weakest
    direction, about ``10⁻⁸ κ(W_h)`` in relative Frobenius norm (6·10⁻⁷ on the digits reading's
    trained heads, κ ≤ 21; ``tests/attention/test_spectral.py``). A head with ``κ(W_h) > 10⁴``
    gets less than ``σ_max`` along its weakest directions.
  - ``eigh``: the exact factor from a ``d×d`` eigendecomposition of each head's Gram in
    float64 (:func:`.polar.gram_polar`); the method the readings ``spectral_svd`` and
    ``compose_cond_init_spectral_svd`` were measured with. On a CUDA device it costs a
    per-matrix cuSOLVER call (batched eigensolvers only take ``n ≤ 32``) and a host sync each
    forward, for each projection: [reading] the default is the matmul form
    (docs/methods.md#spectral, docs/benchmark.md for the costs).

  The heads of every targeted block of one weight (``q``, ``k``, ``v`` of a fused ``qkv``)
  are corrected in one batched call.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from .polar import SQUARINGS, at_least_fp32, exact_fp32, gram_polar, polar_factor
from .registry import Variant, register
from .sites import AttentionSite, Projection

#: Newton–Schulz steps of ``method=newton_schulz``: 13 reach every singular value of a head with
#: ``κ ≤ 10⁴`` to within 10⁻⁵ of 1 (:func:`.polar.newton_schulz_scales`); one more for margin.
NS_STEPS = 14


class AddFixedCorrection(nn.Module):
    """Parametrization ``W -> W + C`` with ``C`` a fixed, untrained buffer."""

    def __init__(self, correction: Tensor) -> None:
        super().__init__()
        self.register_buffer("correction", correction, persistent=False)

    def forward(self, weight: Tensor) -> Tensor:
        return weight + self.correction


class AddSpectralShift(nn.Module):
    """Parametrization ``W_h -> W_h + σ_max(W_h) U_h V_hᵀ`` for each head block ``W_h``.

    ``blocks`` lists ``(start, num_heads, head_dim)`` row ranges of the weight; blocks of the same
    shape are corrected in one batched call.
    """

    def __init__(
        self, blocks: list[tuple[int, int, int]], detach: bool, method: str = "newton_schulz"
    ) -> None:
        super().__init__()
        self.blocks, self.detach, self.method = sorted(blocks), detach, method

    def forward(self, weight: Tensor) -> Tensor:  # (out, in)
        heads = [weight[s : s + h * d].unflatten(0, (h, d)) for s, h, d in self.blocks]  # each (H, d, D)
        shifts = _by_shape(heads, lambda w: spectral_shift(w, self.detach, self.method))
        parts, end = [], 0
        for (start, h, d), block, shift in zip(self.blocks, heads, shifts, strict=True):
            parts += [weight[end:start], (block + shift).flatten(0, 1)]
            end = start + h * d
        parts.append(weight[end:])
        return torch.cat(parts)

    def extra_repr(self) -> str:
        return f"blocks={self.blocks}, detach={self.detach}, method={self.method}"


def _by_shape(blocks: list[Tensor], fn: Callable[[Tensor], Tensor]) -> list[Tensor]:
    """``[fn(b) for b in blocks]`` with one call of ``fn`` per shape: ``fn`` maps a batch
    ``(…, r, c)`` matrix by matrix, so blocks of one shape are concatenated along dim 0."""
    out: list[Tensor | None] = [None] * len(blocks)
    for shape in dict.fromkeys(b.shape[1:] for b in blocks):
        which = [i for i, b in enumerate(blocks) if b.shape[1:] == shape]
        results = fn(torch.cat([blocks[i] for i in which])).split([len(blocks[i]) for i in which])
        for i, r in zip(which, results, strict=True):
            out[i] = r
    return out  # type: ignore[return-value]


def spectral_shift(w: Tensor, detach: bool = True, method: str = "eigh") -> Tensor:
    """``σ_max(W) · U Vᵀ`` for each matrix of the batch ``w (…, r, c)``, ``W = U S Vᵀ``, without
    an SVD. ``eigh``: from the smaller Gram's eigendecomposition in float64
    (:func:`.polar.gram_polar`; a rank-deficient ``W`` gets no correction along its null
    directions). ``newton_schulz``: :data:`NS_STEPS` Newton–Schulz steps in IEEE fp32, autocast
    off (:func:`.polar.polar_factor`), for ``κ(W) ≤ 10⁴`` the same matrix to about ``10⁻⁸ κ(W)``.
    """
    source = w.detach() if detach else w
    if method == "eigh":
        polar, top = gram_polar(source)
        return (top[..., None, None] * polar).to(w.dtype)
    with exact_fp32(w.device.type):
        polar, top = polar_factor(at_least_fp32(source), NS_STEPS, squarings=SQUARINGS)  # (…, r, c), (…)
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
    #: mode=svd: how U Vᵀ is computed (module docstring); ``None`` (the config's null, which keeps
    #: earlier records' identity) is ``newton_schulz``.
    method: Literal["newton_schulz", "eigh"] | None = None

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
                parametrization = AddSpectralShift(blocks, self.detach, self.method or "newton_schulz")
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
