"""precond: unit-norm head-output rows before the projection, and the detached gradient."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import logits, tiny_model

from src import attention


def head_outputs(model, images):
    """``{site name: (…, H, d)}``: what each site's ``head_output`` receives, split by head: the
    output projection, or the scale norm before it (EVA-02's ``scale_attn_inner``)."""
    seen, handles = {}, []

    def keep(site, args):
        seen.setdefault(site.name, args[0].unflatten(-1, (site.num_heads, -1)))

    for site in attention.find_sites(model):
        handles.append(site.head_output.register_forward_pre_hook(lambda m, a, s=site: keep(s, a)))
    model(images)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("family", ["vit", "swin", "xcit", "davit", "eva", "eva_fused", "beit"])
def test_every_head_output_row_has_unit_norm_before_projection(family, images):
    # Rows have norm ‖A_i‖/(‖A_i‖ + eps); at init ‖A_i‖ is 1e-3 to 1e-1, so take eps out of the way.
    model = attention.apply(tiny_model(family), "precond", eps=1e-10)
    outputs = head_outputs(model, images)
    assert len(outputs) == len(attention.find_sites(model))
    for name, heads in outputs.items():
        assert (heads.norm(dim=-1) - 1).abs().max() < 1e-5, name
    untouched = head_outputs(tiny_model(family), images)
    assert not all(torch.allclose(h.norm(dim=-1), torch.ones(1), atol=1e-2) for h in untouched.values())


def reference_block_output(attn, x, constant_c=None, eps=1e-6):
    """timm Attention by hand: softmax(q kᵀ/√d) v, rows scaled by C = 1/(‖A_i‖ + eps), then proj.

    ``constant_c`` (…, H, N, 1) replaces C by a hand-built constant diagonal.
    """
    b, n, dim = x.shape
    q, k, v = attn.qkv(x).reshape(b, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)  # (B, H, N, d) each
    p = torch.softmax(q @ k.transpose(-1, -2) * attn.scale, dim=-1)  # (B, H, N, N)
    a = p @ v  # (B, H, N, d)
    c = 1 / (a.norm(dim=-1, keepdim=True) + eps) if constant_c is None else constant_c
    return attn.proj((c * a).transpose(1, 2).reshape(b, n, dim)), c


def test_matches_a_hand_written_preconditioned_head():
    torch.manual_seed(0)
    model = attention.apply(tiny_model("vit"), "precond")
    attn, x = model.blocks[0].attn, torch.randn(2, 17, 48)
    expected, _ = reference_block_output(attn, x)
    torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("detach", [True, False])
def test_detached_gradient_is_that_of_a_constant_diagonal(detach):
    torch.manual_seed(0)
    model = attention.apply(tiny_model("vit"), "precond", detach=detach)
    attn, x = model.blocks[0].attn, torch.randn(2, 17, 48)
    weight = attn.qkv.weight

    grad_variant = torch.autograd.grad(attn(x).square().sum(), weight)[0]
    _, c = reference_block_output(attn, x)
    out_constant, _ = reference_block_output(attn, x, constant_c=c.detach())
    grad_constant = torch.autograd.grad(out_constant.square().sum(), weight)[0]
    same = torch.allclose(grad_variant, grad_constant, atol=1e-5, rtol=1e-4)
    assert same == detach  # without detach the norms carry gradient, and it differs


def test_gain_adds_one_parameter_per_head_and_starts_neutral(images):
    plain = attention.apply(tiny_model("vit"), "precond").eval()
    gained = attention.apply(tiny_model("vit"), "precond", gain=True).eval()
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    heads = sum(s.num_heads for s in attention.find_sites(gained))
    assert n_params(gained) == n_params(plain) + heads
    torch.testing.assert_close(gained(images), plain(images))
    with torch.no_grad():
        gained.blocks[0].attn.head_conditioner.gain.mul_(3)
    assert not torch.allclose(gained(images), plain(images))


def test_a_deep_copy_uses_its_own_preconditioner(images):
    model = attention.apply(tiny_model("vit"), "precond", gain=True).eval()
    twin = copy.deepcopy(model)
    before = logits(model(images))
    with torch.no_grad():
        twin.blocks[0].attn.head_conditioner.gain.mul_(5)
    torch.testing.assert_close(logits(model(images)), before)
    assert not torch.allclose(logits(twin(images)), before)
