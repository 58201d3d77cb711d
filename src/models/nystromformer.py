"""Nyström attention (Xiong et al., 2021), the landmark attention P2-P4 report LRA with.

Softmax attention ``P V`` with ``P = softmax(Q Kᵀ/√d)`` is approximated through ``m``
landmarks, the means of ``m`` consecutive segments of the queries (``Q̃``) and keys (``K̃``):

    P̃ = softmax(Q K̃ᵀ) · pinv(softmax(Q̃ K̃ᵀ)) · softmax(Q̃ Kᵀ)        (N×m · m×m · m×N)

with the pseudo-inverse from ``inverse_iters`` iterations of the paper's third-order
Newton-type scheme, and a depthwise convolution of ``V`` over the sequence (kernel
``conv_kernel`` per head) added to the head output as the paper's LRA code does. Cost is
``O(N m)``: the fused path computes ``F (Ã⁺ (B V))`` and never forms the ``N×N`` matrix.

It follows the authors' LRA implementation (``mlpen/Nystromformer``, ``LRA/code``) with
three documented choices:

* [reading] ``N`` not a multiple of ``m``: the sequence is padded with masked positions to
  the next multiple (the reference requires ``N`` divisible by ``m``); the landmarks are then
  segment means over ``ceil(N/m)`` positions.
* [reading] the iteration's start ``Z₀ = Aᵀ / max_j Σ_i A_ij`` is taken per matrix (the
  paper's ``1/‖A‖₁``); the reference's default takes one maximum over the whole batch, which
  makes a sample's output depend on the others in its batch.
* ``num_landmarks ≥ N``: exact masked softmax attention (the reference's branch for
  ``num_landmarks == seq_len``).

Padding (as the reference): queries and keys are zeroed at padded positions before the
landmarks are formed, ``softmax(Q̃ Kᵀ)`` masks padded keys and the convolution sees ``V``
with padded rows zeroed, so the content of padded positions never reaches a valid one. A
segment made only of padding still gives a zero landmark that takes a share of
``softmax(Q K̃ᵀ)``: the output depends on the padded length, which is why the LRA tasks pad
every sequence to a fixed length (``task.pad_length``).

The attention interface (:mod:`src.attention.sites`): ``qkv`` (fused Q, K, V rows) and
``proj`` are ``nn.Linear``; the head output (``P̃ V`` plus the convolution, per head,
head-major) enters ``proj``, where ``precond`` scales it; ``spectral``, ``cond_init`` and
``mimetic`` act on ``qkv`` and ``proj`` as they do in a ViT. For the conditioning monitor,
the explicit path (``fused_attn = False``) forms ``P̃`` (``N×N`` per head) and passes it
through ``attn_drop`` (an identity: the reference has no attention dropout), so
``kappa/P`` is κ of ``P̃``. ``P̃`` has rank at most ``m``: over all ``N`` singular values
its κ is that of a singular matrix (about 10¹⁰ in fp32), so read it with the monitor's
``nonzero_rtol``. Its rows sum to 1 (exactly when the inverse is exact) but its entries can
be negative, so ``entropy/P`` at these sites is not the entropy of a distribution.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.attention import AttentionSite
from src.attention.timm_families import fused_qkv_site


def iterative_inverse(a: Tensor, iters: int = 6) -> Tensor:
    """Approximate ``pinv(a)`` for each ``(m, m)`` matrix of ``a (…, m, m)`` (Nyströmformer eq. 13).

    ``Z ← ¼ Z (13 I − A Z (15 I − A Z (7 I − A Z)))`` from ``Z₀ = Aᵀ / max_j Σ_i A_ij``.
    """
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    z = a.mT / a.sum(-2).amax(-1)[..., None, None]  # (…, m, m)
    for _ in range(iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def landmark_kernels(q: Tensor, k: Tensor, keep: Tensor, num_landmarks: int) -> tuple[Tensor, Tensor, Tensor]:
    """The three softmax kernels ``softmax(Q K̃ᵀ)``, ``softmax(Q̃ K̃ᵀ)``, ``softmax(Q̃ Kᵀ)``.

    ``q``, ``k``: ``(B, H, N, d)``, already scaled by ``d^-1/4`` and zeroed at padding;
    ``keep``: ``(B, N)`` bool, true at valid positions. Returns ``(B, H, N, m)``,
    ``(B, H, m, m)`` and ``(B, H, m, N)``.
    """
    b, h, n, d = q.shape
    m = num_landmarks
    segment = math.ceil(n / m)
    extra = segment * m - n  # masked positions appended so that m segments tile the sequence
    q_pad, k_pad = (F.pad(t, (0, 0, 0, extra)) for t in (q, k))  # (B, H, m*seg, d)
    q_land = q_pad.view(b, h, m, segment, d).mean(-2)  # (B, H, m, d)
    k_land = k_pad.view(b, h, m, segment, d).mean(-2)  # (B, H, m, d)
    padded_key = ~keep[:, None, None, :]  # (B, 1, 1, N)
    kernel_1 = torch.softmax(q @ k_land.mT, dim=-1)  # (B, H, N, m)
    kernel_2 = torch.softmax(q_land @ k_land.mT, dim=-1)  # (B, H, m, m)
    logits_3 = (q_land @ k.mT).masked_fill(padded_key, torch.finfo(q.dtype).min)
    kernel_3 = torch.softmax(logits_3, dim=-1)  # (B, H, m, N)
    return kernel_1, kernel_2, kernel_3


class NystromAttention(nn.Module):
    """Multi-head Nyström attention with a key padding mask; drop-in for ``timm.layers.Attention``.

    Args:
        dim: token width ``D``.
        num_heads, attn_head_dim: ``H`` and ``d`` (``d = D / H`` when ``None``).
        qkv_bias: biases on the Q, K, V projections (the reference has them).
        proj_drop: dropout on the output projection.
        num_landmarks: ``m``; ``m ≥ N`` computes exact softmax attention.
        conv_kernel: kernel of the depthwise convolution of ``V`` (0: none).
        inverse_iters: iterations of :func:`iterative_inverse`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 2,
        attn_head_dim: int | None = None,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        num_landmarks: int = 64,
        conv_kernel: int = 35,
        inverse_iters: int = 6,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = attn_head_dim or dim // num_heads
        self.num_landmarks, self.inverse_iters = num_landmarks, inverse_iters
        width = num_heads * self.head_dim
        self.qkv = nn.Linear(dim, 3 * width, bias=qkv_bias)
        self.attn_drop = nn.Identity()  # P̃ passes here on the explicit path (for the monitor)
        self.proj = nn.Linear(width, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.conv = (
            nn.Conv2d(
                num_heads,
                num_heads,
                (conv_kernel, 1),
                padding=(conv_kernel // 2, 0),
                groups=num_heads,
                bias=False,
            )
            if conv_kernel
            else None
        )
        self.fused_attn = True  # False: form P̃ explicitly (the monitor's path)

    def attention_site(self, name: str) -> AttentionSite:
        return fused_qkv_site(name, self, self.num_heads, probs=self.attn_drop)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        """``x (B, N, D)``; ``attn_mask``: a key padding mask ``(B, 1, 1, N)``, bool, true = attend."""
        b, n, _ = x.shape
        keep = _key_mask(attn_mask, b, n, x.device)  # (B, N)
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, H, N, d)
        with torch.autocast(x.device.type, enabled=False):  # as the reference: attention in fp32
            heads = self._attend(q.float(), k.float(), v.float(), keep)  # (B, H, N, d)
        heads = heads.to(x.dtype).transpose(1, 2).reshape(b, n, -1)  # (B, N, H*d)
        return self.proj_drop(self.proj(heads))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor) -> Tensor:
        d, n = q.shape[-1], q.shape[-2]
        valid = keep[:, None, :, None].to(q.dtype)  # (B, 1, N, 1)
        q, k = q * valid * d**-0.25, k * valid * d**-0.25
        if self.num_landmarks >= n:
            logits = (q @ k.mT).masked_fill(~keep[:, None, None, :], torch.finfo(q.dtype).min)
            out = self.attn_drop(torch.softmax(logits, dim=-1)) @ v  # (B, H, N, d)
        else:
            kernel_1, kernel_2, kernel_3 = landmark_kernels(q, k, keep, self.num_landmarks)
            inverse = iterative_inverse(kernel_2, self.inverse_iters)  # (B, H, m, m)
            if self.fused_attn:
                out = kernel_1 @ (inverse @ (kernel_3 @ v))  # O(N m), P̃ never formed
            else:
                probs = kernel_1 @ inverse @ kernel_3  # (B, H, N, N): P̃
                out = self.attn_drop(probs) @ v
        if self.conv is not None:
            out = out + self.conv(v * valid)
        return out

    def extra_repr(self) -> str:
        heads, landmarks = self.num_heads, self.num_landmarks
        return f"num_heads={heads}, num_landmarks={landmarks}, inverse_iters={self.inverse_iters}"


def _key_mask(attn_mask: Tensor | None, batch: int, n: int, device: torch.device) -> Tensor:
    """The ``(B, N)`` bool key mask from SDPA's broadcast form ``(B, 1, 1, N)`` (or ``None``: all keys)."""
    if attn_mask is None:
        return torch.ones(batch, n, dtype=torch.bool, device=device)
    if attn_mask.dtype != torch.bool or attn_mask.shape != (batch, 1, 1, n):
        raise ValueError(
            f"NystromAttention takes a key padding mask of shape ({batch}, 1, 1, {n}) and dtype bool, "
            f"got {tuple(attn_mask.shape)} {attn_mask.dtype}"
        )
    return attn_mask[:, 0, 0, :]
