"""cond_tokens: κ(X + C) ≤ 2 with the exact SVD, within 1% of that with the matmul-only form."""

from __future__ import annotations

import pytest
import torch
from conftest import real_looking_tokens, tiny_model

from src import attention
from src.attention.cond_tokens import TokenConditioner, token_correction, vocabulary_map
from src.attention.polar import newton_schulz_scales, polar_factor, top_singular_value
from src.conditioning import ConditioningMonitor, kappa


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    x = real_looking_tokens(8)
    assert x.shape == (8, 197, 192) and kappa(x).min() > 300  # κ about 10³, as P3 reports
    return x


def test_exact_correction_bounds_kappa_by_two(tokens):
    assert kappa(tokens + token_correction(tokens, "svd")).max() <= 2 + 1e-5


def test_polar_correction_is_within_one_percent_of_the_bound(tokens):
    assert kappa(tokens + token_correction(tokens, "polar")).max() <= 2 * 1.01


def with_spectrum(sv: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, U Vᵀ)`` for random singular vectors and singular values ``sv`` (float64)."""
    torch.manual_seed(seed)
    u = torch.linalg.qr(torch.randn(4, 197, len(sv), dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(4, len(sv), len(sv), dtype=torch.float64))[0]
    return u @ torch.diag_embed(sv) @ v.mT, u @ v.mT


def test_polar_factor_converges_for_kappa_up_to_ten_thousand():
    """A token-like spectrum: one dominant direction over a decaying tail, κ = 10⁴."""
    sv = torch.cat([torch.tensor([1.0]), torch.logspace(-1, -4, 191)]).double()
    x, polar = with_spectrum(sv)
    y, sigma = polar_factor(x)
    s = torch.linalg.svdvals(y)
    assert s.min() > 0.995 and s.max() < 1.001
    torch.testing.assert_close(y, polar, atol=5e-3, rtol=0)
    assert sigma.max() <= 1 + 1e-9 and sigma.min() > 0.999  # σ_max = 1, from below


def test_a_flat_topped_spectrum_needs_more_steps():
    """Where ‖XᵀX‖_F^½ exceeds σ_max, Newton–Schulz starts lower: 12 steps fall short, 16 do not."""
    x, _ = with_spectrum(torch.logspace(0, -4, 192).double())
    assert torch.linalg.svdvals(polar_factor(x, steps=12)[0]).min() < 0.99
    assert torch.linalg.svdvals(polar_factor(x, steps=16)[0]).min() > 0.995


def test_power_iteration_underestimates_sigma_max_by_little(tokens):
    exact = torch.linalg.svdvals(tokens)[:, 0]
    estimate = top_singular_value(tokens)
    assert (estimate <= exact * (1 + 1e-5)).all() and (estimate >= 0.995 * exact).all()


@pytest.mark.parametrize("power_iters", [0, 1])
def test_a_poor_sigma_estimate_cannot_flip_a_direction(tokens, power_iters):
    """Y = U f(Σ) Vᵀ with f ≥ 0, so YᵀX = V f(Σ) Σ Vᵀ stays positive semi-definite."""
    y, _ = polar_factor(tokens.double(), power_iters=power_iters)
    yx = y.mT @ tokens.double()
    eig = torch.linalg.eigvalsh((yx + yx.mT) / 2)
    assert eig.min() > -1e-9 * eig.max()


def test_scales_return_to_plain_newton_schulz():
    scales = newton_schulz_scales(14)
    assert min(scales) >= 1 and scales[0] > 1.5 and abs(scales[-1] - 1) < 1e-5


# Swin and DaViT embed tokens through a LayerNorm: at init (unit gain, zero bias) every token
# is centred, X·1 = 0, and κ(X) is infinite. The SVD still lifts that zero singular value;
# Newton–Schulz maps zero to zero, so the polar form is checked where X has full rank.
@pytest.mark.parametrize(
    "family, method",
    [(f, "svd") for f in ("vit", "deit", "swin", "xcit", "davit")]
    + [(f, "polar") for f in ("vit", "deit", "xcit")],
)
def test_the_first_layer_receives_conditioned_tokens(family, method, images):
    before = ConditioningMonitor(tiny_model(family))(images)["kappa/tokens/max"]
    model = attention.apply(tiny_model(family), "cond_tokens", method=method)
    after = ConditioningMonitor(model)(images)["kappa/tokens/max"]
    assert before > 2.5 and after <= 2 * 1.01


@pytest.mark.parametrize("detach", [True, False])
def test_detached_correction_passes_the_gradient_unchanged(tokens, detach):
    x = tokens[:2].clone().requires_grad_()
    upstream = torch.randn_like(x)
    (grad,) = torch.autograd.grad((TokenConditioner("svd", detach, 12, 24)(x) * upstream).sum(), x)
    assert torch.allclose(grad, upstream) == detach


def test_correction_keeps_the_dtype_under_autocast(tokens):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = TokenConditioner("polar", True, 12, 24)(tokens[:2].bfloat16())
    assert out.dtype == torch.bfloat16 and kappa(out.float()).max() < 2.2


class TinyDecoder(torch.nn.Module):
    """A causal decoder with the suite's interface: token embedding, positions, one causal layer."""

    def __init__(self, vocab: int = 40, dim: int = 16, heads: int = 2, length: int = 12):
        super().__init__()
        from timm.layers import Attention

        self.wte, self.wpe = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(length, dim)
        self.attn = Attention(dim, heads)
        self.head = torch.nn.Linear(dim, vocab)

    def token_entry(self):
        return attention.TokenEntry(self.wte, causal=True)

    def forward(self, ids):  # (B, N)
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        return self.head(x + self.attn(x, is_causal=True))  # (B, N, V)


