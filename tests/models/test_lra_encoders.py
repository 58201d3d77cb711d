"""The LRA encoders: padding in attention, pooling and cond_tokens; the retrieval head; every
attention variant on both encoders; the conditioning monitor."""

from __future__ import annotations

import copy

import pytest
import torch

from src import attention
from src.conditioning import ConditioningMonitor
from src.models.lra import LRAClassifier

ENCODERS = {
    "softmax": dict(attention="softmax"),
    "nystrom": dict(attention="nystrom", num_landmarks=4, conv_kernel=5),
}


def model(kind: str, seed: int = 0, **kwargs) -> LRAClassifier:
    torch.manual_seed(seed)
    return LRAClassifier(
        vocab_size=20,
        num_classes=3,
        max_positions=24,
        dim=16,
        num_heads=2,
        mlp_dim=32,
        **{**ENCODERS[kind], **kwargs},
    ).eval()


def batch(lengths: list[int], width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 20, (len(lengths), width), generator=g)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return tokens * mask, mask


@pytest.mark.parametrize("variant", ["standard", "cond_tokens"])
def test_softmax_logits_ignore_the_amount_and_content_of_padding(variant):
    """Masked keys, zeroed padded tokens and masked_mean pooling: a sequence's logits are the
    same padded to 12 or to 24, whatever the padded positions hold (cond_tokens included)."""
    net = attention.apply(model("softmax"), variant)
    tokens, mask = batch([12, 7, 1], 12)
    wide_tokens = torch.cat([tokens, torch.randint(1, 20, (3, 12))], dim=1)  # padding that holds junk ids
    wide_mask = torch.cat([mask, torch.zeros(3, 12, dtype=torch.bool)], dim=1)
    wide_tokens[1, 7:12] = 5
    torch.testing.assert_close(net(tokens, mask), net(wide_tokens, wide_mask), rtol=1e-5, atol=1e-5)


def test_cond_tokens_corrects_the_valid_tokens_as_if_alone():
    """The correction that enters the first block equals, on the valid rows, the one computed
    from the valid tokens alone."""
    net = attention.apply(model("softmax"), "cond_tokens")
    entry = net.token_entry()
    seen = []
    entry.module.register_forward_pre_hook(lambda m, a: seen.append(a[0]))  # after the variant's hook
    tokens, mask = batch([9, 24], 24)
    net(tokens, mask)
    corrected = seen[0][0]  # (24, D), sample with 9 tokens
    x = (net.token_embed(tokens[0]) + net.pos_embed[:24])[:9]
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    torch.testing.assert_close(corrected[:9], x + s[0] * u @ vh, rtol=1e-4, atol=1e-5)
    assert torch.linalg.cond(corrected[:9]) <= 2 + 1e-3  # κ(X + C) ≤ 2 on the valid tokens


def test_mean_pooling_is_the_reference_codes():
    net = model("softmax", pool="mean")
    tokens, mask = batch([5, 8], 8)
    features = {}
    net.head.register_forward_pre_hook(lambda m, a: features.setdefault("pooled", a[0]))
    net(tokens, mask)
    x = net.embed_drop(net.token_embed(tokens) + net.pos_embed[:8]) * mask[..., None]
    for block in net.blocks:
        x = block(x, mask)
    reference = (net.norm(x) * mask[..., None]).mean(1)  # LN(x)·mask averaged over all positions
    torch.testing.assert_close(features["pooled"], reference)


def test_cls_pooling_reads_a_prepended_token():
    net = model("softmax", pool="cls")
    tokens, mask = batch([5, 8], 8)
    assert net.pos_embed.shape[0] == 25 and net(tokens, mask).shape == (2, 3)
    with torch.no_grad():
        net.cls_token.fill_(1.0)
    assert not torch.allclose(net(tokens, mask), model("softmax", pool="cls")(tokens, mask))


@pytest.mark.parametrize("kind", ENCODERS)
def test_the_retrieval_head_classifies_u_v_their_product_and_difference(kind):
    net = model(kind, dual=True)
    a, mask_a = batch([10, 4], 16, seed=1)
    b, mask_b = batch([16, 9], 16, seed=2)
    u, v = net.encode(a, mask_a), net.encode(b, mask_b)
    torch.testing.assert_close(net(a, mask_a, b, mask_b), net.head(torch.cat([u, v, u * v, u - v], -1)))
    assert net.head[0].in_features == 4 * 16
    with pytest.raises(ValueError, match="tokens2"):
        net(a, mask_a)


FORMS = {"spectral": {"lam": 1.0}}


@pytest.mark.parametrize("variant", list(attention.VARIANTS))
@pytest.mark.parametrize("kind", ENCODERS)
def test_every_variant_applies_trains_and_is_read_by_the_monitor(kind, variant):
    untouched = model(kind, dual=True).train()
    net = attention.apply(copy.deepcopy(untouched), variant, **FORMS.get(variant, {})).train()
    a, mask_a = batch([16, 11, 5], 16, seed=3)
    b, mask_b = batch([13, 16, 2], 16, seed=4)
    torch.manual_seed(0)
    out = net(a, mask_a, b, mask_b)
    torch.manual_seed(0)
    reference = untouched(a, mask_a, b, mask_b)
    assert out.shape == (3, 3) and torch.isfinite(out).all()
    assert torch.allclose(out, reference) == (variant == "standard")
    out.square().mean().backward()
    sites = attention.find_sites(net)
    assert [s.name for s in sites] == ["blocks.0.attn", "blocks.1.attn"]
    for site in sites:
        for proj in site.projections().values():
            grad = (
                proj.linear.parametrizations.weight.original if variant == "spectral" else proj.linear.weight
            ).grad
            assert grad is not None and grad[proj.rows].abs().sum() > 0 and torch.isfinite(grad).all()
    stats = ConditioningMonitor(net)(a, mask_a, b, mask_b)
    assert {
        "kappa/W_Q/median",
        "kappa/X/median",
        "kappa/P/median",
        "kappa/A/median",
        "kappa/tokens/median",
    } <= set(stats)
    assert all(v == v for v in stats.values())  # no NaN
