"""A GPT-2-style decoder on the suite's attention interface.

The architecture of GPT-2 (Radford et al., 2019) as nanoGPT writes it: learned token and
position embeddings, pre-norm blocks (LayerNorm, causal multi-head self-attention, LayerNorm,
a 4× GELU-tanh MLP), a final LayerNorm and an output layer tied to the token embedding.
Initialisation is GPT-2's: every weight ``N(0, 0.02²)``, biases zero, and the two projections
that write into the residual stream (``attn.proj``, ``mlp.fc2``) ``N(0, (0.02/√(2L))²)``.

Attention is timm's :class:`timm.layers.Attention` called with ``is_causal=True``: the fused
path is SDPA's causal kernel, the explicit path (the conditioning monitor's) masks the scores
above the diagonal before the softmax. timm's module already describes itself to the
attention variants (:mod:`src.attention.timm_families`), so every variant applies:
``precond`` scales each head's output after SDPA, so the causal mask is untouched;
``spectral``, ``cond_init`` and ``mimetic`` change the projection weights; ``cond_tokens``
finds the token embedding through :meth:`GPT.token_entry` (a causal entry: the correction is
computed from the embedding table, never from a sequence, see
:mod:`src.attention.cond_tokens`).

``vocab_multiple`` pads the vocabulary to a multiple (nanoGPT's 50304 for GPT-2's 50257,
faster matmuls on a GPU); padded rows are never inputs and never targets.
"""

from __future__ import annotations

import math

import torch
from timm.layers import Attention, GELUTanh, Mlp
from torch import Tensor, nn

from src.attention import TokenEntry
from src.attention.sites import Where


class Block(nn.Module):
    """Pre-norm transformer block with causal self-attention: ``x + attn(ln(x))``, ``x + mlp(ln(x))``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, drop: float, bias: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, bias=bias)
        self.attn = Attention(dim, num_heads, qkv_bias=bias, proj_bias=bias, attn_drop=drop, proj_drop=drop)
        self.ln_2 = nn.LayerNorm(dim, bias=bias)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=GELUTanh, bias=bias, drop=drop)

    def forward(self, x: Tensor) -> Tensor:  # (B, N, D)
        x = x + self.attn(self.ln_1(x), is_causal=True)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2-style causal language model: token ids ``(B, N)`` -> next-token logits ``(B, N, V)``.

    Attention sites: its ``timm.layers.Attention`` modules are found by the ViT family's adapter,
    :func:`src.attention.timm_families.vit_attention_site` (sites are looked up by attention
    class, and this is ViT's); the suite adds no adapter for it. Token entry: :meth:`token_entry`.

    Args:
        vocab_size: the tokenizer's vocabulary size (the task passes it).
        block_size: the number of learned positions, the longest sequence it takes.
        dim, depth, num_heads: width, number of blocks, heads per block.
        mlp_ratio: MLP hidden width over ``dim``.
        drop: dropout on the embeddings, the attention probabilities and the residual branches.
        bias: biases in the linear layers and LayerNorms (GPT-2 has them).
        vocab_multiple: pad the embedding table to a multiple of this; logits are cut back
            to ``vocab_size``.
        init_std: the standard deviation of GPT-2's initialisation.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        drop: float = 0.0,
        bias: bool = True,
        vocab_multiple: int = 1,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.vocab_size, self.block_size = vocab_size, block_size
        padded = math.ceil(vocab_size / vocab_multiple) * vocab_multiple
        self.wte = nn.Embedding(padded, dim)
        self.wpe = nn.Embedding(block_size, dim)
        self.drop = nn.Dropout(drop)
        self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_ratio, drop, bias) for _ in range(depth))
        self.ln_f = nn.LayerNorm(dim, bias=bias)
        self.lm_head = nn.Linear(dim, padded, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one (V, D) table
        self.init_weights(init_std)

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """GPT-2's initialisation, with the residual projections scaled by ``1/√(2·depth)``."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = std / math.sqrt(2 * len(self.blocks))
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, 0.0, residual_std)
            nn.init.normal_(block.mlp.fc2.weight, 0.0, residual_std)

    def token_entry(self, where: Where = "block") -> TokenEntry:
        """The token embedding's output, a causal entry, whatever ``where`` says.

        [reading] The suite's own method, not P3's (P3 has no causal model): a correction
        from the SVD of a sequence would let a position see later tokens, so ``cond_tokens``
        conditions the embedding table instead (:mod:`src.attention.cond_tokens`), and it does
        so before the positions join for ``where="embed"`` and ``"block"`` alike.
        """
        return TokenEntry(self.wte, at="output", causal=True)

    def forward(self, ids: Tensor) -> Tensor:  # (B, N) -> (B, N, V)
        n = ids.shape[1]
        if n > self.block_size:
            raise ValueError(f"sequence of {n} tokens is longer than block_size={self.block_size}")
        positions = torch.arange(n, device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(positions))  # (B, N, D)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, N, V_padded)
        return logits[..., : self.vocab_size]

    def num_params(self, embeddings: bool = False) -> int:
        """Parameters, counted once; without ``embeddings`` the token and position tables are
        left out (Kaplan et al.'s non-embedding count)."""
        total = sum(p.numel() for p in self.parameters())
        return total if embeddings else total - self.wte.weight.numel() - self.wpe.weight.numel()
