"""Every variant on a tiny configuration of every supported timm family: forward, backward,
and the variant's effect on the output, at the options ``conf/attn/<variant>.yaml`` configures
(and a few non-default readings on top of them)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from conftest import CONF, TINY_FAMILIES, logits, tiny_model
from omegaconf import OmegaConf
from torch.nn.utils import parametrize

from src import attention


def configured(variant: str) -> dict[str, Any]:
    """The options ``conf/attn/<variant>.yaml`` gives ``variant``: what a run uses by default."""
    options = OmegaConf.to_container(OmegaConf.load(CONF / "attn" / f"{variant}.yaml"), resolve=True)
    assert isinstance(options, dict) and options.pop("variant") == variant
    options.pop("_target_")
    return options


#: Every registered variant but the baseline, at its configured defaults (``conf/attn/<name>.yaml``,
#: which test_registry checks exists for each): a default changed in the yaml is the one tested here.
DEFAULTS = [name for name in attention.VARIANTS if name != "standard"]
#: Non-default readings, as overrides of the configured defaults. spectral: the svd correction on
#: every projection (P2 Thm 3.5 literally), and the literal identity shift on every projection
#: at lam = 1 (at the paper's lam = 10 it saturates DaViT's channel softmax: no gradient reaches
#: W_K, W_V of stages.0.blocks.0.1.attn; see test_spectral).
EXTRA: dict[str, dict[str, Any]] = {
    "precond-gain": {"gain": True},
    "spectral-svd": {"mode": "svd", "targets": "qkv"},
    "spectral-qkv": {"targets": "qkv", "lam": 1.0},
    "cond_init-per_head": {"value": "per_head"},
    "cond_tokens-polar": {"method": "polar"},
}
FORMS = [*DEFAULTS, *EXTRA]


def options(form: str) -> dict[str, Any]:
    """``form``'s options: the variant's configured defaults, overridden by the form's own."""
    return {**configured(form.split("-")[0]), **EXTRA.get(form, {})}


def trained_weight(linear: torch.nn.Linear) -> torch.Tensor:
    """The trained parameter behind ``linear.weight`` (under a parametrization, its original)."""
    if parametrize.is_parametrized(linear, "weight"):
        return linear.parametrizations.weight.original
    return linear.weight


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_standard_leaves_outputs_unchanged(family: str, images: torch.Tensor) -> None:
    untouched = tiny_model(family).eval()
    model = attention.apply(copy.deepcopy(untouched), "standard", **configured("standard"))
    torch.testing.assert_close(logits(model(images)), logits(untouched(images)), rtol=0, atol=0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_variant_trains_and_changes_the_output(family: str, form: str, images: torch.Tensor) -> None:
    """At the configured options: the output is finite and changed, and a non-zero gradient
    reaches every projection of every site and every parameter the variant adds."""
    untouched = tiny_model(family).train()
    variant = form.split("-")[0]
    model = attention.apply(copy.deepcopy(untouched), variant, **options(form)).train()
    torch.manual_seed(0)
    out = logits(model(images))
    torch.manual_seed(0)
    reference = logits(untouched(images))
    assert out.shape == reference.shape and torch.isfinite(out).all()
    assert not torch.allclose(out, reference, atol=1e-4), f"{variant} did not change {family}'s output"

    out.square().mean().backward()
    for site in attention.find_sites(model):
        for name, proj in site.projections().items():
            grad = trained_weight(proj.linear).grad
            assert grad is not None and torch.isfinite(grad).all(), f"{site.name} {name}"
            assert grad[proj.rows].abs().sum() > 0, f"no gradient reaches {site.name} {name}"
    before = {n for n, _ in untouched.named_parameters()}
    for n, p in model.named_parameters():
        if n not in before and ".parametrizations." not in n:  # added by the variant (precond's gain)
            assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {n}"


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_attention_module_is_found(family):
    model = tiny_model(family)
    sites = attention.find_sites(model)
    attention_modules = [n for n, m in model.named_modules() if n.endswith("attn") and hasattr(m, "proj")]
    assert [s.name for s in sites] == attention_modules
    for s in sites:
        assert s.num_heads * s.head_dim == s.q.width == s.out.in_features
