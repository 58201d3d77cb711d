"""P4 Prop 3.2 and P2 Thm 3.5 as the diagnostics see them, on a ViT with ViT-Ti widths at
initialization: spectral (svd) and cond_init lower the median κ of the effective W_Q, W_K,
W_V against timm's default initialization; on ``B(J)`` itself spectral does, cond_init does not.
Every test shares one module-scoped measurement (20 seeds, about 4 s on one thread)."""

from __future__ import annotations

import copy
import statistics

import pytest
import torch
from conftest import pink_noise_images
from timm.models import vision_transformer

from src import attention
from src.conditioning import ConditioningMonitor

SEEDS = range(20)
WEIGHTS = ("W_Q", "W_K", "W_V")
#: The corrections under test, on every projection: svd is P2 Thm 3.5 literally (the configured
#: default corrects W_Q only, which leaves nothing to see in W_K and W_V).
FORMS: dict[str | None, dict] = {None: {}, "spectral": {"mode": "svd", "targets": "qkv"}, "cond_init": {}}
FIRST = "blocks.0.attn"
#: Per form (``None``: timm's initialization), per seed: the monitor's output.
Measured = dict[str | None, list[dict[str, float]]]


@pytest.fixture(scope="module")
def measured() -> Measured:
    """Per form, per seed: the monitor's weight κ and ``B(J)`` (first image) on 1/f-noise images.
    One model per seed, copied for each form, so the forms share timm's initialization."""
    images = pink_noise_images(2, size=32)
    out: Measured = {form: [] for form in FORMS}
    for seed in SEEDS:
        torch.manual_seed(seed)
        base = vision_transformer.VisionTransformer(  # ViT-Ti widths: D = 192, 3 heads of 64
            img_size=32, patch_size=8, embed_dim=192, depth=4, num_heads=3, num_classes=10
        )
        for form, options in FORMS.items():
            model = base if form is None else attention.apply(copy.deepcopy(base), form, **options)
            out[form].append(ConditioningMonitor(model, samples=1, bound=True)(images))
    return out


def test_spectral_and_cond_init_lower_the_median_kappa_over_twenty_seeds(measured: Measured) -> None:
    """The κ(W) half of Prop 3.2 and Thm 3.5: the mean over seeds of the median κ is lower."""
    mean = {
        form: {w: statistics.fmean(m[f"kappa/{w}/median"] for m in runs) for w in WEIGHTS}
        for form, runs in measured.items()
    }
    for w in WEIGHTS:
        assert mean["spectral"][w] < mean[None][w] and mean["cond_init"][w] < mean[None][w], (w, mean)


def test_spectral_svd_lowers_the_bound_in_every_seed(measured: Measured) -> None:
    """``B(J)`` itself, over all heads of all four blocks: spectral (svd, every projection) gives
    the smaller median bound in each of the 20 seeds (measured ratios 0.2–0.6): its shift keeps
    the weights' scale (``S → S + σ_max``), so κ(W) falls without the softmax leaving uniform."""
    for mine, timm in zip(measured["spectral"], measured[None], strict=True):
        assert mine["bound/median"] < timm["bound/median"]


def test_cond_init_does_not_lower_the_first_blocks_bound_against_timm_init(measured: Measured) -> None:
    """Contradicts Prop 3.2 on ``B(J)`` as the monitor reads it: at the first block (LayerNorm'd
    tokens of 1/f-noise images, D = 192, d = 64, N = 17), cond_init's ``B(J)`` is smaller than
    under timm's trunc-normal std 0.02 in only 7 of 20 seeds (median ratio 1.34; 1 of the first
    10). That is no consistent direction, and the median seed goes against the claim. The κ(W)
    factor falls from about 25 to 2, but semi-orthogonal weights are ~50× larger than timm's,
    so the softmax leaves uniform (entropy 0.86 against 1.00) and ``κ(Λ(P))`` grows by as much
    (see ``test_theorems.py`` for the same effect on random tokens). Over all four blocks the
    median bound is lower in 10 of 20 seeds (median ratio 1.01)."""
    ratios = [
        mine[f"bound/{FIRST}"] / timm[f"bound/{FIRST}"]
        for mine, timm in zip(measured["cond_init"], measured[None], strict=True)
    ]
    assert sum(r < 1 for r in ratios) < len(ratios) / 2, ratios  # the claimed direction fails here
    assert statistics.median(ratios) > 1, ratios
