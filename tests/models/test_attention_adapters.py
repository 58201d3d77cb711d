"""Which adapter gives each of the suite's own models its attention sites, as their docstrings say:
GPT, Crammed BERT and the softmax LRA encoder are served by the ViT family's adapter (their
attention is ``timm.layers.Attention``), the Nyström LRA encoder describes itself."""

from __future__ import annotations

import pytest
from torch import nn

from src.attention.registry import find_sites
from src.attention.timm_families import ADAPTERS, vit_attention_site
from src.models.crammed_bert import CrammedBERT
from src.models.gpt import GPT
from src.models.lra import LRAClassifier

DEPTH = 2
SMALL = dict(dim=16, depth=DEPTH, num_heads=2)


def adapters_used(model: nn.Module) -> list:
    """The adapter of each attention module ``find_sites`` finds, or ``"attention_site"`` where the
    module describes itself."""
    used = []
    for _, module in model.named_modules():
        if callable(getattr(module, "attention_site", None)):
            used.append("attention_site")
        elif type(module) in ADAPTERS:
            used.append(ADAPTERS[type(module)])
    return used


@pytest.mark.parametrize(
    "model",
    [
        GPT(40, 8, **SMALL),
        CrammedBERT(40, 8, ffn_dim=32, **SMALL),
        LRAClassifier(40, 3, 8, mlp_dim=32, **SMALL),
    ],
    ids=["gpt", "crammed_bert", "lra_softmax"],
)
def test_the_suites_timm_attention_models_use_the_vit_familys_adapter_and_say_so(model):
    assert adapters_used(model) == [vit_attention_site] * DEPTH
    assert len(find_sites(model)) == DEPTH
    assert "vit_attention_site" in type(model).__doc__


def test_the_nystrom_encoder_describes_its_own_sites():
    model = LRAClassifier(40, 3, 8, mlp_dim=32, attention="nystrom", num_landmarks=4, **SMALL)
    assert adapters_used(model) == ["attention_site"] * DEPTH and len(find_sites(model)) == DEPTH
    assert "NystromAttention" in LRAClassifier.__doc__
