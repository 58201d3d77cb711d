"""P4 Prop 3.2 and P2 Thm 3.5 as the diagnostics see them: spectral (svd) and cond_init lower
the median κ of the effective W_Q, W_K, W_V against timm's default initialization."""

from __future__ import annotations

import statistics

import torch
from timm.models import vision_transformer

from src import attention
from src.conditioning import ConditioningMonitor

SEEDS = range(20)


def median_weight_kappa(variant: str | None, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)
    model = vision_transformer.VisionTransformer(  # ViT-Ti widths: D = 192, 3 heads of 64
        img_size=32, patch_size=8, embed_dim=192, depth=4, num_heads=3, num_classes=10
    )
    if variant is not None:
        attention.apply(model, variant, **({"mode": "svd"} if variant == "spectral" else {}))
    weights = ConditioningMonitor(model).weights()
    return {w: weights[f"kappa/{w}/median"] for w in ("W_Q", "W_K", "W_V")}


def test_spectral_and_cond_init_lower_the_median_kappa_over_twenty_seeds():
    mean = {}
    for variant in (None, "spectral", "cond_init"):
        per_seed = [median_weight_kappa(variant, s) for s in SEEDS]
        mean[variant] = {w: statistics.fmean(m[w] for m in per_seed) for w in ("W_Q", "W_K", "W_V")}
    for w in ("W_Q", "W_K", "W_V"):
        assert mean["spectral"][w] < mean[None][w] and mean["cond_init"][w] < mean[None][w], (w, mean)
