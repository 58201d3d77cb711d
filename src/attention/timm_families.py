"""Adapters that describe timm's attention modules and token entries as sites.

Covered: ViT and DeiT (``timm.layers.Attention``), Swin (``WindowAttention``), XCiT (its
cross-covariance ``XCA`` and the class-attention ``ClassAttn`` of its last blocks), and DaViT
(its window attention and both channel attentions). Lookup is by exact class: a subclass
may compute something else, so it must describe itself through ``attention_site``.
"""

from __future__ import annotations

from collections.abc import Callable

from timm.layers import Attention
from timm.models import cait, davit, swin_transformer, vision_transformer, xcit
from torch import nn

from .sites import AttentionSite, Projection, TokenEntry


def fused_qkv_site(name: str, module: nn.Module, num_heads: int, **where) -> AttentionSite:
    """A site for a module with one ``qkv`` Linear (rows Q, K, V) and a ``proj`` Linear."""
    width = module.qkv.out_features // 3
    q, k, v = (Projection(module.qkv, i * width, width) for i in range(3))
    where.setdefault("head_output", module.proj)
    return AttentionSite(name, module, num_heads, width // num_heads, q, k, v, out=module.proj, **where)


def separate_qkv_site(name: str, module: nn.Module, num_heads: int, **where) -> AttentionSite:
    """A site for a module with ``q``, ``k``, ``v`` and ``proj`` Linears."""
    q, k, v = (Projection(lin, 0, lin.out_features) for lin in (module.q, module.k, module.v))
    where.setdefault("head_output", module.proj)
    return AttentionSite(name, module, num_heads, q.width // num_heads, q, k, v, out=module.proj, **where)


SiteBuilder = Callable[[str, nn.Module], AttentionSite]

ADAPTERS: dict[type, SiteBuilder] = {
    # ViT/DeiT: an optional scale-norm sits between the heads and proj; P enters attn_drop.
    Attention: lambda n, m: fused_qkv_site(n, m, m.num_heads, head_output=m.norm, probs=m.attn_drop),
    swin_transformer.WindowAttention: lambda n, m: fused_qkv_site(n, m, m.num_heads, probs=m.attn_drop),
    xcit.XCA: lambda n, m: fused_qkv_site(n, m, m.num_heads, probs=m.attn_drop, kind="channel"),
    cait.ClassAttn: lambda n, m: separate_qkv_site(n, m, m.num_heads, probs=m.attn_drop),
    davit.WindowAttention: lambda n, m: fused_qkv_site(n, m, m.num_heads, probs=m.softmax, probs_at="output"),
    # DaViT's channel attentions compute softmax inline: P is never visible to a hook.
    davit.ChannelAttention: lambda n, m: fused_qkv_site(n, m, m.num_heads, kind="channel"),
    davit.ChannelAttentionV2: lambda n, m: fused_qkv_site(n, m, m.groups, kind="channel"),
}


def timm_token_entry(model: nn.Module) -> TokenEntry | None:
    """The input of the first transformer layer of a timm model of a covered family."""
    if isinstance(model, vision_transformer.VisionTransformer):  # DeiT subclasses it
        return TokenEntry(model.blocks[0], "BND")
    if isinstance(model, swin_transformer.SwinTransformer):
        return TokenEntry(model.layers[0], "BHWC")
    if isinstance(model, xcit.Xcit):
        return TokenEntry(model.blocks[0], "BND")
    if isinstance(model, davit.DaVit):
        return TokenEntry(model.stages[0].blocks[0], "BCHW")
    return None
