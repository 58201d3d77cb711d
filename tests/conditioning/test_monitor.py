"""The conditioning monitor: what it reads, and that it leaves the model as it found it."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_FAMILIES, tiny_model

from src import attention
from src.conditioning import ConditioningMonitor, attention_jacobian, jacobian_bound, kappa
from src.conditioning.monitor import normalized_entropy


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_site_reports_every_quantity_it_can_see(family: str, images: torch.Tensor) -> None:
    """Every site reports κ of W_Q, W_K, W_V (equal to κ of its per-head weights computed by an
    SVD), of X, and of P where the module materialises P, with P's entropy in [0, 1]; every
    summary's max is at least its median."""
    model = tiny_model(family)
    out = ConditioningMonitor(model)(images)
    sites = attention.find_sites(model)
    for site in sites:
        for q, w in site.head_weights().items():
            assert out[f"kappa/{q}/{site.name}"] == pytest.approx(kappa(w).median().item(), rel=1e-6)
        assert f"kappa/X/{site.name}" in out
        assert (f"kappa/P/{site.name}" in out) == (site.probs is not None)
        if site.probs is not None:
            assert 0 <= out[f"entropy/P/{site.name}"] <= 1
    assert "kappa/tokens/median" in out
    for key in (k for k in out if k.endswith("/median")):
        assert out[key.replace("/median", "/max")] >= out[key], key
    assert all(isinstance(v, float) and not math.isnan(v) for v in out.values())


def test_values_equal_a_direct_computation(images: torch.Tensor) -> None:
    model = tiny_model("vit")
    out = ConditioningMonitor(model, samples=1)(images)
    site = attention.find_sites(model)[0]
    w_q = (
        site.module.qkv.weight[: site.q.width].T.unflatten(1, (site.num_heads, -1)).transpose(0, 1)
    )  # (H, D, d)
    assert out[f"kappa/W_Q/{site.name}"] == pytest.approx(kappa(w_q).median().item())
    with torch.no_grad():  # X entering block 0's attention, for the first image
        x = model._pos_embed(model.patch_embed(images[:1]))
        x = model.blocks[0].norm1(x)
        q, k, v = site.module.qkv(x).reshape(1, -1, 3, site.num_heads, site.head_dim).permute(2, 0, 3, 1, 4)
        p = torch.softmax(q @ k.mT * site.module.scale, dim=-1)  # (1, H, N, N)
        a = p @ v  # (1, H, N, d)
    assert out[f"kappa/X/{site.name}"] == pytest.approx(kappa(x).item(), rel=1e-4)
    assert out[f"kappa/P/{site.name}"] == pytest.approx(kappa(p).median().item(), rel=1e-3)
    assert out[f"kappa/A/{site.name}"] == pytest.approx(kappa(a).median().item(), rel=1e-3)
    assert out[f"entropy/P/{site.name}"] == pytest.approx(normalized_entropy(p).median().item(), rel=1e-4)
    with torch.no_grad():  # the tokens entering block 0, for both images (ViT: no norm_pre)
        tokens = model._pos_embed(model.patch_embed(images))
    assert out["kappa/tokens/median"] == pytest.approx(kappa(tokens).median().item(), rel=1e-4)


def test_the_model_is_left_as_it_was(images):
    model = attention.apply(tiny_model("vit"), "precond").train()
    hooks = lambda m: sum(len(x._forward_pre_hooks) + len(x._forward_hooks) for x in m.modules())  # noqa: E731
    before, fused = hooks(model), [s.module.fused_attn for s in attention.find_sites(model)]
    torch.manual_seed(0)
    expected = model(images)
    ConditioningMonitor(model)(images)
    assert model.training and hooks(model) == before
    assert [s.module.fused_attn for s in attention.find_sites(model)] == fused
    torch.manual_seed(0)
    torch.testing.assert_close(model(images), expected)


def test_corrections_show_in_the_effective_weights() -> None:
    """P2 Thm 3.5 (svd on every projection: κ(W + C) ≤ 2) and P4's κ = 1 weights, as the
    monitor reads them."""
    spectral = ConditioningMonitor(
        attention.apply(tiny_model("vit"), "spectral", mode="svd", targets="qkv")
    ).weights()
    cond_init = ConditioningMonitor(attention.apply(tiny_model("vit"), "cond_init")).weights()
    assert all(spectral[f"kappa/{w}/max"] <= 2 + 1e-5 for w in ("W_Q", "W_K", "W_V"))
    assert all(cond_init[f"kappa/{w}/max"] == pytest.approx(1, abs=1e-4) for w in ("W_Q", "W_K", "W_V"))


