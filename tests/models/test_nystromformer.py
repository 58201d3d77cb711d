"""Nyström attention: its algebra (exact when every token is a landmark), the pseudo-inverse,
padding, the fused and explicit paths, and what the monitor reads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Attention

from src import attention
from src.models.nystromformer import NystromAttention, iterative_inverse, landmark_kernels


def keep_mask(batch: int, n: int, lengths: list[int]) -> torch.Tensor:
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (B, N)


def test_the_iteration_converges_to_the_inverse():
    torch.manual_seed(0)
    logits = 4 * torch.randn(3, 12, 12) + 6 * torch.eye(12)  # a well-conditioned softmax matrix
    a = torch.softmax(logits.double(), dim=-1)
    torch.testing.assert_close(iterative_inverse(a, iters=20), torch.linalg.inv(a), rtol=1e-8, atol=1e-8)
    error_6 = (iterative_inverse(a, 6) @ a - torch.eye(12)).abs().max()
    error_3 = (iterative_inverse(a, 3) @ a - torch.eye(12)).abs().max()
    assert error_6 < error_3  # each iteration brings it closer


def test_with_every_token_a_landmark_the_product_is_softmax_attention():
    """``m = N``: the landmarks are the queries and keys themselves, so F·A⁻¹·B = softmax(QKᵀ)."""
    torch.manual_seed(1)
    q = 3 * torch.randn(2, 2, 8, 16, dtype=torch.float64)
    k = q + 0.3 * torch.randn_like(q)  # strong diagonal: a well-conditioned attention matrix
    keep = torch.ones(2, 8, dtype=torch.bool)
    f, a, b = landmark_kernels(q, k, keep, num_landmarks=8)
    approx = f @ iterative_inverse(a, 30) @ b
    torch.testing.assert_close(approx, torch.softmax(q @ k.mT, dim=-1), rtol=1e-6, atol=1e-6)


def test_enough_landmarks_is_masked_softmax_attention():
    torch.manual_seed(2)
    nystrom = NystromAttention(16, num_heads=2, num_landmarks=32, conv_kernel=0).eval()
    softmax = Attention(16, num_heads=2, qkv_bias=True).eval()
    softmax.load_state_dict({k: v for k, v in nystrom.state_dict().items() if not k.startswith("conv")})
    x = torch.randn(3, 10, 16)
    keep = keep_mask(3, 10, [10, 6, 1])
    mask = keep[:, None, None, :]
    # Valid positions agree; padded queries differ (Nyström zeroes them) and are never read.
    torch.testing.assert_close(
        nystrom(x, attn_mask=mask)[keep], softmax(x, attn_mask=mask)[keep], rtol=1e-5, atol=1e-5
    )


def test_padded_positions_never_reach_valid_ones():
    torch.manual_seed(3)
    layer = NystromAttention(16, num_heads=2, num_landmarks=4, conv_kernel=5).eval()
    lengths = [20, 13]
    mask = keep_mask(2, 20, lengths)
    x = torch.randn(2, 20, 16)
    noisy = x.clone()
    noisy[1, 13:] = 100 * torch.randn(7, 16)  # change only the padded rows
    out, out_noisy = (layer(t, attn_mask=mask[:, None, None, :]) for t in (x, noisy))
    torch.testing.assert_close(out[1, :13], out_noisy[1, :13], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[0], out_noisy[0])


def test_lengths_that_are_not_a_multiple_of_the_landmarks_are_padded_as_the_reference_would():
    """N = 10 with 4 landmarks: as if the sequence were padded to 12 with masked positions."""
    torch.manual_seed(4)
    layer = NystromAttention(16, num_heads=2, num_landmarks=4, conv_kernel=3).eval()
    x = torch.randn(2, 10, 16)
    short = layer(x, attn_mask=keep_mask(2, 10, [10, 7])[:, None, None, :])
    padded = layer(F.pad(x, (0, 0, 0, 2)), attn_mask=keep_mask(2, 12, [10, 7])[:, None, None, :])
    torch.testing.assert_close(short, padded[:, :10], rtol=1e-5, atol=1e-5)


def test_fused_and_explicit_paths_agree_and_expose_p():
    torch.manual_seed(5)
    layer = NystromAttention(16, num_heads=2, num_landmarks=4, conv_kernel=5).eval()
    x, mask = torch.randn(2, 16, 16), keep_mask(2, 16, [16, 11])[:, None, None, :]
    seen = []
    layer.attn_drop.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    fused = layer(x, attn_mask=mask)
    assert not seen  # the fused path never forms P̃
    site = attention.find_sites(layer)[0]
    with site.explicit():
        explicit = layer(x, attn_mask=mask)
    torch.testing.assert_close(fused, explicit, rtol=1e-4, atol=1e-5)
    (p,) = seen
    assert p.shape == (2, 2, 16, 16)
    assert p[1, :, :, 11:].abs().max() < 1e-6  # padded keys get no weight
    exact = NystromAttention(16, num_heads=2, num_landmarks=4, conv_kernel=5, inverse_iters=40).eval()
    exact.load_state_dict(layer.state_dict())
    seen.clear()
    with attention.find_sites(exact)[0].explicit():
        exact.attn_drop.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
        exact(x, attn_mask=mask)
    torch.testing.assert_close(seen[0].sum(-1), torch.ones(2, 2, 16), rtol=1e-3, atol=1e-3)  # rows sum to 1


def test_the_site_describes_the_module():
    layer = NystromAttention(24, num_heads=3, attn_head_dim=4, num_landmarks=4)
    (site,) = attention.find_sites(layer)
    assert (site.num_heads, site.head_dim, site.dim) == (3, 4, 24)
    assert site.q.linear is layer.qkv and site.out is layer.proj and site.head_output is layer.proj
    assert [p.start for p in site.projections().values()] == [0, 12, 24] and site.probs is layer.attn_drop
