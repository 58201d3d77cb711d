"""``cond_init``: conditioned initialization of attention (P4, Algorithm 1).

[paper] Per head: ``W_V = I_{D×d}``; ``W_Q`` and ``W_K`` independent semi-orthogonal
matrices (``WᵀW = I_d``), each the polar factor ``U Vᵀ`` of the thin SVD of a Gaussian
``D×d`` matrix. Initialization only: the forward pass is the model's own (zero run-time cost).

Option ``value`` ([reading]) says which identity ``W_V`` gets:

* ``per_head`` (default): every head's ``W_V`` is ``I_{D×d}`` itself (every head reads
  coordinates ``0 … d − 1``), Algorithm 1 read literally (``W_V^(i) ← I_{D×d}``);
* ``fused``: with a fused ``qkv``, the whole V block is ``I_{D×D}`` (rectangular when
  ``H*d ≠ D``), so head ``h`` reads coordinates ``h*d … (h+1)*d − 1``, as if the identity were
  laid on the fused weight.

The default is the text's; the evidence does not overturn it (``experiment=readings/*``, 5
seeds: ``per_head`` ahead of ``fused`` on digits, ListOps and the char LM, by no more than noise
on digits; the report's Claims section).

Biases and ``W_O`` keep the model's initialization. Randomness comes from torch's global
generator, so the run's seed fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from .polar import gram_polar
from .registry import Variant, register
from .sites import AttentionSite


def semi_orthogonal(heads: int, rows: int, cols: int, generator: torch.Generator | None = None) -> Tensor:
    """``heads`` independent ``(rows, cols)`` matrices ``Q = U Vᵀ`` (polar factor of a Gaussian).

    For ``rows ≥ cols``, ``QᵀQ = I``; otherwise ``Q Qᵀ = I``.
    """
    g = torch.randn(heads, rows, cols, generator=generator, dtype=torch.float64)
    return gram_polar(g)[0].float()  # (heads, rows, cols): U Vᵀ, from a min(rows, cols)² eigenproblem


def value_identity(heads: int, head_dim: int, dim: int, value: str) -> Tensor:
    """The V rows ``(H*d, D)`` in ``nn.Linear`` layout for ``value`` = fused | per_head."""
    if value == "fused":
        return torch.eye(heads * head_dim, dim)
    return torch.eye(head_dim, dim).repeat(heads, 1)


@register
@dataclass
class CondInit(Variant):
    """Semi-orthogonal W_Q, W_K per head and an identity W_V, at initialization."""

    name: ClassVar[str] = "cond_init"
    rank: ClassVar[int] = 3
    writes: ClassVar[dict[str, str]] = {"W_Q": "init", "W_K": "init", "W_V": "init"}
    value: Literal["fused", "per_head"] = "per_head"

    @torch.no_grad()
    def modify(self, model: nn.Module, sites: list[AttentionSite]) -> None:
        for site in sites:
            if site.v.raw().is_meta:  # no values to initialise (a plan counts the model on meta)
                continue
            h, d, dim = site.num_heads, site.head_dim, site.dim
            for proj in (site.q, site.k):
                w = semi_orthogonal(h, dim, d)  # (H, D, d), WᵀW = I_d
                proj.raw().copy_(w.transpose(1, 2).flatten(0, 1))  # rows: (H*d, D)
            site.v.raw().copy_(value_identity(h, d, dim, self.value))
