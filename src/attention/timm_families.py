"""Adapters that describe timm's model families as attention sites and token entries.

One :class:`Family` per family, in ``FAMILIES``: its name, its model classes, a site builder per
attention class, its token entry, and a tiny model for tests. Everything else derives from it:
``ADAPTERS`` (attention class -> site builder) that ``find_sites`` reads, the model names
``find_token_entry``'s errors list, ``tests/conftest.py``'s ``TINY_FAMILIES`` and the models
``tests/timm_upstream`` runs timm's own tests on. A new family is one :func:`register_family`.

Covered: ViT and DeiT (``timm.layers.Attention``), Swin (``WindowAttention``), XCiT (its
cross-covariance ``XCA`` and the class-attention ``ClassAttn`` of its last blocks), and DaViT
(its window attention and both channel attentions). Lookup is by exact class: a subclass
may compute something else, so it must describe itself through ``attention_site``.

Lookup by class, not by model, serves the suite's own models too. GPT (:class:`src.models.gpt.GPT`),
Crammed BERT (:class:`src.models.crammed_bert.CrammedBERT`) and the LRA encoders with softmax
attention (:class:`src.models.lra.LRAClassifier`) build their attention from
``timm.layers.Attention``, the ViT family's attention class, so their sites come from the ViT
family's adapter, :func:`vit_attention_site`: it reads what that class holds (``qkv``, ``proj``,
``norm``, ``attn_drop``), whatever model holds it, so that these models need no adapter of their
own and every variant applies to them as to ViT. Their token entries are their own
(``token_entry``). The LRA encoders' Nyström attention and the sandbox's attention describe
themselves (``attention_site``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from difflib import SequenceMatcher
from fnmatch import fnmatch

from timm.layers import Attention
from timm.models import beit, cait, davit, deit, eva, swin_transformer, vision_transformer, xcit
from timm.models._features import FeatureDictNet, FeatureGetterNet, FeatureHookNet
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
EntryFinder = Callable[[nn.Module, Where], "TokenEntry | None"]


@dataclass(frozen=True)
class Family:
    """One model family, all the suite needs to know of it.

    Attributes:
        name: short name (``vit``): the key of ``FAMILIES`` and of the tests' ``TINY_FAMILIES``.
        models: the model classes whose token entry ``token_entry`` knows (``isinstance``).
        sites: attention class -> the builder of its :class:`AttentionSite` (exact class).
        token_entry: ``(model, where) -> TokenEntry`` (``None`` where the family has none). It
            may receive, instead of the model, a view of timm's flattening ``features_only``
            wrapper that answers the model's attribute paths (``model.layers[0]``).
        tiny: builds a tiny model of the family (``3×32×32`` images, 5 classes) for tests.
        timm_name: a model name in timm's registry, for running timm's own model tests on the
            family (``tests/timm_upstream``); ``None`` for a family timm does not register.
        timm_models: ``fnmatch`` patterns of the timm model names built from this family's
            classes (``vit_*``), a leading ``!`` excluding (``!vit_relpos_*``: another attention
            class); :func:`supported_timm_models` reads them.
    """

    name: str
    models: tuple[type[nn.Module], ...]
    sites: dict[type[nn.Module], SiteBuilder]
    token_entry: EntryFinder
    tiny: Callable[[], nn.Module]
    timm_name: str | None = None
    timm_models: tuple[str, ...] = ()


#: The registered families, by name, in registration order.
FAMILIES: dict[str, Family] = {}
#: Attention class -> site builder, over every registered family (kept in step by
#: :func:`register_family`); ``find_sites`` reads it.
ADAPTERS: dict[type, SiteBuilder] = {}


def register_family(family: Family) -> Family:
    """Add ``family``: its attention modules become sites and its models get a token entry."""
    if family.name in FAMILIES:
        raise ValueError(f"a model family named {family.name!r} is already registered")
    FAMILIES[family.name] = family
    _collect_adapters()
    return family


def unregister_family(name: str) -> Family:
    """Remove the family ``name`` (a test's toy family, for instance) and return it."""
    family = FAMILIES.pop(name)
    _collect_adapters()
    return family


def _collect_adapters() -> None:
    ADAPTERS.clear()
    for family in FAMILIES.values():
        for cls, builder in family.sites.items():
            ADAPTERS.setdefault(cls, builder)


def supported_models() -> str:
    """The model classes with a known token entry, for error messages (``VisionTransformer, …``)."""
    return ", ".join(dict.fromkeys(cls.__name__ for f in FAMILIES.values() for cls in f.models))


def supported_attention() -> str:
    """Each supported attention class once, with the families that use it, for error messages:
    ``Attention (vit, deit), WindowAttention (swin, davit), …`` (two classes of one name, Swin's
    and DaViT's ``WindowAttention``, are one entry)."""
    users: dict[str, list[str]] = {}
    for family in FAMILIES.values():
        for cls in family.sites:
            names = users.setdefault(cls.__qualname__, [])
            if family.name not in names:
                names.append(family.name)
    return ", ".join(f"{cls} ({', '.join(names)})" for cls, names in users.items())


def supported_timm_models() -> list[str]:
    """The names in timm's registry that the registered families' ``timm_models`` patterns match."""
    import timm

    found = []
    for name in timm.list_models():
        for family in FAMILIES.values():
            patterns = family.timm_models
            if any(fnmatch(name, p) for p in patterns if not p.startswith("!")) and not any(
                fnmatch(name, p[1:]) for p in patterns if p.startswith("!")
            ):
                found.append(name)
                break
    return found


def nearest_supported(name: str, tries: int = 5) -> str | None:
    """The supported timm model whose name is closest to ``name``: a cheap rule, ``difflib``'s
    ratio between the names (``convnext_tiny`` -> ``davit_tiny``), over
    :func:`supported_timm_models`. The closest few are built on the meta device (no memory, no
    weights) and the first with an attention module of a family is the answer, so that a model a
    later timm adds under a family's pattern with another attention class is never suggested.
    None where none is found."""
    import timm
    import torch

    ranked = sorted(supported_timm_models(), key=lambda c: (-SequenceMatcher(None, name, c).ratio(), c))
    for candidate in ranked[:tries]:
        with torch.device("meta"):
            model = timm.create_model(candidate, pretrained=False)
        if any(type(m) in ADAPTERS for m in model.modules()):
            return candidate
    return None


def timm_token_entry(model: nn.Module, where: Where = "block") -> TokenEntry | None:
    """The token entry of a model of a registered family (``None`` for any other model).

    timm's ``features_only`` wrappers are seen through: ``FeatureGetterNet`` holds the model
    (``.model``); ``FeatureListNet``/``FeatureDictNet``/``FeatureHookNet`` hold its top-level
    modules with its ``Sequential``\\ s flattened (``layers.0`` -> ``layers_0``), and are matched
    to a family by their attention modules.
    """
    for family in FAMILIES.values():
        if isinstance(model, family.models):
            return family.token_entry(model, where)
    if isinstance(model, FeatureGetterNet):
        return timm_token_entry(model.model, where)
    if isinstance(model, (FeatureDictNet, FeatureHookNet)):
        kinds = {type(m) for m in model.modules()}
        for family in FAMILIES.values():
            if kinds & family.sites.keys():
                return family.token_entry(_Unflattened(model), where)
    return None


class _Unflattened:
    """A flattening ``features_only`` wrapper seen with its model's attribute paths: a child
    ``layers_0`` answers ``view.layers[0]``; other children answer by their own names."""

    def __init__(self, net: nn.Module) -> None:
        self._net = net

    def __getattr__(self, name: str) -> nn.Module | list[nn.Module]:
        children = dict(self._net.named_children())
        if name in children:
            return children[name]
        prefix = f"{name}_"
        indexed = {
            int(k[len(prefix) :]): m
            for k, m in children.items()
            if k.startswith(prefix) and k[len(prefix) :].isdigit()
        }
        if not indexed:
            raise AttributeError(name)
        return [indexed[i] for i in sorted(indexed)]


def _patch_embed_entry(embed: nn.Module) -> TokenEntry | None:
    """The output of a ``timm.layers.PatchEmbed``: ``BND`` when it flattens, else in its
    ``output_fmt`` (``None`` for a format the token entry does not read, ``NCL``)."""
    if getattr(embed, "flatten", True):
        return TokenEntry(embed, "BND", at="output")
    fmt = getattr(getattr(embed, "output_fmt", None), "value", "NCHW")
    layout: Layout | None = {"NHWC": "BHWC", "NCHW": "BCHW", "NLC": "BND"}.get(fmt)
    return None if layout is None else TokenEntry(embed, layout, at="output")


# -- timm's families ---------------------------------------------------------------------
# ``where="block"``: the input of the first transformer layer. ``"embed"``: the output of the
# patch embedding, before any class token or position embedding joins:
#
# * ViT/DeiT: ``patch_embed``'s output, ``(B, N, D)`` when it flattens, else in its
#   ``output_fmt`` (NHWC with ``dynamic_img_size``); class/distillation tokens and positions
#   join after it (``_pos_embed``);
# * Swin: ``patch_embed``'s output (NHWC, after its LayerNorm); no absolute position is added,
#   so this is the very tensor ``layers[0]`` receives;
# * XCiT: element 0 of ``patch_embed``'s ``(x, (Hp, Wp))``, ``(B, N, D)``; the Fourier position
#   encoding joins after it (the class token only at the class-attention layers);
# * DaViT: ``stem``'s output (NCHW, after its LayerNorm); the first stage has no downsampling
#   and positions are convolutional inside the blocks, so this is the very tensor
#   ``stages[0].blocks[0]`` receives.


def _vit_entry(model: nn.Module, where: Where) -> TokenEntry | None:
    return TokenEntry(model.blocks[0], "BND") if where == "block" else _patch_embed_entry(model.patch_embed)


def _swin_entry(model: nn.Module, where: Where) -> TokenEntry | None:
    return TokenEntry(model.layers[0], "BHWC") if where == "block" else _patch_embed_entry(model.patch_embed)


def _xcit_entry(model: nn.Module, where: Where) -> TokenEntry:
    if where == "block":
        return TokenEntry(model.blocks[0], "BND")
    return TokenEntry(model.patch_embed, "BND", at="output")


def _davit_entry(model: nn.Module, where: Where) -> TokenEntry:
    if where == "block":
        return TokenEntry(model.stages[0].blocks[0], "BCHW")
    return TokenEntry(model.stem, "BCHW", at="output")


def vit_attention_site(name: str, module: Attention) -> AttentionSite:
    """The ViT family's adapter: the site of a ``timm.layers.Attention``, whose optional scale-norm
    (``norm``) sits between the heads and ``proj`` and whose ``attn_drop`` gets ``P``. ViT and
    DeiT use it, and so do the suite's GPT, Crammed BERT and softmax LRA encoders, built from the
    same class (module docstring)."""
    return fused_qkv_site(name, module, module.num_heads, head_output=module.norm, probs=module.attn_drop)


_VIT_SITES: dict[type[nn.Module], SiteBuilder] = {Attention: vit_attention_site}
#: timm names ``vit_*`` whose attention is another class: rotary (``AttentionRope``), relative
#: position (``RelPosAttention``), differential (``DiffAttention``) and the ``xp`` and ``pwee``
#: blocks; found by building every ``vit_*`` model of timm 1.0.31 on the meta device.
VIT_OTHER_ATTENTION = (
    "!vit_*rope*",
    "!vit_*_sapiens2",
    "!vit_pe_*",
    "!vit_relpos_*",
    "!vit_srelpos_*",
    "!vit_*_xp_*",
    "!vit_d*wee_*",
    "!vit_dlittle_*",
    "!vit_pwee_*",
)
_TINY_VIT = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=5)

