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

from .sites import AttentionSite, Layout, Projection, TokenEntry, Where


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


def timm_token_entry(model: nn.Module, where: Where = "block") -> TokenEntry | None:
    """The token entry of a timm model of a covered family (``None`` for any other model).

    ``where="block"``: the input of the first transformer layer. ``"embed"``: the output of
    the patch embedding, before any class token or position embedding joins:

    * ViT/DeiT: ``patch_embed``'s output, ``(B, N, D)`` when it flattens, else in its
      ``output_fmt`` (NHWC with ``dynamic_img_size``); class/distillation tokens and positions
      join after it (``_pos_embed``);
    * Swin: ``patch_embed``'s output (NHWC, after its LayerNorm); no absolute position is
      added, so this is the very tensor ``layers[0]`` receives;
    * XCiT: element 0 of ``patch_embed``'s ``(x, (Hp, Wp))``, ``(B, N, D)``; the Fourier
      position encoding joins after it (the class token only at the class-attention layers);
    * DaViT: ``stem``'s output (NCHW, after its LayerNorm); the first stage has no
      downsampling and positions are convolutional inside the blocks, so this is the very
      tensor ``stages[0].blocks[0]`` receives.
    """
    if isinstance(model, vision_transformer.VisionTransformer):  # DeiT subclasses it
        if where == "block":
            return TokenEntry(model.blocks[0], "BND")
        return _patch_embed_entry(model.patch_embed)
    if isinstance(model, swin_transformer.SwinTransformer):
        if where == "block":
            return TokenEntry(model.layers[0], "BHWC")
        return _patch_embed_entry(model.patch_embed)
    if isinstance(model, xcit.Xcit):
        if where == "block":
            return TokenEntry(model.blocks[0], "BND")
        return TokenEntry(model.patch_embed, "BND", at="output")
    if isinstance(model, davit.DaVit):
        if where == "block":
            return TokenEntry(model.stages[0].blocks[0], "BCHW")
        return TokenEntry(model.stem, "BCHW", at="output")
    return None


def _patch_embed_entry(embed: nn.Module) -> TokenEntry | None:
    """The output of a ``timm.layers.PatchEmbed``: ``BND`` when it flattens, else in its
    ``output_fmt`` (``None`` for a format the token entry does not read, ``NCL``)."""
    if getattr(embed, "flatten", True):
        return TokenEntry(embed, "BND", at="output")
    fmt = getattr(getattr(embed, "output_fmt", None), "value", "NCHW")
    layout: Layout | None = {"NHWC": "BHWC", "NCHW": "BCHW", "NLC": "BND"}.get(fmt)
    return None if layout is None else TokenEntry(embed, layout, at="output")
