"""cond_init: semi-orthogonal W_Q and W_K per head, an identity W_V, nothing else touched."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from src import attention


@pytest.mark.parametrize("family", ["vit", "swin", "xcit", "davit", "eva", "eva_fused", "beit"])
def test_query_and_key_heads_are_semi_orthogonal_and_distinct(family):
    model = attention.apply(tiny_model(family), "cond_init")
    for site in attention.find_sites(model):
        w = site.head_weights()
        eye = torch.eye(site.head_dim).expand(site.num_heads, -1, -1)
        for key in ("W_Q", "W_K"):
            torch.testing.assert_close(w[key].mT @ w[key], eye, atol=1e-5, rtol=0)  # WᵀW = I_d
        assert (w["W_Q"] - w["W_K"]).abs().max() > 0.1


@pytest.mark.parametrize("value", ["fused", "per_head"])
def test_value_is_the_identity_the_option_names(value):
    model = attention.apply(tiny_model("vit"), "cond_init", value=value)
    for site in attention.find_sites(model):
        w_v = site.head_weights()["W_V"]  # (H, D, d)
        for h in range(site.num_heads):
            offset = h * site.head_dim if value == "fused" else 0
            expected = torch.zeros(site.dim, site.head_dim)
            expected[offset : offset + site.head_dim] = torch.eye(site.head_dim)
            torch.testing.assert_close(w_v[h], expected, rtol=0, atol=0)


def test_only_query_key_value_weights_change():
    before = tiny_model("vit").state_dict()
    after = attention.apply(tiny_model("vit"), "cond_init").state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {f"blocks.{i}.attn.qkv.weight" for i in range(2)}


def test_draws_follow_the_global_seed():
    first = attention.apply(tiny_model("vit", seed=3), "cond_init").blocks[0].attn.qkv.weight
    torch.manual_seed(3)
    again = attention.apply(tiny_model("vit", seed=3), "cond_init").blocks[0].attn.qkv.weight
    torch.manual_seed(4)
    other = attention.apply(tiny_model("vit", seed=4), "cond_init").blocks[0].attn.qkv.weight
    assert torch.equal(first, again) and not torch.equal(first, other)
