"""The GPT decoder: causal under every variant, equal to an explicit reference computation,
GPT-2's initialisation and sizes."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import compose
from hydra.utils import instantiate

from src import attention
from src.models.gpt import GPT

VOCAB, LENGTH = 50, 12


def tiny_gpt(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(VOCAB, LENGTH, **{"dim": 32, "depth": 2, "num_heads": 4, **kw})


def reference_logits(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    """GPT-2's forward written out from the weights: explicit LayerNorm, masked softmax, GELU-tanh."""
    p = dict(model.named_parameters())

    def layer_norm(x, name):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * p[f"{name}.weight"] + p[f"{name}.bias"]

    def linear(x, name):
        return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    n, dim = ids.shape[1], model.wte.weight.shape[1]
    x = p["wte.weight"][ids] + p["wpe.weight"][:n]  # (B, N, D)
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    for i, block in enumerate(model.blocks):
        heads, d = block.attn.num_heads, dim // block.attn.num_heads
        q, k, v = linear(layer_norm(x, f"blocks.{i}.ln_1"), f"blocks.{i}.attn.qkv").split(dim, -1)
        q, k, v = (t.unflatten(-1, (heads, d)).transpose(1, 2) for t in (q, k, v))  # (B, H, N, d)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(future, float("-inf"))
        a = torch.softmax(scores, -1) @ v  # (B, H, N, d)
        x = x + linear(a.transpose(1, 2).flatten(2), f"blocks.{i}.attn.proj")
        h = linear(layer_norm(x, f"blocks.{i}.ln_2"), f"blocks.{i}.mlp.fc1")
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
        x = x + linear(h, f"blocks.{i}.mlp.fc2")
    return layer_norm(x, "ln_f") @ p["wte.weight"].T  # tied output layer


def explicit_attention(model: torch.nn.Module):
    """Every attention module on its non-fused path (the one the conditioning monitor runs)."""
    stack = contextlib.ExitStack()
    for site in attention.find_sites(model):
        stack.enter_context(site.explicit())
    return stack


@pytest.mark.parametrize("fused", [True, False])
def test_standard_logits_equal_an_explicit_reference(fused):
    model = attention.apply(tiny_gpt(), "standard").eval()
    with torch.no_grad():  # give biases and norms non-trivial values
        for name, value in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name or name.startswith("ln_f"):
                value.normal_(0.5 if name.endswith("weight") else 0.0, 0.1)
    ids = torch.randint(0, VOCAB, (3, LENGTH))
    with torch.no_grad():
        if fused:
            out = model(ids)
        else:
            with explicit_attention(model):
                out = model(ids)
        expected = reference_logits(model, ids)
    assert out.shape == (3, LENGTH, VOCAB)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", list(attention.VARIANTS))
def test_changing_a_later_token_never_changes_earlier_logits(variant):
    model = attention.apply(tiny_gpt(), variant).eval()
    ids = torch.randint(0, VOCAB, (2, LENGTH))
    t = 5
    changed = ids.clone()
    changed[:, t + 1] = (changed[:, t + 1] + 1) % VOCAB
    with torch.no_grad():
        for explicit in (False, True):
            with explicit_attention(model) if explicit else contextlib.nullcontext():
                out, out_changed = model(ids), model(changed)
            torch.testing.assert_close(out[:, : t + 1], out_changed[:, : t + 1], rtol=0, atol=1e-6)
            assert (out[:, t + 1 :] - out_changed[:, t + 1 :]).abs().max() > 1e-4


def test_gpt2_initialisation_scales_the_residual_projections():
    depth = 8
    model = tiny_gpt(dim=64, depth=depth, num_heads=4)
    assert model.lm_head.weight is model.wte.weight
    residual = torch.cat(
        [torch.cat([b.attn.proj.weight.flatten(), b.mlp.fc2.weight.flatten()]) for b in model.blocks]
    )
    others = torch.cat(
        [torch.cat([b.attn.qkv.weight.flatten(), b.mlp.fc1.weight.flatten()]) for b in model.blocks]
    )
    assert residual.std().item() == pytest.approx(0.02 / math.sqrt(2 * depth), rel=0.03)
    assert others.std().item() == pytest.approx(0.02, rel=0.03)
    assert all(b.attn.qkv.bias.abs().max() == 0 for b in model.blocks)


def test_padding_the_vocabulary_changes_nothing_but_the_table():
    plain, padded = tiny_gpt(), tiny_gpt(vocab_multiple=64)
    assert padded.wte.weight.shape[0] == 64
    padded.load_state_dict(
        {
            k: (torch.cat([v, padded.wte.weight[VOCAB:]]) if k in ("wte.weight", "lm_head.weight") else v)
            for k, v in plain.state_dict().items()
        }
    )
    ids = torch.randint(0, VOCAB, (2, LENGTH))
    with torch.no_grad():
        torch.testing.assert_close(padded(ids), plain(ids))


@pytest.mark.parametrize(
    "backbone, total, non_embedding",
    [("gpt2_small", 124_439_808, None), ("gpt2_medium", 354_823_168, None), ("gpt_472m", None, 472)],
)
def test_backbone_sizes(backbone, total, non_embedding):
    """GPT-2's published sizes (124,439,808 and 354,823,168 parameters with its 50,257 tokens
    and 1,024 positions); P4's 472M as non-embedding parameters."""
    cfg = compose(["task=lm_tinystories", f"backbone={backbone}", "task.seq_len=1024"], Path("unused"))
    with torch.device("meta"):
        model = instantiate(cfg.backbone.model, vocab_size=50257, vocab_multiple=1)
    if total is not None:
        assert model.num_params(embeddings=True) == total
    if non_embedding is not None:
        assert round(model.num_params() / 1e6) == non_embedding


def test_cross_entropy_of_an_untrained_model_is_near_log_vocab():
    """GPT-2's small init makes the first logits nearly flat: loss ≈ log V."""
    model = tiny_gpt().eval()
    ids = torch.randint(0, VOCAB, (4, LENGTH + 1))
    with torch.no_grad():
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    assert abs(loss.item() - math.log(VOCAB)) < 0.05
