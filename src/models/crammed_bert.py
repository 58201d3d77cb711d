"""The Crammed BERT encoder on the suite's attention interface.

The architecture of Geiping & Goldstein, "Cramming: Training a Language Model on a Single GPU
in One Day" (2022), as their reference implementation configures it (``JonasGeiping/cramming``,
``arch/crammed-bert.yaml``; the paper's §"Modifying the architecture"):

* embedding: a word embedding (``padding_idx`` 0) plus scaled sinusoidal positions (the fixed
  sinusoidal table times one learned scalar, initialised to ``1/√D``), then dropout, then a
  LayerNorm ("embedding normalisation");
* ``depth`` pre-norm blocks ``x + drop(attn(LN(x), mask))``, ``x + drop(ffn(LN(x)))`` with
  LayerNorm eps ``1e-12``, and a final LayerNorm after the last block;
* every linear layer of the encoder and the decoder without a bias (QKV, output projection,
  feed-forward, decoder);
* a gated feed-forward (GELU-GLU): ``D -> ffn_dim``, split into halves ``x, gate``,
  ``gelu(gate) * x`` (``ffn_dim / 2`` wide), ``-> D``;
* initialisation: every Linear and Embedding weight ``N(0, 0.02²)`` (the padding row of the
  word embedding zero, as ``padding_idx`` keeps it), biases zero;
* the MLM decoder is the word embedding itself ("skip_head_transform", no bias):
  ``logits = h Eᵀ``; prediction is sparse, the task picks the masked positions and calls
  :meth:`CrammedBERT.mlm_logits` on them;
* the GLUE classifier (``eval/GLUE_sane.yaml``): the first token's final state ("zero_index")
  through ``Linear(D, head_dim) -> Tanh -> dropout -> Linear(head_dim, num_labels)``;
  ``num_labels = 1`` is regression (STS-B).

Attention is timm's :class:`timm.layers.Attention` (no biases), so every attention variant finds
it through :mod:`src.attention.timm_families`. Padding is a boolean key mask ``(B, 1, 1, N)``
(true = attend): SDPA takes it on the fused path and timm turns it into a ``0 / -inf`` bias on
the explicit path (the conditioning monitor's); padded queries are computed and never read.

``pretrained`` is only stored: the task applies the attention variant first and then calls
:meth:`CrammedBERT.load_pretrained`, so that a parametrized weight's keys match the checkpoint's.
The task hands it the checkpoint it has read (``tasks/glue``); given only a path, the model reads
the file with torch's safe loader itself (tensors and plain data, as the run record saves them),
knowing nothing else of the run record.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import Attention
from torch import Tensor, nn

from src.attention import TokenEntry
from src.attention.sites import Where
from src.errors import ConfigError

from .lra import sinusoidal_positions

#: Key prefixes of the classification head: never loaded from a pretrained checkpoint.
HEAD_PREFIXES = ("pooler.", "head.")


class GatedFFN(nn.Module):
    """GELU-GLU feed-forward: ``dense_out(gelu(gate) * x)`` with ``x, gate`` the halves of ``dense_in``."""

    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        if ffn_dim % 2:
            raise ValueError(f"ffn_dim={ffn_dim} must be even: the gated unit splits it in halves")
        self.dense_in = nn.Linear(dim, ffn_dim, bias=False)
        self.dense_out = nn.Linear(ffn_dim // 2, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # (B, N, D)
        x, gate = self.dense_in(x).chunk(2, dim=-1)  # (B, N, F/2) each
        return self.dense_out(F.gelu(gate) * x)  # (B, N, D)


class Block(nn.Module):
    """Pre-norm block: ``x + drop(attn(LN(x), mask))``, ``x + drop(ffn(LN(x)))``."""

    def __init__(self, dim: int, num_heads: int, ffn_dim: int, drop: float, eps: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads, qkv_bias=False, proj_bias=False, attn_drop=drop, proj_drop=0.0)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.ffn = GatedFFN(dim, ffn_dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:  # (B, N, D), (B, 1, 1, N)
        x = x + self.drop(self.attn(self.norm1(x), attn_mask=attn_mask))
        return x + self.drop(self.ffn(self.norm2(x)))


class CrammedBERT(nn.Module):
    """Crammed BERT: ids ``(B, N)`` -> MLM logits ``(B, N, V)``, or class logits ``(B, C)``
    when ``num_labels > 0`` (module docstring for the architecture and its sources).

    Attention sites: its ``timm.layers.Attention`` modules are found by the ViT family's adapter,
    :func:`src.attention.timm_families.vit_attention_site` (sites are looked up by attention
    class, and this is ViT's); the suite adds no adapter for it. Token entry: :meth:`token_entry`.

    Args:
        vocab_size: the tokenizer's vocabulary (the task passes it; Cramming's is 32768).
        max_len: the longest sequence (rows of the sinusoidal table).
        dim, depth, num_heads: width ``D``, blocks, attention heads.
        ffn_dim: width of the gated unit's input projection (its output is half of it).
        drop: dropout on the embeddings, the attention probabilities, the residual branches and
            the pooler (fine-tuning keeps 0.1; pretraining sets 0).
        norm_eps: every LayerNorm's eps; init_std: the std of every Linear and Embedding weight.
        num_labels: classes of the classification head; 0 builds none (MLM), 1 is regression.
        head_dim: the pooler's width (not the attention head size, which is ``D / num_heads``).
        pad_id: the padding token, the word embedding's ``padding_idx``.
        pretrained: a checkpoint path that :meth:`load_pretrained` reads later; only stored here.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int = 128,
        dim: int = 768,
        depth: int = 16,
        num_heads: int = 12,
        ffn_dim: int = 3072,
        drop: float = 0.1,
        norm_eps: float = 1e-12,
        init_std: float = 0.02,
        num_labels: int = 0,
        head_dim: int = 1024,
        pad_id: int = 0,
        pretrained: str | None = None,
    ) -> None:
        super().__init__()
        self.vocab_size, self.max_len, self.num_labels = vocab_size, max_len, num_labels
        self.pretrained = pretrained
        self.word_embedding = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.register_buffer("positions", sinusoidal_positions(max_len, dim), persistent=False)
        self.pos_scale = nn.Parameter(torch.tensor(1.0 / math.sqrt(dim)))
        self.embed_drop = nn.Dropout(drop)
        self.embed_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.blocks = nn.ModuleList(Block(dim, num_heads, ffn_dim, drop, norm_eps) for _ in range(depth))
        self.final_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.decoder = nn.Linear(dim, vocab_size, bias=False)
        self.decoder.weight = self.word_embedding.weight  # tied: one (V, D) table
        if num_labels > 0:
            self.pooler = nn.Sequential(nn.Linear(dim, head_dim), nn.Tanh(), nn.Dropout(drop))
            self.head = nn.Linear(head_dim, num_labels)
        self.init_weights(init_std)

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Cramming's ``normal`` init: Linear and Embedding weights ``N(0, std²)``, biases zero,
        the padding row zero (``padding_idx``'s convention)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        self.word_embedding.weight[self.word_embedding.padding_idx].zero_()

    def token_entry(self, where: Where = "block") -> TokenEntry:
        """``block``: the first block's input (normalised embeddings, positions included);
        ``embed``: the word embedding's output, before positions join.

        [reading] Padding tokens are part of the token matrix ``cond_tokens`` conditions: the
        entry sees the whole padded sequence ``(B, N, D)``, so with ``cond_tokens`` a sequence's
        encoding depends on how much padding its batch has (the attention mask alone does not).
        """
        if where == "embed":
            return TokenEntry(self.word_embedding, at="output")
        return TokenEntry(self.blocks[0], at="input")

    def encode(self, ids: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """Final hidden states ``(B, N, D)`` of ``ids (B, N)``; ``pad_mask (B, N)`` is true at real
        tokens (padded keys are masked; ``None``: every position attends to every other)."""
        n = ids.shape[1]
        if n > self.max_len:
            raise ValueError(f"sequence of {n} tokens is longer than max_len={self.max_len}")
        x = self.word_embedding(ids) + self.pos_scale * self.positions[:n]  # (B, N, D)
        x = self.embed_norm(self.embed_drop(x))
        attn_mask = None if pad_mask is None else pad_mask.bool()[:, None, None, :]  # (B, 1, 1, N)
        for block in self.blocks:
            x = block(x, attn_mask)
        return self.final_norm(x)  # (B, N, D)

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """Tied, bias-free decoder: ``(..., D) -> (..., V)``, ``hidden @ Eᵀ``."""
        return self.decoder(hidden)

    def classify(self, ids: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """Class logits ``(B, num_labels)`` from the first token's final state."""
        if self.num_labels <= 0:
            raise ValueError("classify needs a classification head: build CrammedBERT with num_labels > 0")
        first = self.encode(ids, pad_mask)[:, 0]  # (B, D)
        return self.head(self.pooler(first))  # (B, C)

    def forward(self, ids: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """``classify`` with a head (``(B, C)``), else MLM logits at every position ``(B, N, V)``."""
        if self.num_labels > 0:
            return self.classify(ids, pad_mask)
        return self.mlm_logits(self.encode(ids, pad_mask))

    def num_params(self, embeddings: bool = False) -> int:
        """Parameters, counted once (the tied decoder is the embedding); without ``embeddings`` the
        word embedding and the position scale are left out (the non-embedding count)."""
        total = sum(p.numel() for p in self.parameters())
        return total if embeddings else total - self.word_embedding.weight.numel() - self.pos_scale.numel()

    def load_pretrained(self, path: str | Path | None = None, saved: dict | None = None) -> dict[str, Any]:
        """Load an MLM run's weights (``path``, default ``self.pretrained``) into everything but the
        classification head; ``{"path", "step"}`` of what was loaded.

        Reads a suite checkpoint (``{"model": state dict, "step": …}``) or a plain state dict.
        Every key of the encoder must be there with its shape (the same backbone size and the same
        attention variant, whose parametrizations rename weights); a head in the file is ignored.
        ``saved``: the file's content when the caller has read it already (it is not read again).
        """
        chosen = path if path is not None else self.pretrained
        if chosen is None:
            raise ConfigError("load_pretrained: no path given and backbone.model.pretrained is null")
        file = Path(chosen)
        state, step = _state_of(file, _read(file) if saved is None else saved)
        state = {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}
        own = {k: v for k, v in self.state_dict().items() if not k.startswith(HEAD_PREFIXES)}
        _check_fits(file, own, state)
        self.load_state_dict(state, strict=False)
        return {"path": str(file), "step": step}


def _read(file: Path) -> Any:
    """What ``file`` holds, or one :class:`ConfigError` saying what it must be."""
    if not file.is_file():
        raise ConfigError(
            f"backbone pretrained={file}: no such file; it must be an mlm run's checkpoints/last.pt "
            "(python -m src.run task=mlm makes one)"
        )
    try:
        saved = torch.load(file, map_location="cpu", weights_only=True)  # tensors and plain data only
    except Exception as error:  # noqa: BLE001  truncated, corrupt or not a torch file: one message
        raise ConfigError(f"backbone pretrained={file}: cannot read a checkpoint ({error})") from error
    return saved


def _state_of(file: Path, saved: Any) -> tuple[dict[str, Tensor], int | None]:
    """The state dict ``file`` held and the step it was saved at (``None`` for a plain state dict)."""
    if isinstance(saved, dict) and isinstance(saved.get("model"), dict):
        step = saved.get("step", (saved.get("loop") or {}).get("step"))  # the loop's checkpoints: loop.step
        return saved["model"], None if step is None else int(step)
    if isinstance(saved, dict):
        return saved, None
    raise ConfigError(f"backbone pretrained={file}: holds a {type(saved).__name__}, not a state dict")


def _check_fits(file: Path, own: dict[str, Tensor], state: dict[str, Tensor]) -> None:
    """ConfigError naming the file and a few keys unless ``state`` has exactly ``own``'s keys and shapes."""
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    reshaped = sorted(
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in own.keys() & state.keys()
        if state[k].shape != own[k].shape
    )
    if not (missing or unexpected or reshaped):
        return
    found = [
        f"{label} ({len(keys)}): {', '.join(keys[:3])}"
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("other shapes", reshaped))
        if keys
    ]
    raise ConfigError(
        f"backbone pretrained={file} does not fit this CrammedBERT: {'; '.join(found)}. The checkpoint "
        "must come from the same backbone size and the same attention variant"
    )
