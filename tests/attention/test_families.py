"""Every variant on a tiny configuration of every supported timm family: forward, backward,
and the variant's effect on the output."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TINY_FAMILIES, logits, tiny_model

from src import attention

# Every variant and every form of it. spectral's default lam = 10 saturates DaViT's channel
# softmax (no gradient reaches W_K, W_V there; see test_spectral), so the identity form runs
# here with lam = 1.
FORMS = {
    "precond": {},
    "spectral-identity": {"mode": "identity", "lam": 1.0},
    "spectral-svd": {"mode": "svd"},
    "cond_init": {},
    "cond_init-per_head": {"value": "per_head"},
    "cond_tokens-svd": {"method": "svd"},
    "cond_tokens-polar": {"method": "polar"},
    "mimetic": {},
}


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_standard_leaves_outputs_unchanged(family, images):
    untouched = tiny_model(family).eval()
    model = attention.apply(copy.deepcopy(untouched), "standard")
    torch.testing.assert_close(logits(model(images)), logits(untouched(images)), rtol=0, atol=0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_variant_trains_and_changes_the_output(family, form, images):
    untouched = tiny_model(family).train()
    variant = form.split("-")[0]
    model = attention.apply(copy.deepcopy(untouched), variant, **FORMS[form]).train()
    torch.manual_seed(0)
    out = logits(model(images))
    torch.manual_seed(0)
    reference = logits(untouched(images))
    assert out.shape == reference.shape and torch.isfinite(out).all()
    assert not torch.allclose(out, reference, atol=1e-4), f"{variant} did not change {family}'s output"

    out.square().mean().backward()
    for site in attention.find_sites(model):
        for name, proj in site.projections().items():
            grad = (
                proj.linear.parametrizations.weight.original.grad
                if variant == "spectral"
                else proj.linear.weight.grad
            )
            assert grad is not None and torch.isfinite(grad).all(), f"{site.name} {name}"
            assert grad[proj.rows].abs().sum() > 0, f"no gradient reaches {site.name} {name}"


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_attention_module_is_found(family):
    model = tiny_model(family)
    sites = attention.find_sites(model)
    attention_modules = [n for n, m in model.named_modules() if n.endswith("attn") and hasattr(m, "proj")]
    assert [s.name for s in sites] == attention_modules
    for s in sites:
        assert s.num_heads * s.head_dim == s.q.width == s.out.in_features