def test_precond_shows_in_the_head_output(images):
    """precond leaves P alone and rescales the rows of A."""
    plain = ConditioningMonitor(tiny_model("vit"))(images)
    conditioned = ConditioningMonitor(attention.apply(tiny_model("vit"), "precond"))(images)
    assert conditioned["kappa/A/median"] != pytest.approx(plain["kappa/A/median"], rel=1e-3)
    first = attention.find_sites(tiny_model("vit"))[0].name  # later blocks see precond's earlier outputs
    assert conditioned[f"kappa/P/{first}"] == pytest.approx(plain[f"kappa/P/{first}"], rel=1e-6)


def test_bound_is_reported_per_token_attention_site(images: torch.Tensor) -> None:
    model = tiny_model("xcit")
    out = ConditioningMonitor(model, bound=True)(images)
    token_sites = [s.name for s in attention.find_sites(model) if s.kind == "token"]
    assert sorted(k for k in out if k.startswith("bound/") and not k.endswith(("median", "max"))) == [
        f"bound/{n}" for n in sorted(token_sites)
    ]


def test_bound_is_b_of_j_and_bounds_the_jacobian(images: torch.Tensor) -> None:
    """The monitor's bound at a ViT's first site is ``B(J)`` (``jacobian_bound``) of each head on
    the first image's tokens, computed here from the model's own modules; and it bounds the
    true κ of each head's Jacobian, built by autograd (P2 Thm 3.4 / P4 Thm 3.1 on a real site)."""
    model = tiny_model("vit")
    out = ConditioningMonitor(model, bound=True)(images)
    site = attention.find_sites(model)[0]
    with torch.no_grad():
        x = model.blocks[0].norm1(model._pos_embed(model.patch_embed(images[:1])))[0].double()  # (N, D)
    heads = [w.detach().double() for w in site.head_weights().values()]  # each (H, D, d)
    scale = site.module.scale
    bounds = torch.stack(
        [jacobian_bound(x, *(w[h] for w in heads), scale=scale) for h in range(site.num_heads)]
    )
    assert out[f"bound/{site.name}"] == pytest.approx(bounds.median().item(), rel=1e-6)
    for h in range(site.num_heads):
        j = attention_jacobian(x, *(w[h] for w in heads), scale=scale)  # (N·d, 3·D·d)
        assert j.shape[0] == torch.linalg.matrix_rank(j)  # full rank, as the theorem assumes
        assert kappa(j) <= bounds[h], h


def test_entropy_is_normalised_by_the_keys_a_row_may_attend_to():
    n = 6
    causal = torch.tril(torch.ones(n, n))
    uniform = causal / causal.sum(-1, keepdim=True)  # row i: uniform over i + 1 keys
    ones = torch.ones(n - 1, dtype=torch.float64)  # row 0, a single key, is left out
    torch.testing.assert_close(normalized_entropy(uniform), ones)
    one_hot = torch.eye(n)[None].expand(2, n, n)  # a saturated softmax: every row one-hot
    torch.testing.assert_close(normalized_entropy(one_hot), torch.zeros(2 * n, dtype=torch.float64))


def test_entropy_of_an_approximate_attention_stays_between_zero_and_one():
    """Nyström's P̃ has negative entries and rows summing to about 1: clipped and renormalised,
    each row's entropy is that of a distribution, in [0, 1]; a softmax's P is unchanged by it."""
    from src.conditioning.monitor import normalized_entropy

    torch.manual_seed(0)
    p = torch.softmax(torch.randn(3, 8, 8), -1)
    approximate = p + 0.05 * torch.randn(3, 8, 8)  # negatives appear, rows drift off 1
    assert (approximate < 0).any()
    h = normalized_entropy(approximate)
    assert ((0 <= h) & (h <= 1)).all()
    exact = -(p.double() * p.double().log()).sum(-1).flatten() / math.log(8)
    torch.testing.assert_close(normalized_entropy(p), exact)
