"""Where an attention variant touches a model: attention sites and the token entry.

A variant never looks at a model class. It acts on

* :class:`AttentionSite` -- one multi-head attention module described in the terms of
  docs/methods.md#notation: the number of heads ``H`` and head size ``d``, where ``W_Q``, ``W_K``,
  ``W_V`` and ``W_O`` live, which module receives the concatenated head output (the place
  ``precond`` scales it), and which module sees the attention probabilities ``P`` when the
  module runs its explicit (non-fused) path (the place the conditioning monitor reads them);
* :class:`TokenEntry` -- a module whose first input (or output) is an embedded-token
  matrix: the tokens entering the first transformer layer (``where="block"``, the place the
  conditioning monitor measures them) or the token embeddings before positions and class
  token join (``where="embed"``); ``cond_tokens`` corrects the one its ``where`` names.

timm's families are described by the adapters in :mod:`src.attention.timm_families`. The
suite's own models implement the interface directly, in two methods:

* an attention module defines ``attention_site(self, name: str) -> AttentionSite``;
* a model defines ``token_entry(self, where="block") -> TokenEntry`` (``where`` is
  ``"block"`` or ``"embed"``).

Convention: ``nn.Linear`` stores ``weight`` as ``(out, in)``; docs/methods.md#notation writes ``x W`` with
``W`` of shape ``(D, d)``. A projection's rows ``[start, start + H*d)`` are therefore
``[W^(1) ... W^(H)]ᵀ``, head ``h`` owning rows ``start + h*d ... start + (h+1)*d - 1``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

Layout = Literal["BND", "BHWC", "BCHW"]
#: Which token matrix a token entry names: the first layer's input, or the token embeddings
#: before positions and class token join.
Where = Literal["embed", "block"]


@dataclass(frozen=True)
class Projection:
    """Rows ``[start, start + width)`` of ``linear.weight``: one of W_Q, W_K, W_V, all heads."""

    linear: nn.Linear
    start: int
    width: int

    @property
    def rows(self) -> slice:
        return slice(self.start, self.start + self.width)

    def weight(self) -> Tensor:
        """The effective rows, corrections included (a parametrized weight is evaluated)."""
        return self.linear.weight[self.rows]  # (H*d, D)

    def raw(self) -> Tensor:
        """The trainable rows: the parameter itself, under any parametrization."""
        if parametrize.is_parametrized(self.linear, "weight"):
            return self.linear.parametrizations.weight.original[self.rows]
        return self.linear.weight[self.rows]

    def heads(self, num_heads: int) -> Tensor:
        """Effective per-head matrices in the convention of docs/methods.md#notation, ``(H, D, d)``."""
        w = self.weight()  # (H*d, D)
        return w.unflatten(0, (num_heads, -1)).transpose(1, 2)


@dataclass
class AttentionSite:
    """One multi-head attention module, as the variants and the diagnostics see it.

    Attributes:
        name: the module's path in the model (``blocks.3.attn``).
        module: the attention module.
        num_heads, head_dim: ``H`` and ``d``.
        q, k, v: where ``W_Q``, ``W_K``, ``W_V`` live.
        out: the output projection ``W_O`` (input ``H*d`` features, head-major).
        head_output: the module whose first input is the concatenated head output
            ``(..., H*d)``, head-major; ``precond`` scales that input.
        probs: the module that sees ``P`` on the explicit path, or ``None`` where ``P`` is
            never materialised; ``probs_at`` says whether ``P`` is its input or its output.
        kind: ``"token"`` (``P`` is ``N×N``) or ``"channel"`` (cross-covariance attention
            as in XCiT and DaViT's channel blocks: ``P`` is ``d×d``).
    """

    name: str
    module: nn.Module
    num_heads: int
    head_dim: int
    q: Projection
    k: Projection
    v: Projection
    out: nn.Linear
    head_output: nn.Module
    probs: nn.Module | None = None
    probs_at: Literal["input", "output"] = "input"
    kind: Literal["token", "channel"] = "token"

    @property
    def dim(self) -> int:
        """``D``, the width of the tokens entering the projections."""
        return self.q.linear.in_features

    def projections(self) -> dict[str, Projection]:
        return {"W_Q": self.q, "W_K": self.k, "W_V": self.v}

    def head_weights(self) -> dict[str, Tensor]:
        """Effective ``W_Q``, ``W_K``, ``W_V`` per head, each ``(H, D, d)``."""
        return {key: p.heads(self.num_heads) for key, p in self.projections().items()}

    @contextlib.contextmanager
    def explicit(self) -> Iterator[None]:
        """Run the module's non-fused path, so that ``P`` passes through ``probs``."""
        fused = getattr(self.module, "fused_attn", None)
        if fused is not None:
            self.module.fused_attn = False
        try:
            yield
        finally:
            if fused is not None:
                self.module.fused_attn = fused


