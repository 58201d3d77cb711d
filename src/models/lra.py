"""The Long Range Arena encoders: a pre-norm transformer over token ids, with softmax or
Nyström attention, and the LRA classification heads (one sequence, or two for retrieval).

The architecture is the Nyströmformer authors' LRA model (``mlpen/Nystromformer``,
``LRA/code/model.py``), which the LRA paper's Flax transformer shares up to sizes: token
and learned position embeddings (``N(0, 0.02²)``) with dropout; ``depth`` pre-norm blocks
``x + attn(LN(x))``, ``x + MLP(LN(x))`` (GELU MLP, dropout); a final LayerNorm; a pooled
vector into an MLP head ``Linear → ReLU → Linear``. Retrieval encodes both documents with
the same encoder and classifies ``[u, v, u*v, u−v]`` of the two pooled vectors (LRA's
"NLI" combination).

Attention is ``timm.layers.Attention`` (``attention="softmax"``) or
:class:`src.models.nystromformer.NystromAttention` (``"nystrom"``); both describe
themselves to the attention variants, and :meth:`LRAClassifier.token_entry` names the first
block for ``cond_tokens``, so ``src.attention.apply`` works with every variant.

Padding ([reading], the choices this suite makes; each is tested):

* attention: padded positions are masked as keys (SDPA's boolean mask); padded queries are
  computed and ignored;
* tokens: the embedded tokens of padded positions are zeroed, as token embeddings (the
  ``where="embed"`` entry) and again before the first block (``"block"``). With that,
  ``cond_tokens``' correction of the padded ``X`` equals, on the valid rows, the correction
  of the valid tokens alone (the singular vectors of non-zero singular values vanish on zero
  rows; what the correction puts on padded rows is zeroed or never read), and
  ``kappa/tokens`` is κ of the valid tokens for sequences of at least ``D`` tokens (shorter
  ones have ``D − n`` zero singular values: κ = ∞ without ``cond_tokens``);
* pooling (``pool``): ``masked_mean`` (default) averages the valid positions only, so with
  softmax attention the logits do not depend on how much padding a batch has; ``mean`` is
  the reference code's pooling (``LN(x)·mask`` averaged over all ``N`` positions, padding
  counted in the denominator); ``cls`` prepends a learned class token (zero-initialised,
  as LRA's Flax model) and reads its output.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from timm.layers import Attention, Mlp
from torch import Tensor, nn

from src.attention import TokenEntry
from src.attention.sites import Where

from .nystromformer import NystromAttention

Pool = Literal["masked_mean", "mean", "cls"]


class EncoderBlock(nn.Module):
    """Pre-norm block: ``x + attn(LN(x), mask)``, ``x + MLP(LN(x))``."""

    def __init__(self, dim: int, attn: nn.Module, mlp_dim: int, drop: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_dim, drop=drop)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:  # (B, N, D), (B, N) bool
        x = x + self.attn(self.norm1(x), attn_mask=mask[:, None, None, :])
        return x + self.mlp(self.norm2(x))


class LRAClassifier(nn.Module):
    """Token ids ``(B, N)`` and a padding mask ``(B, N)`` -> class logits ``(B, C)``.

    With ``dual``, ``forward(tokens, mask, tokens2, mask2)`` classifies the pair.

    Attention sites: with ``attention="softmax"``, its ``timm.layers.Attention`` modules are found
    by the ViT family's adapter, :func:`src.attention.timm_families.vit_attention_site` (sites are
    looked up by attention class, and this is ViT's); with ``"nystrom"``,
    :class:`NystromAttention` describes itself (``attention_site``). Token entry: :meth:`token_entry`.

    Args:
        vocab_size, num_classes: from the task.
        max_positions: learned positions (the task's padded length).
        dim, depth, num_heads: width ``D``, blocks, heads.
        head_dim: per-head width ``d`` (``D / H`` when ``None``; LRA's ``qkv_dim / H``).
        mlp_dim: hidden width of the blocks' MLP and of the classifier head.
        drop: dropout on embeddings, attention output and MLPs; attn_drop: on ``P``
            (softmax attention only; the Nyström reference has none).
        attention: ``softmax`` or ``nystrom``; num_landmarks, conv_kernel, inverse_iters:
            the Nyström options (see :class:`NystromAttention`).
        pool: ``masked_mean``, ``mean`` or ``cls`` (module docstring).
        positions: ``learned`` (``N(0, 0.02²)``) or ``sinusoidal`` (fixed; LRA's Pathfinder model).
        dual: two-tower retrieval head on ``[u, v, u*v, u−v]``.
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        max_positions: int,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 2,
        head_dim: int | None = None,
        mlp_dim: int = 128,
        drop: float = 0.1,
        attn_drop: float = 0.1,
        attention: Literal["softmax", "nystrom"] = "softmax",
        num_landmarks: int = 64,
        conv_kernel: int = 35,
        inverse_iters: int = 6,
        pool: Pool = "masked_mean",
        positions: Literal["learned", "sinusoidal"] = "learned",
        dual: bool = False,
    ) -> None:
        super().__init__()
        if pool not in ("masked_mean", "mean", "cls"):
            raise ValueError(f"pool must be masked_mean, mean or cls, got {pool!r}")
        self.pool, self.dual, self.max_positions = pool, dual, max_positions
        self.token_embed = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.token_embed.weight, std=0.02)
        table = max_positions + (pool == "cls")
        if positions == "learned":
            self.pos_embed = nn.Parameter(torch.randn(table, dim) * 0.02)
        elif positions == "sinusoidal":
            self.register_buffer("pos_embed", sinusoidal_positions(table, dim), persistent=False)
        else:
            raise ValueError(f"positions must be learned or sinusoidal, got {positions!r}")
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if pool == "cls" else None
        # No parameters (state_dict unchanged): its output is the ``where="embed"`` token entry.
        self.embedded = nn.Identity()
        self.embed_drop = nn.Dropout(drop)
        self.blocks = nn.ModuleList(
            EncoderBlock(
                dim,
                _attention(
                    attention,
                    dim,
                    num_heads,
                    head_dim,
                    drop,
                    attn_drop,
                    num_landmarks,
                    conv_kernel,
                    inverse_iters,
                ),
                mlp_dim,
                drop,
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        width = 4 * dim if dual else dim
        self.head = nn.Sequential(nn.Linear(width, mlp_dim), nn.ReLU(), nn.Linear(mlp_dim, num_classes))

    def token_entry(self, where: Where = "block") -> TokenEntry:
        """``block``: the first block's input, positions (and class token) included, padded
        rows zeroed; ``embed``: the token embeddings ``(B, N, D)``, padded rows zeroed, before
        class token and positions join (the output of ``embedded``)."""
        if where == "embed":
            return TokenEntry(self.embedded, "BND", at="output")
        return TokenEntry(self.blocks[0], "BND")

    def encode(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """The pooled encoding ``(B, D)`` of ``tokens (B, N)`` with padding ``mask (B, N)`` (true = token)."""
        b, n = tokens.shape
        if n > self.max_positions:
            raise ValueError(f"sequence of {n} tokens is longer than max_positions={self.max_positions}")
        x = self.embedded(self.token_embed(tokens) * mask[..., None])  # (B, N, D), padded rows zero
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)  # (B, 1+N, D)
            mask = torch.cat([mask.new_ones(b, 1), mask], dim=1)
        x = self.embed_drop(x + self.pos_embed[: x.shape[1]])
        x = x * mask[..., None]  # padded rows are zero where the first block reads them
        for block in self.blocks:
            x = block(x, mask)
        x = self.norm(x)  # (B, N, D)
        if self.pool == "cls":
            return x[:, 0]
        weights = mask[..., None].to(x.dtype)  # (B, N, 1)
        total = (x * weights).sum(1)  # (B, D)
        return total / (weights.sum(1) if self.pool == "masked_mean" else x.shape[1])

    def forward(
        self, tokens: Tensor, mask: Tensor, tokens2: Tensor | None = None, mask2: Tensor | None = None
    ) -> Tensor:
        u = self.encode(tokens, mask)  # (B, D)
        if not self.dual:
            return self.head(u)  # (B, C)
        if tokens2 is None or mask2 is None:
            raise ValueError("a dual (retrieval) classifier takes tokens, mask, tokens2, mask2")
        v = self.encode(tokens2, mask2)  # (B, D)
        return self.head(torch.cat([u, v, u * v, u - v], dim=-1))  # (B, C)


def sinusoidal_positions(n: int, dim: int) -> Tensor:
    """Vaswani et al.'s fixed positions ``(n, dim)``: sines on even, cosines on odd features."""
    position = torch.arange(n, dtype=torch.float32)[:, None]  # (n, 1)
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n, dim)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: dim // 2])
    return table


def _attention(
    kind: str,
    dim: int,
    num_heads: int,
    head_dim: int | None,
    drop: float,
    attn_drop: float,
    num_landmarks: int,
    conv_kernel: int,
    inverse_iters: int,
) -> nn.Module:
    if kind == "softmax":
        return Attention(
            dim, num_heads, attn_head_dim=head_dim, qkv_bias=True, attn_drop=attn_drop, proj_drop=drop
        )
    if kind == "nystrom":
        return NystromAttention(
            dim,
            num_heads,
            attn_head_dim=head_dim,
            proj_drop=drop,
            num_landmarks=num_landmarks,
            conv_kernel=conv_kernel,
            inverse_iters=inverse_iters,
        )
    raise ValueError(f"attention must be softmax or nystrom, got {kind!r}")
