"""The diagnostics see a variant's token corrections through the seam (``TokenEntry``), never
by the variant's name: the entry lists what was registered on it and maps the embedding table
through it; the Gram helper is the one the variants and κ share."""

from __future__ import annotations

import copy

import pytest
import torch
from timm.layers import Attention
from torch import Tensor, nn

from src import attention
from src.attention.cond_tokens import vocabulary_map
from src.conditioning import ConditioningMonitor, kappa


class Embedder(nn.Module):
    """A causal decoder's token entry and one attention layer: ``ids (B, N) -> (B, N, D)``."""

    def __init__(self, vocab: int = 40, dim: int = 16) -> None:
        super().__init__()
        self.wte, self.attn = nn.Embedding(vocab, dim), Attention(dim, num_heads=2)
        with torch.no_grad():
            self.wte.weight.mul_(torch.logspace(0, -2, dim))  # κ(E) about 100

    def token_entry(self, where: str = "block") -> attention.TokenEntry:
        return attention.TokenEntry(self.wte, at="output", causal=True)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.wte(ids)  # (B, N, D)
        return x + self.attn(x, is_causal=True)


class FeatureScale(nn.Module):
    """A token-wise transform that is no variant: scales feature ``j`` of every token by ``s_j``."""

    def __init__(self, scale: Tensor) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, tokens: Tensor) -> Tensor:  # (B, N, D)
        return tokens * self.scale.to(tokens.dtype)


def test_an_entry_lists_its_transforms_and_maps_the_table_through_them():
    """``TokenEntry.transforms()`` reads what was registered on the entry (a deep copy reads its
    own copies); ``table()`` is the table every transform maps: for cond_tokens ``E + E·M``."""
    torch.manual_seed(0)
    model = Embedder()
    entry = attention.find_token_entry(model)
    assert entry.transforms() == []
    table = model.wte.weight.detach().double()  # (V, D)
    torch.testing.assert_close(entry.table(), table, rtol=0, atol=0)
    attention.apply(model, "cond_tokens")
    assert entry.transforms() == [model.token_conditioner]
    expected = table + table @ vocabulary_map(table, method="newton_schulz")  # the default method's map
    torch.testing.assert_close(entry.table(), expected, rtol=0, atol=0)
    twin = copy.deepcopy(model)
    assert attention.find_token_entry(twin).transforms() == [twin.token_conditioner]
    assert twin.token_conditioner is not model.token_conditioner
    with pytest.raises(ValueError, match="causal"):
        attention.TokenEntry(nn.Linear(2, 2)).table()


def test_the_monitor_knows_no_variant_by_name():
    """A transform registered by hand on the entry, no variant at all, is what the monitor's
    ``kappa/tokens/table`` measures: κ(E·diag(s))."""
    torch.manual_seed(0)
    model = Embedder()
    before = ConditioningMonitor(model).weights()["kappa/tokens/table"]
    scale = torch.logspace(0, -1, 16)
    attention.find_token_entry(model).register(FeatureScale(scale))
    measured = ConditioningMonitor(model).weights()["kappa/tokens/table"]
    assert before == pytest.approx(kappa(model.wte.weight).item(), rel=1e-6)
    assert measured == pytest.approx(kappa(model.wte.weight.double() * scale.double()).item(), rel=1e-9)
    assert measured > 5 * before  # the scaling, a tenfold spread more, is seen


def test_the_monitor_reads_cond_tokens_through_the_entry():
    """cond_tokens' correction bounds the table's κ by 2; the monitor sees it without naming it."""
    torch.manual_seed(0)
    model = attention.apply(Embedder(), "cond_tokens")
    assert ConditioningMonitor(model).weights()["kappa/tokens/table"] <= 2 + 1e-6