@dataclass
class TokenEntry:
    """Where a token matrix ``(B, N, D)`` can be read and replaced: a module's first input
    or its output.

    ``at="input"``: the tokens are ``module``'s first argument (positional or ``x=``), seen by
    a forward pre-hook; ``at="output"``: they are its output, or element 0 of a tuple output
    (timm XCiT's ``ConvPatchEmbed`` returns ``(x, (Hp, Wp))``), seen by a forward hook.
    ``layout`` is the tensor's layout there.

    A causal decoder (``causal=True``) is entered at the output of its token ``nn.Embedding``
    (``at="output"``, ``module`` the embedding): a correction computed from a whole sequence
    would let a position see later tokens, so ``cond_tokens`` conditions that output with a
    correction that depends on the embedding table only (see :mod:`src.attention.cond_tokens`).
    """

    module: nn.Module
    layout: Layout = "BND"
    at: Literal["input", "output"] = "input"
    causal: bool = False

    def __post_init__(self) -> None:
        if self.at not in ("input", "output"):
            raise ValueError(f"TokenEntry.at must be 'input' or 'output', got {self.at!r}")
        if self.causal and (self.at != "output" or not isinstance(self.module, nn.Embedding)):
            raise ValueError(
                "a causal TokenEntry is the output of the token nn.Embedding: "
                "TokenEntry(embedding, at='output', causal=True)"
            )

    def to_tokens(self, x: Tensor) -> Tensor:
        """``x`` in the module's layout -> ``(B, N, D)``."""
        if self.layout == "BND":
            return x
        if self.layout == "BHWC":
            return x.flatten(1, 2)
        return x.flatten(2).transpose(1, 2)  # BCHW

    def from_tokens(self, tokens: Tensor, like: Tensor) -> Tensor:
        """``(B, N, D)`` back to the layout (and shape) of ``like``."""
        if self.layout == "BND":
            return tokens
        if self.layout == "BHWC":
            return tokens.reshape(like.shape)
        return tokens.transpose(1, 2).reshape(like.shape)  # BCHW

    def transformed(self, x: Tensor, transform: Callable[[Tensor], Tensor]) -> Tensor:
        """``x`` (in the module's layout) with its tokens replaced by ``transform`` of them."""
        return self.from_tokens(transform(self.to_tokens(x)), like=x)

    def register(self, transform: Callable[[Tensor], Tensor]) -> torch.utils.hooks.RemovableHandle:
        """Replace the entry's tokens (the module's first input, or its output) by ``transform``
        of them, a ``(B, N, D) -> (B, N, D)`` map.

        ``transform`` should be a module owned by the model (or a bound method of one), so
        that a deep copy of the model (EMA, for instance) hooks its own copy. On a causal entry
        it must act on each token alone (:meth:`table` relies on it). :meth:`transforms` lists
        what is registered.
        """
        if self.at == "output":
            return self.module.register_forward_hook(_OutputHook(self, transform))
        return self.module.register_forward_pre_hook(_InputHook(self, transform), with_kwargs=True)

    def transforms(self) -> list[Callable[[Tensor], Tensor]]:
        """The transforms registered on this entry (:meth:`register`), in the order they run.

        Read from the module's hooks, so a diagnostic sees what a variant did to the tokens
        without knowing the variant, and a deep copy of the model reports its own copies.
        """
        hooks = self.module._forward_hooks if self.at == "output" else self.module._forward_pre_hooks
        kind = _OutputHook if self.at == "output" else _InputHook
        return [h.transform for h in hooks.values() if isinstance(h, kind)]

    def table(self) -> Tensor:
        """A causal entry's embedding table ``(V, D)`` as tokens leave the entry, in float64: every
        registered transform applied to the table's rows as one ``(1, V, D)`` token matrix.

        A transform on a causal entry acts token by token (it may not mix positions), so row
        ``i`` of the result is the embedding token ``i`` enters the model with.
        """
        if not self.causal:
            raise ValueError("TokenEntry.table() is defined for a causal entry (an nn.Embedding's output)")
        rows = self.module.weight.detach().double()[None]  # (1, V, D)
        for transform in self.transforms():
            rows = transform(rows)
        return rows[0]  # (V, D)

    def observe(self, keep: Callable[[Tensor], None]) -> torch.utils.hooks.RemovableHandle:
        """Call ``keep`` with the ``(B, N, D)`` tokens the entry passes on (after any correction
        registered before this observer)."""
        if self.at == "output":
            return self.module.register_forward_hook(lambda m, a, out: keep(self.to_tokens(_first(out))))
        return self.module.register_forward_pre_hook(
            lambda m, a, kw: keep(self.to_tokens(a[0] if a else kw["x"])), with_kwargs=True
        )


def _first(output: Tensor | tuple) -> Tensor:
    """The tokens of a module's output: the output, or element 0 of a tuple output."""
    return output[0] if isinstance(output, tuple) else output


class _OutputHook:
    """A forward hook that replaces a module's output (or element 0 of a tuple output)."""

    def __init__(self, entry: TokenEntry, transform: Callable[[Tensor], Tensor]) -> None:
        self.entry, self.transform = entry, transform

    def __call__(self, module: nn.Module, args: tuple, output: Tensor | tuple) -> Tensor | tuple:
        if isinstance(output, tuple):
            return (self.entry.transformed(output[0], self.transform), *output[1:])
        return self.entry.transformed(output, self.transform)


class _InputHook:
    """A forward pre-hook that rewrites the tokens argument (positional or ``x=``)."""

    def __init__(self, entry: TokenEntry, transform: Callable[[Tensor], Tensor]) -> None:
        self.entry, self.transform = entry, transform

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (self.entry.transformed(args[0], self.transform), *args[1:]), kwargs
        return args, {**kwargs, "x": self.entry.transformed(kwargs["x"], self.transform)}