@pytest.mark.parametrize("vocab, dim", [(40, 16), (10, 16)])
def test_causal_entries_condition_the_embedding_table(vocab, dim):
    torch.manual_seed(0)
    model = TinyDecoder(vocab, dim)
    with torch.no_grad():
        model.wte.weight.mul_(torch.logspace(0, -2, dim))  # κ(E) about 100
    table = model.wte.weight.detach().clone()
    attention.apply(model, "cond_tokens")
    ids = torch.arange(vocab)[None]  # every token once
    conditioned = model.wte(ids)[0]  # (V, D): E + C
    torch.testing.assert_close(
        conditioned, table + table @ vocabulary_map(table).float(), rtol=1e-5, atol=1e-6
    )
    assert kappa(table, nonzero_rtol=1e-6) > 10
    assert kappa(conditioned, nonzero_rtol=1e-6) <= 2 + 1e-4


@pytest.mark.parametrize("method", ["svd", "polar"])
def test_causal_conditioning_never_looks_ahead(method):
    torch.manual_seed(0)
    model = attention.apply(TinyDecoder(), "cond_tokens", method=method)
    ids = torch.randint(0, 40, (2, 12))
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 40
    out, out_changed = model(ids), model(changed)
    torch.testing.assert_close(out[:, :7], out_changed[:, :7], rtol=0, atol=0)
    assert not torch.allclose(out[:, 7:], out_changed[:, 7:])


def test_causal_correction_is_a_constant_of_the_step():
    torch.manual_seed(0)
    model = attention.apply(TinyDecoder(), "cond_tokens")
    ids = torch.randint(0, 40, (2, 12))
    upstream = torch.randn(2, 12, 16)
    (model.wte(ids) * upstream).sum().backward()
    expected = torch.zeros_like(model.wte.weight).index_add_(0, ids.reshape(-1), upstream.reshape(-1, 16))
    torch.testing.assert_close(model.wte.weight.grad, expected)


def test_the_monitor_reads_the_conditioned_table_of_a_causal_entry():
    torch.manual_seed(0)
    model = TinyDecoder()
    with torch.no_grad():
        model.wte.weight.mul_(torch.logspace(0, -2, 16))  # κ(E) about 100
    before = ConditioningMonitor(model).weights()["kappa/tokens/table"]
    attention.apply(model, "cond_tokens")
    after = ConditioningMonitor(model)(torch.randint(0, 40, (2, 12)))
    assert before == pytest.approx(kappa(model.wte.weight).item(), rel=1e-6) and before > 10
    assert after["kappa/tokens/table"] <= 2 + 1e-6 and "kappa/tokens/entry" not in after
