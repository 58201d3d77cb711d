"""spectral: κ(W + C) ≤ 2 for the exact correction, computed by Newton–Schulz (the default) or an
eigendecomposition (the same matrix below κ = 10⁴); W + λI as a fixed buffer for the cheap one."""

from __future__ import annotations

import pytest
import torch
from conftest import compose, tiny_model
from torch.nn.utils import parametrize

from src import attention
from src.attention import spectral
from src.attention.spectral import AddFixedCorrection, AddSpectralShift, spectral_shift
from src.conditioning import ConditioningMonitor, kappa


def random_weights(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(16, 64, 192) * 0.02  # 16 heads' W_hᵀ, (d, D)


def trained_looking_weights(seed: int) -> torch.Tensor:
    """Low rank plus noise: a few strong directions, as trained projections have."""
    torch.manual_seed(seed)
    low = torch.randn(16, 64, 4) @ torch.randn(16, 4, 192)
    return low + 1e-3 * torch.randn(16, 64, 192)


@pytest.mark.parametrize("weights", [random_weights, trained_looking_weights])
def test_exact_correction_bounds_kappa_by_two(weights):
    w = weights(0)
    assert kappa(w).min() > 2.5  # the correction has work to do
    assert kappa(w + spectral_shift(w)).max() <= 2 + 1e-6


@pytest.mark.parametrize("family", ["vit", "swin", "xcit", "davit", "eva", "eva_fused", "beit"])
def test_svd_mode_bounds_every_effective_head_weight(family):
    monitor = ConditioningMonitor(attention.apply(tiny_model(family), "spectral", mode="svd", targets="qkv"))
    weights = monitor.weights()
    assert all(weights[f"kappa/{w}/max"] <= 2 + 1e-5 for w in ("W_Q", "W_K", "W_V"))
    assert ConditioningMonitor(tiny_model(family)).weights()["kappa/W_Q/max"] > 2


@pytest.mark.parametrize("targets", ["q", "k", "v", "qk", "qv", "kv", "qkv"])
def test_targets_name_the_blocks_that_receive_the_correction(targets):
    """On a fused qkv weight (3D×D), the default ``q`` is lam·I_{3D×D}: ones in the Q block only."""
    model = attention.apply(tiny_model("vit"), "spectral", lam=10, targets=targets)
    qkv = model.blocks[0].attn.qkv
    dim = qkv.in_features
    correction = qkv.parametrizations.weight[0].correction  # (3D, D)
    for i, block in enumerate("qkv"):
        expected = 10 * torch.eye(dim) if block in targets else torch.zeros(dim, dim)
        torch.testing.assert_close(correction[i * dim : (i + 1) * dim], expected, rtol=0, atol=0)
    if targets == "q":
        torch.testing.assert_close(correction, 10 * torch.eye(3 * dim, dim), rtol=0, atol=0)


def test_identity_mode_adds_lam_identity_to_each_block_with_no_new_parameter():
    original = tiny_model("vit")
    raw = original.blocks[0].attn.qkv.weight.detach().clone()  # (3D, D)
    n_params = sum(p.numel() for p in original.parameters())
    model = attention.apply(original, "spectral", lam=10, targets="qkv")
    qkv = model.blocks[0].attn.qkv
    dim = qkv.in_features
    torch.testing.assert_close(qkv.weight, raw + 10 * torch.eye(dim).repeat(3, 1))
    assert sum(p.numel() for p in model.parameters()) == n_params
    buffer = qkv.parametrizations.weight[0].correction
    assert not buffer.requires_grad and all(buffer is not p for p in model.parameters())
    assert not any(k.endswith("correction") for k in model.state_dict())  # rebuilt from lam, not saved


def test_the_buffer_is_not_trained(images):
    model = attention.apply(tiny_model("vit"), "spectral", lam=10)
    qkv = model.blocks[0].attn.qkv
    buffer_before = qkv.parametrizations.weight[0].correction.clone()
    weight_before = qkv.parametrizations.weight.original.detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(images).square().mean().backward()
    optimizer.step()
    torch.testing.assert_close(qkv.parametrizations.weight[0].correction, buffer_before, rtol=0, atol=0)
    assert not torch.equal(qkv.parametrizations.weight.original, weight_before)


def test_identity_mode_on_separate_projections_uses_a_rectangular_identity():
    model = attention.apply(tiny_model("xcit"), "spectral", lam=3, targets="qkv")  # class attention: q, k, v
    site = [s for s in attention.find_sites(model) if s.name.startswith("cls_attn")][0]
    for proj in site.projections().values():
        correction = proj.linear.parametrizations.weight[0].correction
        torch.testing.assert_close(correction, 3 * torch.eye(*correction.shape))


@pytest.mark.parametrize("detach", [True, False])
def test_detached_svd_correction_has_the_gradient_of_a_constant_one(images, detach):
    model = attention.apply(tiny_model("vit"), "spectral", mode="svd", detach=detach)
    constant = tiny_model("vit")  # the same weights, with each correction frozen as a buffer
    for site, twin in zip(attention.find_sites(model), attention.find_sites(constant), strict=True):
        frozen = (site.q.linear.weight - site.q.linear.parametrizations.weight.original).detach()
        parametrize.register_parametrization(twin.q.linear, "weight", AddFixedCorrection(frozen))
    torch.testing.assert_close(model(images), constant(images))

    originals = lambda m: [s.q.linear.parametrizations.weight.original for s in attention.find_sites(m)]  # noqa: E731
    grads = torch.autograd.grad(model(images).square().sum(), originals(model))
    grads_constant = torch.autograd.grad(constant(images).square().sum(), originals(constant))
    same = all(torch.allclose(g, h, atol=1e-6, rtol=1e-4) for g, h in zip(grads, grads_constant, strict=True))
    assert same == detach


def test_large_lam_on_query_and_key_saturates_the_softmax_and_the_default_does_not(images):
    """The warning of docs/methods.md#readings-of-spectral, measured: lam = 10 on Q and K
    collapses attention entropy; on Q alone (the default reading) the logits grow by about lam,
    not lam², and the softmax stays open."""
    entropy = {}
    for lam, targets in ((0.5, "qkv"), (10.0, "qkv"), (10.0, "q")):
        model = attention.apply(tiny_model("vit"), "spectral", lam=lam, targets=targets)
        entropy[lam, targets] = ConditioningMonitor(model)(images)["entropy/P/median"]
    baseline = ConditioningMonitor(tiny_model("vit"))(images)["entropy/P/median"]
    assert baseline > 0.9 and entropy[10.0, "qkv"] < 0.2 < entropy[0.5, "qkv"]
    assert entropy[10.0, "q"] > 0.5


def heads_with_spectrum(sv: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """16 heads' ``(d, D) = (64, 192)`` blocks with singular values ``sv`` (64) and random vectors."""
    torch.manual_seed(seed)
    u = torch.linalg.qr(torch.randn(16, 64, 64, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(16, 192, 64, dtype=torch.float64))[0]
    return (u * sv) @ v.mT


@pytest.mark.parametrize("kappa_w, tolerance", [(4.0, 1e-6), (100.0, 1e-5), (5e3, 1e-4)])
def test_newton_schulz_is_the_exact_correction_below_kappa_ten_thousand(kappa_w, tolerance):
    """The default method (fp32) and the float64 eigendecomposition give the same W + C, to fp32's
    rounding along the weakest direction (about 10⁻⁸ κ(W) in relative Frobenius norm: measured
    7·10⁻⁷, 1·10⁻⁶ and 2.5·10⁻⁵ here, 6·10⁻⁷ on the digits reading's trained heads, κ ≤ 21), for heads
    up to κ = 10⁴, and κ(W + C) ≤ 2 (to that rounding)."""
    w = heads_with_spectrum(torch.logspace(0, -torch.log10(torch.tensor(kappa_w)).item(), 64).double())
    exact = w + spectral_shift(w, method="eigh")
    default = w + spectral_shift(w.float(), method="newton_schulz").double()
    assert ((default - exact).norm(dim=(-2, -1)) / exact.norm(dim=(-2, -1))).max() <= tolerance
    assert kappa(default).max() <= 2 + 1e-4


def test_above_kappa_ten_thousand_newton_schulz_lifts_less():
    """A head with κ = 10⁵: its weakest directions are below Newton–Schulz's floor (10⁻⁴ σ_max), so
    they get less than σ_max: κ(W + C) above 2, where the eigendecomposition keeps 2."""
    w = heads_with_spectrum(torch.logspace(0, -5, 64).double())
    assert kappa(w + spectral_shift(w, method="eigh")).max() <= 2 + 1e-9
    assert kappa(w + spectral_shift(w.float(), method="newton_schulz").double()).max() > 2.05


def test_a_fused_weights_blocks_are_corrected_in_one_call(monkeypatch):
    """q, k and v of a fused ``qkv`` weight (3 blocks of 4 heads) go through one batched call,
    with each block's own correction."""
    torch.manual_seed(0)
    weight = torch.randn(3 * 64, 64) * 0.05  # (3D, D), heads of 16
    blocks = [(0, 4, 16), (64, 4, 16), (128, 4, 16)]
    calls = []
    original = spectral.spectral_shift
    monkeypatch.setattr(spectral, "spectral_shift", lambda w, *a: calls.append(w.shape) or original(w, *a))
    fused = AddSpectralShift(blocks, detach=True)(weight)
    assert calls == [torch.Size([12, 16, 64])]
    for start, heads, d in blocks:
        block = weight[start : start + heads * d].unflatten(0, (heads, d))
        expected = block + original(block, True, "newton_schulz")
        torch.testing.assert_close(
            fused[start : start + heads * d], expected.flatten(0, 1), rtol=1e-6, atol=1e-7
        )


def test_the_svd_reading_keeps_its_identity_and_computes_by_newton_schulz(tmp_path):
    """``spectral_svd`` names no method: its config (and its records' identity) are what they were
    (``method`` null, out of the identity), and null builds the default, Newton–Schulz."""
    attn = compose(["experiment=readings/digits", "reading=spectral_svd"], tmp_path).attn
    assert attn.method is None and (attn.mode, attn.targets) == ("svd", "qkv")
    default = attention.apply(tiny_model("vit"), "spectral", mode="svd", method=None)
    assert default.blocks[0].attn.qkv.parametrizations.weight[0].method == "newton_schulz"
    model = attention.apply(tiny_model("vit"), "spectral", mode="svd", method="eigh")
    assert model.blocks[0].attn.qkv.parametrizations.weight[0].method == "eigh"
