"""The sandbox models: P5's computation, the RMSNorm Jacobian, and the attention variants on both."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import compose

from src import attention
from src.conditioning import ConditioningMonitor
from src.engine.experiment import check_compatible
from src.errors import ConfigError
from src.models.sandbox import ClusteringHead, MultiHeadSandbox, RMSNorm, rmsnorm_jacobian_max


def tokens(batch: int = 16, p: int = 2, seq_len: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, p, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def p5_forward(m: ClusteringHead, x: torch.Tensor) -> torch.Tensor:
    """P5's ``Model.forward`` (facebookresearch/pal, softmax_model.py), written out from its weights."""

    def rms_norm(t):
        return t / (t.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5)

    dim = m.token_emb.weight.shape[1]
    out = rms_norm(m.token_emb.weight[x] + m.pos_emb)  # (B, L, D)
    attn = F.softmax(m.attn.query.weight @ out.transpose(-1, -2) / math.sqrt(dim), dim=-1)  # (B, 1, L)
    h = (attn @ (out @ m.attn.value.weight.T)).squeeze(1)  # (B, D)
    h = h + m.mlp.fc2(F.gelu(m.mlp.fc1(rms_norm(h))))
    return h @ m.token_emb.weight.T


@pytest.mark.parametrize("fused", [True, False])
def test_the_reference_model_computes_p5s_forward(fused):
    torch.manual_seed(0)
    model = ClusteringHead(vocab_size=2, seq_len=12)
    model.attn.fused_attn = fused
    x = tokens()
    torch.testing.assert_close(model(x), p5_forward(model, x), rtol=1e-5, atol=1e-6)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {
        "token_emb.weight",
        "pos_emb",
        "attn.query.weight",
        "attn.value.weight",
        "mlp.fc1.weight",
        "mlp.fc1.bias",
        "mlp.fc2.weight",
        "mlp.fc2.bias",
    }


@pytest.mark.parametrize("dim", [2, 5])
def test_rmsnorm_jacobian_top_eigenvalue_is_one_over_rms_plus_eps(dim):
    torch.manual_seed(dim)
    rows = torch.cat(
        [torch.randn(6, dim, dtype=torch.float64), 1e-4 * torch.randn(2, dim, dtype=torch.float64)]
    )
    norm = RMSNorm(dim, eps=1e-5)
    for row in rows:
        jac = torch.autograd.functional.jacobian(norm, row)  # (D, D), symmetric
        top = torch.linalg.eigvalsh(jac).max()
        torch.testing.assert_close(norm.jacobian_max(row), top, rtol=1e-9, atol=0.0)
    assert rmsnorm_jacobian_max(rows[-1:]).item() > 1e3  # near the origin the slope explodes


def test_the_trace_reads_out_what_the_model_outputs():
    for model, x in (
        (ClusteringHead(2, 12), tokens()),
        (MultiHeadSandbox(2, 12), tokens()),
        (MultiHeadSandbox(3, 12, dim=4, depth=2), tokens(p=3)),
    ):
        trace = model.trace(x)
        torch.testing.assert_close(trace.clouds["output"] @ trace.readout.T, model(x), rtol=1e-5, atol=1e-6)
        for attn in trace.attention.values():  # (B, H, N): distributions over the positions
            torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:2]))


def test_precond_makes_the_pooled_head_output_unit_norm_and_cond_tokens_bounds_kappa():
    torch.manual_seed(0)
    x = tokens()
    plain = ClusteringHead(2, 12)
    conditioned = attention.apply(ClusteringHead(2, 12), "precond")
    conditioned.load_state_dict(plain.state_dict(), strict=False)
    pooled = conditioned.trace(x).clouds["attention output"]
    torch.testing.assert_close(pooled.norm(dim=-1), torch.ones(len(x)), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain.trace(x).clouds["attention output"].norm(dim=-1), torch.ones(len(x)))

    model = attention.apply(ClusteringHead(2, 12), "cond_tokens")
    before = ConditioningMonitor(ClusteringHead(2, 12), samples=16)(x)["kappa/tokens/max"]
    after = ConditioningMonitor(model, samples=16)(x)
    assert after["kappa/tokens/max"] <= 2 + 1e-6 < before
    assert after["kappa/W_K/max"] == pytest.approx(1.0)  # the keys are the normed tokens: W_K = I


@pytest.mark.parametrize("variant", list(attention.VARIANTS))
def test_every_variant_applies_to_the_multihead_sandbox(variant):
    torch.manual_seed(0)
    x = tokens()
    reference = MultiHeadSandbox(2, 12)
    model = MultiHeadSandbox(2, 12)
    model.load_state_dict(reference.state_dict())
    attention.apply(model, variant)
    out = model(x)
    assert out.shape == (16, 2) and torch.isfinite(out).all()
    if variant == "standard":
        torch.testing.assert_close(out, reference(x))
    diagnostics = ConditioningMonitor(model)(x)
    assert all(math.isfinite(v) or v == math.inf for v in diagnostics.values())
    assert {"kappa/W_Q/median", "kappa/X/median", "entropy/P/median"} <= set(diagnostics)