register_family(
    Family(
        "vit",
        (vision_transformer.VisionTransformer,),
        _VIT_SITES,
        _vit_entry,
        lambda: vision_transformer.VisionTransformer(**_TINY_VIT),
        "vit_tiny_patch16_224",
        ("vit_*", *VIT_OTHER_ATTENTION),
    )
)
register_family(
    Family(
        "deit",
        (deit.VisionTransformerDistilled,),
        _VIT_SITES,
        _vit_entry,
        lambda: deit.VisionTransformerDistilled(**_TINY_VIT),
        "deit_tiny_patch16_224",
        ("deit_*", "deit3_*"),
    )
)
register_family(
    Family(
        "swin",
        (swin_transformer.SwinTransformer,),
        {swin_transformer.WindowAttention: lambda n, m: fused_qkv_site(n, m, m.num_heads, probs=m.attn_drop)},
        _swin_entry,
        lambda: swin_transformer.SwinTransformer(
            img_size=32,
            patch_size=4,
            window_size=4,
            embed_dim=24,
            depths=(2, 2),
            num_heads=(2, 4),
            num_classes=5,
        ),
        "swin_tiny_patch4_window7_224",
        ("swin_*",),
    )
)
register_family(
    Family(
        "xcit",
        (xcit.Xcit,),
        {
            xcit.XCA: lambda n, m: fused_qkv_site(n, m, m.num_heads, probs=m.attn_drop, kind="channel"),
            cait.ClassAttn: lambda n, m: separate_qkv_site(n, m, m.num_heads, probs=m.attn_drop),
        },
        _xcit_entry,
        lambda: xcit.Xcit(
            img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4, cls_attn_layers=1, num_classes=5
        ),
        "xcit_nano_12_p16_224",
        ("xcit_*",),
    )
)
register_family(
    Family(
        "davit",
        (davit.DaVit,),
        {
            davit.WindowAttention: lambda n, m: fused_qkv_site(
                n, m, m.num_heads, probs=m.softmax, probs_at="output"
            ),
            # DaViT's channel attentions compute softmax inline: P is never visible to a hook.
            davit.ChannelAttention: lambda n, m: fused_qkv_site(n, m, m.num_heads, kind="channel"),
            davit.ChannelAttentionV2: lambda n, m: fused_qkv_site(n, m, m.groups, kind="channel"),
        },
        _davit_entry,
        lambda: davit.DaVit(
            depths=(1, 1), embed_dims=(16, 32), num_heads=(2, 4), window_size=2, num_classes=5
        ),
        "davit_tiny",
        ("davit_*",),
    )
)


