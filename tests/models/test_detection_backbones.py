"""The detection backbones: built by name from a plain mmdet config, four maps at strides 4-32
with the channels the FPN is given, every attention variant trains through them, mmengine's
init keeps an init-time variant, cond_tokens conditions the tokens, pretrained weights load."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("mmdet")
pytest.importorskip("mmcv.ops")

from mmdet.registry import MODELS  # noqa: E402
from mmdet.utils import register_all_modules  # noqa: E402
from mmengine.config import Config  # noqa: E402

from src import attention  # noqa: E402
from src.conditioning import kappa  # noqa: E402
from src.errors import ConfigError  # noqa: E402
from src.models.detection import SimpleFeaturePyramid, out_channels  # noqa: E402

register_all_modules()

TINY = {
    "vit": dict(type="SuiteViT", model_name="vit_base_patch16_224", img_size=64, embed_dim=32, depth=2,
                num_heads=2),
    "xcit": dict(type="SuiteXCiT", model_name="xcit_small_12_p16_224", img_size=64, embed_dim=32, depth=2,
                 num_heads=2, out_blocks=[0, 1, 0, 1], pyramid="xcit"),
    "swin": dict(type="SuiteSwin", model_name="swin_tiny_patch4_window7_224", img_size=64, embed_dim=8,
                 depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=4),
}  # fmt: skip
ATTENTION = {"vit": "Attention", "xcit": "XCA", "swin": "WindowAttention"}
# an image whose sides are no multiple of 32: padded to 96 × 128
HEIGHT, WIDTH = 70, 100
STRIDES = (4, 8, 16, 32)


def build(family: str, seed: int = 0, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    return MODELS.build({**TINY[family], **options})


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", sorted(TINY))
def test_plain_mmdet_config_builds_backbone_with_the_necks_pyramid(family, tmp_path):
    config = tmp_path / "backbone.py"
    config.write_text(
        'custom_imports = dict(imports=["src.models.detection"], allow_failed_imports=False)\n'
        f"backbone = {TINY[family]!r}\n"
        f"backbone['attn'] = dict(variant='precond', eps=1e-6)\n"
    )
    cfg = Config.fromfile(str(config))
    backbone = MODELS.build(cfg.backbone)
    maps = backbone(images())
    padded = (math.ceil(HEIGHT / 32) * 32, math.ceil(WIDTH / 32) * 32)
    assert [tuple(m.shape[-2:]) for m in maps] == [(padded[0] // s, padded[1] // s) for s in STRIDES]
    assert [m.shape[1] for m in maps] == backbone.out_channels == out_channels(cfg.backbone)
    assert backbone.attention_variants[0].name == "precond"


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("variant", list(attention.VARIANTS))
def test_every_variant_applies_and_trains_through_the_backbone(family, variant):
    backbone = build(family, attn={"_target_": "src.attention.build", "variant": variant})
    sites = attention.find_sites(backbone)
    modules = [m for m in backbone.body.modules() if type(m).__name__ == ATTENTION[family]]
    assert len(sites) == len(modules) > 0  # every attention module of the body, nothing else
    assert [v.name for v in backbone.attention_variants] == [variant]
    maps = backbone(images())
    sum(m.square().mean() for m in maps).backward()
    for site in sites:  # gradients reach every attention module, finite
        grads = [p.grad for p in site.module.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), site.name
        assert any(g.abs().sum() > 0 for g in grads), site.name


@pytest.mark.parametrize("family", sorted(TINY))
def test_a_composition_applies_through_the_backbone_in_order(family):
    attn = {"_target_": "src.attention.compose", "parts": ["cond_init", "precond"], "precond": {"gain": True}}
    backbone = build(family, attn=attn)
    assert [v.name for v in backbone.attention_variants] == ["cond_init", "precond"]
    assert backbone.attention_variants[1].gain


def test_out_blocks_feed_the_pyramid_levels_in_order():
    backbone = build("xcit")  # out_blocks [0, 1, 0, 1]: levels fed blocks 0, 1, 0, 1
    backbone.eval()
    x = images()
    with torch.no_grad():
        maps = backbone(x)
        blocks = backbone.body.forward_intermediates(backbone.pad(x), indices=[0, 1], intermediates_only=True)
        expected = [level(blocks[b]) for level, b in zip(backbone.pyramid.levels, [0, 1, 0, 1], strict=True)]
    for got, want in zip(maps, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert not torch.allclose(blocks[0], blocks[1])  # the two blocks differ: the order is seen


def test_mmengine_init_keeps_the_conditioned_initialisation():
    """mmengine's init_weights would call timm's own and undo cond_init; the backbone prevents it."""
    from mmengine.config import ConfigDict
    from mmengine.logging import MMLogger

    from src.attention.cond_init import value_identity
    from tasks.detection.config import base_config, detector

    base = base_config().model
    backbone = {**TINY["vit"], "attn": {"variant": "cond_init"}}
    sizes = dict(neck_channels=16, fc_channels=16, mask_channels=16, anchor_scale=4, train_proposals=8,
                 test_proposals=8, roi_samples=8)  # fmt: skip
    model = MODELS.build(ConfigDict(detector(base, backbone, out_channels(backbone), 3, sizes)))
    site = attention.find_sites(model.backbone)[0]
    identity = value_identity(site.num_heads, site.head_dim, site.dim, "per_head")  # the default
    assert torch.equal(site.v.weight(), identity)  # cond_init: each head's W_V = I_{D×d}
    # init_weights logs to mmengine's latest logger: one of this test's own, not an earlier
    # in-process run's, whose file Hydra's logging setup has closed since
    MMLogger.get_instance(f"init-weights-{id(model)}")
    model.init_weights()
    assert torch.equal(site.v.weight(), identity)
    model.backbone.body.init_weights()  # what mmengine would have called: the test can fail
    assert not torch.equal(site.v.weight(), identity)


@pytest.mark.parametrize("family", sorted(TINY))
def test_cond_tokens_conditions_the_tokens_entering_the_first_layer(family):
    backbone = build(family, attn={"variant": "cond_tokens", "method": "svd"})
    seen = []
    handle = backbone.token_entry().observe(seen.append)
    with torch.no_grad():
        backbone(images())
    handle.remove()
    # Swin's patch embedding ends in a LayerNorm: X has one numerically zero singular value,
    # which cond_tokens' default filter (tau) leaves near zero; κ over the others (≥ 1e-5 σ_max).
    assert kappa(seen[0], nonzero_rtol=1e-5).max() <= 2.0 + 1e-3  # κ(X + σ_max U Φ Vᵀ) ≈ 2
    plain = build(family)
    seen.clear()
    handle = plain.token_entry().observe(seen.append)
    with torch.no_grad():
        plain(images())
    handle.remove()
    assert kappa(seen[0], nonzero_rtol=1e-5).max() > 2.0  # without it the tokens are worse conditioned


def test_pretrained_weights_load_only_from_the_same_backbone_and_variant(tmp_path):
    trained = build("xcit", seed=1, attn={"variant": "spectral"})
    path = tmp_path / "last.pt"
    torch.save({"model": trained.body.state_dict(), "step": 3}, path)  # a suite checkpoint
    loaded = build("xcit", seed=2, attn={"variant": "spectral"}, pretrained=str(path))
    for (name, want), got in zip(
        trained.body.state_dict().items(), loaded.body.state_dict().values(), strict=True
    ):
        assert torch.equal(want, got), name
    with pytest.raises(ConfigError, match="same attention variant"):  # W stored under another name
        build("xcit", attn={"variant": "standard"}, pretrained=str(path))
    with pytest.raises(ConfigError, match="does not fit"):  # another width
        build("xcit", embed_dim=48, attn={"variant": "spectral"}, pretrained=str(path))


@pytest.mark.parametrize("style, channels", [("vitdet", [8, 16, 32, 32]), ("xcit", [32, 32, 32, 32])])
def test_simple_feature_pyramid_resamples_by_4_2_1_half(style, channels):
    pyramid = SimpleFeaturePyramid(32, style=style)
    maps = pyramid(torch.randn(2, 32, 6, 10))
    assert [tuple(m.shape[1:]) for m in maps] == [
        (c, int(6 * s), int(10 * s)) for c, s in zip(channels, (4, 2, 1, 0.5), strict=True)
    ]
