"""The training-dynamics sandbox of P5 (Odonnat, Bouaziz & Cabannes, *Clustering Head*).

Two models of sparse modular addition whose every layer lives in a plane:

* :class:`ClusteringHead` -- P5's reference model: tokens embedded in ``dim = 2`` with
  learned positions, a gain-free RMSNorm, one attention layer whose query is a single
  learned vector (keys: the normed tokens; values: ``W_V x``), pooled to one token, a
  residual GELU feed-forward behind a second gain-free RMSNorm, and an output tied to the
  token embedding. Its computation is that of P5's public code (``facebookresearch/pal``,
  ``src/factorization/models/softmax_model.py``).
* :class:`MultiHeadSandbox` -- the same embeddings and readout around standard pre-norm
  transformer blocks (timm's ``Block`` with its multi-head ``Attention``), a learned query
  token prepended to the sequence and read out after the last block (a class token), so
  that every attention variant of the suite applies.

How the attention variants meet the reference model (the suite's attention interface,
:mod:`src.attention.sites`): P5's layer is one head, ``H = 1``, ``d = D``, whose logits are
``q · x̂_j / √D``. In the terms of docs/methods.md#notation its ``W_K`` is the identity (the
keys are the normed tokens) and it has no output projection; both are described by fixed, untrained identity
``nn.Linear`` layers (``key``, ``proj``), so the computation is P5's exactly, and
``W_Q`` is the learned query itself, a ``1 × D`` ``nn.Linear`` weight. Hence:

* ``standard``: P5's model.
* ``precond`` (P1): the pooled head output (one row per sequence) is scaled to unit norm
  before ``proj``; it applies as on any head.
* ``cond_tokens`` (P3): the embedded tokens ``(B, L, D)`` entering ``norm1``
  (``where="block"``) or the token embeddings before the positions join (``"embed"``) get
  the correction; it applies as on any model.
* ``spectral``, ``cond_init``, ``mimetic`` act on trained ``W_Q``, ``W_K`` (and ``W_O``)
  matrices, which P5's layer does not have: the backbone config refuses them (its
  ``attn_variants``), pointing to ``backbone=sandbox_multihead``.

The normalization is P5's ``x / (rms(x) + eps)``, whose Jacobian has the closed-form
largest eigenvalue ``1 / (rms(x) + eps)`` (see :func:`rmsnorm_jacobian_max`): the cheap,
exact measure of its curvature that spike detection logs.

Longer than the suite's 300 lines: the two models share their layers and their account of
how each variant meets them, which reads best in one place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from timm.models.vision_transformer import Block
from torch import Tensor, nn

from src.attention import AttentionSite, Projection, TokenEntry
from src.attention.sites import Where
from src.errors import ConfigError


class RMSNorm(nn.Module):
    """Gain-free RMSNorm as P5 writes it: ``x / (sqrt(mean(x²)) + eps)`` over the last axis.

    ``eps`` sits outside the square root (P5's choice), so near the origin the map's slope
    reaches ``1/eps``: the curvature behind P5's loss spikes.
    """

    def __init__(self, dim: int | None = None, eps: float = 1e-5, **factory: object) -> None:
        super().__init__()  # no parameters: ``dim`` and timm's device/dtype keywords are not needed
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)

    def jacobian_max(self, x: Tensor) -> Tensor:
        """The largest eigenvalue of the Jacobian at each row of ``x``; see :func:`rmsnorm_jacobian_max`."""
        return rmsnorm_jacobian_max(x, self.eps)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


def rmsnorm_jacobian_max(x: Tensor, eps: float = 1e-5) -> Tensor:
    """``1 / (rms(x) + eps)`` for each row of ``x (…, D)``: the top eigenvalue of the RMSNorm Jacobian.

    With ``ρ = rms(x)``, ``J = (I − x xᵀ / (D ρ (ρ + eps))) / (ρ + eps)``: symmetric, with
    eigenvalue ``1/(ρ + eps)`` on every direction orthogonal to ``x`` and
    ``eps / (ρ + eps)²`` along ``x``. For ``D ≥ 2`` the largest is ``1/(ρ + eps)``.
    """
    return 1.0 / (x.pow(2).mean(-1).sqrt() + eps)


def fixed_identity(dim: int) -> nn.Linear:
    """An untrained ``dim × dim`` identity ``nn.Linear`` (no bias)."""
    linear = nn.Linear(dim, dim, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.eye(dim))
    linear.weight.requires_grad_(False)
    return linear


class LearnedQueryAttention(nn.Module):
    """P5's attention: one learned query vector attends over the normed tokens, ``(B, L, D) -> (B, D)``.

    ``P = softmax(q x̂ᵀ / √D)``, output ``P x̂ W_V``. ``query`` holds ``q`` as the weight of a
    ``D → 1`` Linear (P5's parametrization); ``key`` and ``proj`` are fixed identities (see
    the module docstring). ``fused_attn`` switches between torch's SDPA and the explicit
    path, whose probabilities pass through ``attn_drop`` (p = 0) for the monitor.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim, self.scale = dim, dim**-0.5
        self.query = nn.Linear(dim, 1, bias=False)
        self.key = fixed_identity(dim)
        self.value = nn.Linear(dim, dim, bias=False)
        self.proj = fixed_identity(dim)
        self.attn_drop = nn.Dropout(0.0)
        self.fused_attn = True

    def forward(self, x: Tensor) -> Tensor:  # (B, L, D)
        batch = x.shape[0]
        q = self.query.weight.expand(batch, 1, 1, self.dim)  # (B, 1, 1, D): one head, one query
        k = self.key(x).unsqueeze(1)  # (B, 1, L, D)
        v = self.value(x).unsqueeze(1)  # (B, 1, L, D)
        if self.fused_attn:
            out = F.scaled_dot_product_attention(q, k, v)  # (B, 1, 1, D)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)  # (B, 1, 1, L)
            attn = self.attn_drop(attn.softmax(dim=-1))
            out = attn @ v  # (B, 1, 1, D)
        return self.proj(out[:, 0, 0])  # (B, D), head-major with H = 1

    def attention_site(self, name: str) -> AttentionSite:
        dim = self.dim
        return AttentionSite(
            name,
            self,
            num_heads=1,
            head_dim=dim,
            q=Projection(self.query, 0, 1),
            k=Projection(self.key, 0, dim),
            v=Projection(self.value, 0, dim),
            out=self.proj,
            head_output=self.proj,
            probs=self.attn_drop,
        )


@dataclass
class Trace:
    """What the sandbox draws of one batch: every layer's 2-D cloud and the query's attention.

    Attributes:
        clouds: in layer order, ``name -> (B, N, D)`` token clouds or ``(B, D)`` sequence
            clouds (the pooled token, or the query token of the multi-head model).
        attention: ``name -> (B, H, N)``, the query's attention over the positions.
        readout: ``(V, D)``, the tied output embedding (logits are ``h @ readoutᵀ``).
        query: ``(D,)``, the learned query of the reference model, else ``None``.
    """

    clouds: dict[str, Tensor] = field(default_factory=dict)
    attention: dict[str, Tensor] = field(default_factory=dict)
    readout: Tensor | None = None
    query: Tensor | None = None


@contextlib.contextmanager
def capture_probs(modules: dict[str, nn.Module]) -> Iterator[dict[str, Tensor]]:
    """Run attention modules on their explicit path and collect what enters their ``attn_drop``."""
    seen: dict[str, Tensor] = {}
    handles, fused = [], {}
    for name, module in modules.items():
        fused[name] = module.fused_attn
        module.fused_attn = False
        handles.append(
            module.attn_drop.register_forward_pre_hook(lambda m, a, n=name: seen.setdefault(n, a[0].detach()))
        )
    try:
        yield seen
    finally:
        for name, module in modules.items():
            module.fused_attn = fused[name]
        for h in handles:
            h.remove()


class _Embedded(nn.Module):
    """Token and learned position embeddings, shared by both sandbox models.

    ``init_scale`` multiplies both at initialization (the same draws: 1.0 is P5's N(0, 1)
    exactly). **[reading]** P5's initialization intervention as a scale. On the reference model
    the first RMSNorm removes a common scale, so what it changes at initialization is the tied
    readout's, the logits' size (small: near-uniform predictions; large: confident random ones);
    on the multi-head sandbox also the residual stream's size against the blocks' updates.
    """

    def __init__(self, num_embeddings: int, seq_len: int, dim: int, init_scale: float = 1.0) -> None:
        super().__init__()
        if not init_scale > 0:
            raise ConfigError(f"backbone.model.init_scale={init_scale}: give a positive scale (1.0: P5's)")
        self.token_emb = nn.Embedding(num_embeddings, dim)  # N(0, 1), as P5
        self.pos_emb = nn.Parameter(torch.randn(seq_len, dim))  # N(0, 1), as P5's nn.Embedding
        if init_scale != 1.0:
            with torch.no_grad():
                self.token_emb.weight.mul_(init_scale)
                self.pos_emb.mul_(init_scale)

    def embed(self, x: Tensor) -> Tensor:  # (B, L) -> (B, L, D)
        return self.token_emb(x) + self.pos_emb[: x.shape[1]]

    def readout(self, h: Tensor) -> Tensor:  # (B, D) -> (B, V): the output tied to the token embedding
        return h @ self.token_emb.weight.T


class ClusteringHead(_Embedded):
    """P5's reference model; see the module docstring. ``(B, L)`` token ids -> ``(B, V)`` logits.

    Args:
        vocab_size: ``p``, the token values.
        seq_len: ``L``.
        dim: the embedding dimension (2 in P5: everything can be drawn).
        ffn_dim: the feed-forward width (32 in P5).
        ffn_bias: biases in the feed-forward (P5: yes).
        eps: RMSNorm's ``eps`` (P5: 1e-5, outside the square root).
        num_embeddings: rows of the tied embedding, at least ``p``; P5's figures use ``p + 1``
            (one unused row), its default is ``p``. ``None``: ``p``.
        init_scale: the embeddings' initial scale (1.0: P5's N(0, 1); see ``_Embedded``).
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        dim: int = 2,
        ffn_dim: int = 32,
        ffn_bias: bool = True,
        eps: float = 1e-5,
        num_embeddings: int | None = None,
        init_scale: float = 1.0,
    ) -> None:
        super().__init__(num_embeddings or vocab_size, seq_len, dim, init_scale)
        self.norm1 = RMSNorm(dim, eps)
        self.attn = LearnedQueryAttention(dim)
        self.norm2 = RMSNorm(dim, eps)
        self.mlp = Mlp(dim, ffn_dim, act_layer=nn.GELU, bias=ffn_bias)

    def forward(self, x: Tensor) -> Tensor:  # (B, L) -> (B, V)
        h = self.attn(self.norm1(self.embed(x)))  # (B, D): the sequence embedding
        h = h + self.mlp(self.norm2(h))  # (B, D)
        return self.readout(h)

    def token_entry(self, where: Where = "block") -> TokenEntry:
        """``block``: the tokens entering ``norm1`` (positions included); ``embed``: the token
        embeddings ``(B, L, D)``, before the positions join."""
        if where == "embed":
            return TokenEntry(self.token_emb, "BND", at="output")
        return TokenEntry(self.norm1, "BND")

    @torch.no_grad()
    def trace(self, x: Tensor) -> Trace:
        """Every layer of the forward pass on ``x (B, L)``, for the sandbox's pictures."""
        trace = Trace(readout=self.token_emb.weight.detach().clone(), query=self.attn.query.weight[0].clone())
        with capture_probs({"attn": self.attn}) as probs:
            tokens = self.embed(x)  # (B, L, D)
            normed = self.norm1(tokens)
            pooled = self.attn(normed)  # (B, D)
            out = pooled + self.mlp(self.norm2(pooled))
        trace.clouds = {"embedded": tokens, "normed": normed, "attention output": pooled, "output": out}
        trace.attention = {"attn": probs["attn"][:, :, 0]}  # (B, 1, L)
        return trace


class QueryBlock(Block):
    """timm's pre-norm ``Block`` in which the first token (the sandbox's query token) takes the
    attention's output *without* its residual, as P5's pooled token does; every other token
    keeps both residuals, and the feed-forward's residual is kept for all.

    A subclass, not a rewrite: hooks on the block (``cond_tokens``' entry) and on its attention
    (the variants) see what they see in timm's ``Block``."""

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        update = self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)))
        x = torch.cat([update[:, :1], x[:, 1:] + update[:, 1:]], dim=1)  # (B, 1 + L, D)
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class MultiHeadSandbox(_Embedded):
    """The sandbox around standard pre-norm transformer blocks (timm's ``Block``).

    A learned query token (initialised like the embeddings) is prepended to the ``L``
    embedded tokens; ``depth`` blocks of multi-head self-attention and a GELU feed-forward
    (width ``ffn_dim``), both residual behind gain-free RMSNorms, follow; the query token's
    final state is read out through the tied embedding. ``dim`` must be a multiple of
    ``num_heads`` (with ``dim = 2``: ``num_heads`` 1 or 2). ``query_residual=False`` makes the
    blocks :class:`QueryBlock` s: the query token's state is the attention's output alone, as
    P5's pooled token is. ``query_in_keys=False`` masks the query token out of every block's keys:
    it reads the tokens and is read by none, itself included, as P5's learned query
    (conf/backbone/sandbox_multihead.yaml says which setting learns).
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        dim: int = 2,
        num_heads: int = 2,
        depth: int = 1,
        ffn_dim: int = 32,
        qkv_bias: bool = False,
        eps: float = 1e-5,
        num_embeddings: int | None = None,
        query_residual: bool = True,
        init_scale: float = 1.0,
        query_in_keys: bool = True,
    ) -> None:
        if dim % num_heads:
            raise ConfigError(f"sandbox_multihead: dim={dim} is not a multiple of num_heads={num_heads}")
        super().__init__(num_embeddings or vocab_size, seq_len, dim, init_scale)
        self.query_token = nn.Parameter(torch.randn(1, 1, dim) * init_scale)  # like the embeddings
        self.query_in_keys = query_in_keys
        block = Block if query_residual else QueryBlock
        self.blocks = nn.Sequential(
            *(
                block(
                    dim,
                    num_heads,
                    mlp_ratio=ffn_dim / dim,
                    qkv_bias=qkv_bias,
                    norm_layer=partial(RMSNorm, eps=eps),
                )
                for _ in range(depth)
            )
        )

    def _tokens(self, x: Tensor) -> Tensor:  # (B, L) -> (B, 1 + L, D)
        tokens = self.embed(x)
        return torch.cat([self.query_token.expand(x.shape[0], -1, -1), tokens], dim=1)

    def _key_mask(self, tokens: Tensor) -> Tensor | None:
        """``(1, 1, 1, 1 + L)`` bool, true = attend: every key but the query token's, or None
        (every key) with ``query_in_keys``."""
        if self.query_in_keys:
            return None
        return (torch.arange(tokens.shape[1], device=tokens.device) > 0).view(1, 1, 1, -1)

    def _blocks(self, h: Tensor) -> Tensor:  # (B, 1 + L, D) -> (B, 1 + L, D)
        mask = self._key_mask(h)
        for block in self.blocks:
            h = block(h, attn_mask=mask)
        return h

    def forward(self, x: Tensor) -> Tensor:  # (B, L) -> (B, V)
        return self.readout(self._blocks(self._tokens(x))[:, 0])

    def token_entry(self, where: Where = "block") -> TokenEntry:
        """``block``: the first block's input ``(B, 1 + L, D)`` (query token and positions
        included); ``embed``: the token embeddings ``(B, L, D)``, before either joins."""
        if where == "embed":
            return TokenEntry(self.token_emb, "BND", at="output")
        return TokenEntry(self.blocks[0], "BND")

    @torch.no_grad()
    def trace(self, x: Tensor) -> Trace:
        """Every block's token cloud (query token first) and the query token's attention."""
        trace = Trace(readout=self.token_emb.weight.detach().clone())
        attns = {f"block{i}": block.attn for i, block in enumerate(self.blocks)}
        with capture_probs(attns) as probs:
            h = self._tokens(x)  # (B, 1 + L, D)
            trace.clouds["embedded"] = h
            mask = self._key_mask(h)
            for i, block in enumerate(self.blocks):
                h = block(h, attn_mask=mask)
                trace.clouds[f"block{i}"] = h
        trace.clouds["output"] = h[:, 0]
        trace.attention = {name: p[:, :, 0] for name, p in probs.items()}  # (B, H, 1 + L)
        return trace
