"""timm's agreement test (its ``tests/test_layers.py``: the same attention module with
``fused_attn`` on and off gives the same output) for every family × every variant: the fused
SDPA path a run trains with and the explicit-softmax path the conditioning monitor reads ``P``
from (:meth:`AttentionSite.explicit`) compute the same model."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import TINY_FAMILIES, logits, tiny_model
from torch import Tensor, nn

from src import attention


def _forward(model: nn.Module, images: Tensor, sites: list[attention.AttentionSite], explicit: bool):
    """The logits, and how many sites saw ``P`` through their ``probs`` module."""
    seen: set[str] = set()
    handles = [
        site.probs.register_forward_hook(lambda m, a, o, n=site.name: seen.add(n))
        for site in sites
        if site.probs is not None
    ]
    try:
        with contextlib.ExitStack() as stack:
            if explicit:
                for site in sites:
                    stack.enter_context(site.explicit())
            out = logits(model(images))
    finally:
        for h in handles:
            h.remove()
    return out, seen


@pytest.mark.parametrize("variant", attention.VARIANTS)
@pytest.mark.parametrize("family", TINY_FAMILIES)
@torch.no_grad()
def test_fused_and_explicit_attention_agree(family: str, variant: str, images: Tensor) -> None:
    model = attention.apply(tiny_model(family), variant).eval()
    sites = attention.find_sites(model)
    switchable = [s for s in sites if hasattr(s.module, "fused_attn")]
    for site in switchable:
        site.module.fused_attn = True  # timm's default may be off (TIMM_FUSED_ATTN)
    fused, seen_fused = _forward(model, images, sites, explicit=False)
    explicit, seen_explicit = _forward(model, images, sites, explicit=True)

    torch.testing.assert_close(explicit, fused, rtol=1e-4, atol=1e-5)
    # the two paths differ where a module has both: P is only materialised on the explicit one
    with_probs = {s.name for s in sites if s.probs is not None}
    assert seen_explicit == with_probs
    assert not seen_fused & {s.name for s in switchable}
    assert all(s.module.fused_attn for s in switchable)  # explicit() restored the setting