def test_the_reference_backbone_refuses_variants_without_a_trained_w_q_and_names_the_alternative(tmp_path):
    for variant in ("spectral", "cond_init", "mimetic"):
        with pytest.raises(ConfigError, match="backbone=sandbox_multihead takes every variant"):
            check_compatible(compose(["task=modadd", f"attn={variant}"], tmp_path))
        check_compatible(compose(["task=modadd", "backbone=sandbox_multihead", f"attn={variant}"], tmp_path))
    for variant in ("standard", "precond", "cond_tokens"):
        check_compatible(compose(["task=modadd", f"attn={variant}"], tmp_path))
    with pytest.raises(ConfigError, match="incompatible"):
        check_compatible(compose(["task=modadd", "backbone=vit_digits"], Path(tmp_path)))


def test_heads_must_divide_the_width():
    with pytest.raises(ConfigError, match="not a multiple of num_heads"):
        MultiHeadSandbox(2, 12, dim=3, num_heads=2)


def test_without_its_residual_the_query_token_is_attentions_output_and_the_others_are_timms():
    """``query_residual=False``: the sequence tokens leave the block as in timm's ``Block`` (same
    weights), the query token as ``a + MLP(norm(a))`` with ``a`` its attention output, P5's pooling."""
    torch.manual_seed(0)
    plain = MultiHeadSandbox(vocab_size=2, seq_len=12, num_heads=1)
    pooled = MultiHeadSandbox(vocab_size=2, seq_len=12, num_heads=1, query_residual=False)
    pooled.load_state_dict(plain.state_dict())
    x = torch.randint(0, 2, (16, 12))
    tokens = plain._tokens(x)  # (B, 1 + L, D)
    block = pooled.blocks[0]
    ours, timms = block(tokens), plain.blocks[0](tokens)
    torch.testing.assert_close(ours[:, 1:], timms[:, 1:])
    a = block.attn(block.norm1(tokens))[:, 0]  # (B, D)
    torch.testing.assert_close(ours[:, 0], a + block.mlp(block.norm2(a)))
    assert not torch.allclose(ours[:, 0], timms[:, 0])
    torch.testing.assert_close(pooled(x), pooled.readout(ours[:, 0]))


@pytest.mark.parametrize("fused", [True, False], ids=["sdpa", "explicit"])
def test_a_query_out_of_the_keys_gets_no_attention_and_reads_the_tokens_as_without_it(fused):
    """``query_in_keys=False``: no token attends to the query token (its probability 0 in the
    trace), and the query token's attention output equals timm's attention over the L tokens
    alone with the query prepended only as a reader (computed by hand from the same weights)."""
    torch.manual_seed(0)
    model = MultiHeadSandbox(vocab_size=2, seq_len=12, num_heads=2, query_in_keys=False)
    attn = model.blocks[0].attn
    attn.fused_attn = fused
    x = torch.randint(0, 2, (8, 12))
    probs = model.trace(x).attention["block0"]  # (B, H, 1 + L)
    assert torch.all(probs[:, :, 0] == 0) and torch.allclose(probs.sum(-1), torch.ones(8, 2))
    normed = model.blocks[0].norm1(model._tokens(x))  # (B, 1 + L, D)
    q, k, v = attn.qkv(normed).reshape(8, 13, 3, 2, 1).permute(2, 0, 3, 1, 4)  # (B, H, 1 + L, 1) each
    weights = (q[:, :, :1] @ k[:, :, 1:].transpose(-2, -1) * attn.scale).softmax(-1)  # (B, H, 1, L)
    by_hand = attn.proj((weights @ v[:, :, 1:]).transpose(1, 2).reshape(8, 2))  # (B, D)
    torch.testing.assert_close(attn(normed, attn_mask=model._key_mask(normed))[:, 0], by_hand)
    keyed = MultiHeadSandbox(vocab_size=2, seq_len=12, num_heads=2)
    keyed.load_state_dict(model.state_dict())
    assert not torch.allclose(keyed(x), model(x))  # the mask changes the model


def test_cond_tokens_still_reaches_the_blocks_without_the_query_residual():
    """The hook on the first block's input is a hook on the module: the subclass keeps it."""
    torch.manual_seed(0)
    model = MultiHeadSandbox(vocab_size=2, seq_len=12, query_residual=False)
    x = torch.randint(0, 2, (16, 12))
    before = model(x)
    attention.apply(model, "cond_tokens")
    assert not torch.allclose(model(x), before)


@pytest.mark.parametrize("cls", [ClusteringHead, MultiHeadSandbox])
def test_the_init_scale_scales_the_same_draws_and_so_only_the_readouts_logits(cls):
    """init_scale c: the embeddings are c times P5's draws (the same draws). On the reference model
    the first RMSNorm removes the common scale, so at initialization its logits are c times those
    at scale 1 (exactly with eps = 0; P5's eps sits outside the square root and breaks it by about
    1e-3); the multi-head sandbox's residual stream keeps the scale against its updates, so there
    the logits change otherwise."""
    x = torch.randint(0, 2, (64, 12), generator=torch.Generator().manual_seed(0))
    models = []
    for scale in (1.0, 0.1):
        torch.manual_seed(0)
        models.append(cls(vocab_size=2, seq_len=12, num_embeddings=3, eps=0.0, init_scale=scale).eval())
    one, small = models
    torch.testing.assert_close(small.token_emb.weight, 0.1 * one.token_emb.weight)
    torch.testing.assert_close(small.pos_emb, 0.1 * one.pos_emb)
    with torch.no_grad():
        close = torch.allclose(small(x), 0.1 * one(x), atol=1e-6, rtol=1e-5)
    assert close == (cls is ClusteringHead)
    with pytest.raises(ConfigError, match="init_scale"):
        cls(vocab_size=2, seq_len=12, init_scale=0.0)
