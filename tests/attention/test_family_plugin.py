"""A new model family is one adapter: a toy family registered at runtime (and removed after)
gets attention sites, a token entry, a place in the error messages, and every variant."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from src import attention
from src.attention import timm_families
from src.attention.timm_families import Family


class ToyAttention(nn.Module):
    """Multi-head self-attention shaped like timm's: ``qkv``, ``proj``, ``attn_drop``, ``fused_attn``."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.fused_attn = num_heads, True
        self.qkv, self.proj, self.attn_drop = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.Dropout(0.0)

    def forward(self, x: Tensor) -> Tensor:  # (B, N, D)
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, -1)).permute(2, 0, 3, 1, 4)  # (B, H, N, d)
        if self.fused_attn:
            a = nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            a = self.attn_drop((q @ k.mT * q.shape[-1] ** -0.5).softmax(-1)) @ v  # P enters attn_drop
        return self.proj(a.transpose(1, 2).flatten(2))  # (B, N, H*d) -> (B, N, D)


class ToyNet(nn.Module):
    """8×8 patches of a ``3×32×32`` image -> 16 tokens of width 24 -> two attention layers -> 5 classes."""

    def __init__(self, dim: int = 24, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(3 * 64, dim)
        self.blocks = nn.Sequential(*(ToyAttention(dim, num_heads=3) for _ in range(depth)))
        self.head = nn.Linear(dim, 5)

    def forward(self, images: Tensor) -> Tensor:  # (B, 3, 32, 32)
        patches = nn.functional.unfold(images, 8, stride=8).transpose(1, 2)  # (B, 16, 192)
        x = self.embed(patches)  # (B, 16, D)
        x = x + self.blocks(x)
        return self.head(x.mean(1))  # (B, 5)


TOY = Family(
    name="toy",
    models=(ToyNet,),
    sites={ToyAttention: lambda n, m: timm_families.fused_qkv_site(n, m, m.num_heads, probs=m.attn_drop)},
    token_entry=lambda model, where: attention.TokenEntry(
        model.blocks[0] if where == "block" else model.embed, at="input" if where == "block" else "output"
    ),
    tiny=ToyNet,
)


@pytest.fixture
def toy() -> Family:
    """The toy family, registered for one test."""
    timm_families.register_family(TOY)
    yield TOY
    timm_families.unregister_family(TOY.name)


def images() -> Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def test_an_unregistered_family_is_unknown() -> None:
    """Without the adapter nothing of the toy is found, and the error lists the known models."""
    model = ToyNet()
    assert attention.find_sites(model) == []
    with pytest.raises(attention.AttentionConfigError) as err:
        attention.find_token_entry(model)
    supported = str(err.value).split("supported are")[1]
    assert "ToyNet" not in supported
    assert all(cls.__name__ in supported for f in timm_families.FAMILIES.values() for cls in f.models)


def test_the_adapter_gives_sites_and_token_entries(toy: Family) -> None:
    model = toy.tiny()
    sites = attention.find_sites(model)
    assert [s.name for s in sites] == ["blocks.0", "blocks.1"]
    assert all(s.num_heads == 3 and s.head_dim == 8 and s.probs is s.module.attn_drop for s in sites)
    assert attention.find_token_entry(model).module is model.blocks[0]
    embed = attention.find_token_entry(model, "embed")
    assert embed.module is model.embed and embed.at == "output"
    assert ToyAttention in timm_families.ADAPTERS
    with pytest.raises(attention.AttentionConfigError) as err:
        attention.find_token_entry(nn.Linear(2, 2))
    assert "ToyNet" in str(err.value).split("supported are")[1]


def test_unregistering_removes_the_family(toy: Family) -> None:
    timm_families.unregister_family(toy.name)
    try:
        assert ToyAttention not in timm_families.ADAPTERS and attention.find_sites(ToyNet()) == []
    finally:
        timm_families.register_family(toy)  # the fixture removes it


@pytest.mark.parametrize("variant", attention.VARIANTS)
@torch.no_grad()
def test_every_variant_applies_to_the_new_family(toy: Family, variant: str) -> None:
    """Applied to the toy, each variant is recorded and changes the output (``standard`` alone
    leaves it as it was)."""
    torch.manual_seed(0)
    untouched = toy.tiny().eval()
    model = attention.apply(copy.deepcopy(untouched), variant).eval()
    out, reference = model(images()), untouched(images())
    assert [v.name for v in model.attention_variants] == [variant]
    assert torch.isfinite(out).all()
    assert torch.equal(out, reference) == (variant == "standard")
