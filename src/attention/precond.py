"""``precond``: preconditioned attention (P1), applied to each head's output.

[paper] Each head's output is multiplied by a diagonal preconditioner ``C`` that depends on
Q, K and V. [reading] ``C = diag(1 / (‖A_i‖₂ + eps))``: the row equilibration of the head
output ``A = P V`` (van der Sluis' near-optimal diagonal scaling). The output is ``C A``;
heads are then concatenated and projected as usual.

Speed: ``C`` acts after the head output, so the fused SDPA kernel stays in use. The
scaling runs in a forward pre-hook of the module that receives the concatenated heads
(``site.head_output``), on the ``(..., H*d)`` tensor viewed as ``(..., H, d)``.

Options:
    eps: added to each row norm. ``detach`` ([reading], default true): ``C`` is computed
    from a detached ``A``, so the gradient is that of a constant diagonal scaling.
    ``gain`` (default off): a learnable per-head scale ``g_h`` (init 1) on ``C A``, for when
    unit-norm rows change the residual scale too much.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from .registry import Variant, register
from .sites import AttentionSite


class HeadPreconditioner(nn.Module):
    """Scales every row of every head's output to unit norm: ``A_h -> C_h A_h``."""

    def __init__(self, num_heads: int, eps: float, detach: bool, gain: bool) -> None:
        super().__init__()
        self.num_heads, self.eps, self.detach = num_heads, eps, detach
        self.gain = nn.Parameter(torch.ones(num_heads)) if gain else None

    def forward(self, heads: Tensor) -> Tensor:
        a = heads.unflatten(-1, (self.num_heads, -1))  # (..., H, d)
        # The norms in fp32: under bf16 autocast the head output is bf16, and a bf16 norm keeps
        # 3 significant digits. A no-op in fp32, so fp32 runs are unchanged.
        source = (a.detach() if self.detach else a).float()
        norms = source.norm(dim=-1, keepdim=True)  # (..., H, 1)
        a = (a / (norms + self.eps)).to(heads.dtype)  # (..., H, d), unit rows
        if self.gain is not None:
            a = a * self.gain[:, None]
        return a.flatten(-2)  # (..., H*d)

    def pre_hook(self, module: nn.Module, args: tuple) -> tuple:
        """Forward pre-hook for ``site.head_output``: condition its first input."""
        return (self(args[0]), *args[1:])

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, eps={self.eps}, detach={self.detach}"


@register
@dataclass
class Precond(Variant):
    """Row-equilibrate each head's output before the output projection."""

    name: ClassVar[str] = "precond"
    rank: ClassVar[int] = 1
    writes: ClassVar[dict[str, str]] = {"P": "hook"}
    eps: float = 1e-6
    detach: bool = True
    gain: bool = False

    def modify(self, model: nn.Module, sites: list[AttentionSite]) -> None:
        for site in sites:
            conditioner = HeadPreconditioner(site.num_heads, self.eps, self.detach, self.gain)
            conditioner.to(site.out.weight.device)
            site.module.head_conditioner = conditioner  # owned by the module: saved, copied, moved with it
            # A bound method, so that deepcopy (EMA) hooks the copy's own conditioner.
            site.head_output.register_forward_pre_hook(conditioner.pre_hook)