def eva_attention_site(name: str, module: eva.EvaAttention) -> AttentionSite:
    """EVA's attention: one ``qkv`` Linear (EVA-01; its q and v biases are parameters of the module,
    added by ``F.linear``, the k bias a zero buffer) or ``q_proj``, ``k_proj``, ``v_proj`` (EVA-02).
    The optional q/k norm and the rotary embedding act on each head's q and k after the
    projections, so ``W_Q``, ``W_K`` are still the rows the variants condition and the module
    keeps both unchanged; the optional scale norm (``norm``) sits between the heads and ``proj``,
    as ViT's, and ``attn_drop`` gets ``P`` on the explicit path."""
    where = dict(head_output=module.norm, probs=module.attn_drop)
    if module.qkv is not None:
        return fused_qkv_site(name, module, module.num_heads, **where)
    q, k, v = (Projection(lin, 0, lin.out_features) for lin in (module.q_proj, module.k_proj, module.v_proj))
    return AttentionSite(name, module, module.num_heads, module.head_dim, q, k, v, out=module.proj, **where)


# The tiny EVA and BEiT of the family tests. ``head_init_scale=1``: timm's 0.001 makes logits of
# 1e-4, too small to see what a variant changes.
_TINY = dict(
    img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=5, head_init_scale=1.0
)
# EVA-02: separate q/k/v, q/k norm, rotary embeddings, SwiGLU, the scale norm inside attention.
_TINY_EVA = dict(_TINY, ref_feat_shape=(4, 4))
register_family(
    Family(
        "eva",
        (eva.Eva,),
        {eva.EvaAttention: eva_attention_site},
        _vit_entry,  # Eva: patch_embed, then class token and positions, then blocks (rope passed along)
        lambda: eva.Eva(
            **_TINY_EVA,
            qkv_fused=False,
            qk_norm=True,
            swiglu_mlp=True,
            scale_attn_inner=True,
            use_rot_pos_emb=True,
        ),
        "eva02_tiny_patch14_224",
        ("eva_*", "eva02_*"),
    )
)
# EVA-01's layout: one qkv Linear with q and v biases, absolute positions, no rope.
register_family(
    Family(
        "eva_fused",
        (eva.Eva,),
        {eva.EvaAttention: eva_attention_site},
        _vit_entry,
        lambda: eva.Eva(**_TINY_EVA, qkv_fused=True, use_rot_pos_emb=True),
    )
)
register_family(
    Family(
        "beit",
        (beit.Beit,),
        # BEiT's relative position bias is added to the logits before the softmax on both paths
        {beit.Attention: lambda n, m: fused_qkv_site(n, m, m.num_heads, probs=m.attn_drop)},
        _vit_entry,  # Beit: patch_embed, then class token and positions, then blocks
        lambda: beit.Beit(**_TINY, use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.1),
        "beit_base_patch16_224",
        ("beit_*", "beitv2_*"),
    )
)
