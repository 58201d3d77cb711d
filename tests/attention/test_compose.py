"""Composed variants: applied in their declared order, conflicts refused before any work."""

from __future__ import annotations

import pytest
import torch
from conftest import compose as compose_config
from conftest import tiny_model
from toy_variant import ScaleOut, ShiftHeads

from src import attention
from src.attention import AttentionConfigError
from src.attention.config import attn_name, complete


@pytest.fixture
def scale_out():
    attention.register(ScaleOut)
    yield
    del attention.VARIANTS["scale_out"]


@pytest.mark.parametrize("family", ["vit", "swin", "xcit"])
def test_a_composition_of_two_init_only_variants_is_applying_them_in_order(scale_out, family):
    torch.manual_seed(3)
    composed = attention.apply(tiny_model(family), attention.compose(["cond_init", "scale_out"]))
    torch.manual_seed(3)
    in_order = attention.apply(attention.apply(tiny_model(family), "cond_init"), "scale_out", factor=0.5)
    torch.manual_seed(3)
    first_only = attention.apply(tiny_model(family), "cond_init")
    for key, value in composed.state_dict().items():
        assert torch.equal(value, in_order.state_dict()[key]), key
    assert any(not torch.equal(v, first_only.state_dict()[k]) for k, v in composed.state_dict().items())
    assert [v.name for v in composed.attention_variants] == ["cond_init", "scale_out"]


def test_an_init_then_a_hook_compose_and_both_act():
    torch.manual_seed(0)
    model = attention.apply(
        tiny_model("vit"), attention.compose(["mimetic", "precond"], precond={"gain": True})
    )
    assert [v.name for v in model.attention_variants] == ["mimetic", "precond"]
    assert all(hasattr(block.attn, "head_conditioner") for block in model.blocks)


@pytest.fixture
def shift_heads():
    attention.register(ShiftHeads)
    yield
    del attention.VARIANTS["shift_heads"]


def test_two_hooks_on_the_heads_output_chain_in_the_declared_order(shift_heads):
    """precond then shift_heads: the projection sees ``precond(PV) + 0.25``, as a model with precond
    and that pre-hook added by hand; the other order differs (precond equilibrates the shifted rows)."""
    x = torch.randn(2, 3, 32, 32)
    built = {}
    for order in (["precond", "shift_heads"], ["shift_heads", "precond"]):
        torch.manual_seed(0)
        built[tuple(order)] = attention.apply(tiny_model("vit"), attention.compose(order)).eval()(x)
    torch.manual_seed(0)
    by_hand = attention.apply(tiny_model("vit"), "precond").eval()
    for block in by_hand.blocks:
        block.attn.proj.register_forward_pre_hook(lambda module, args: (args[0] + 0.25, *args[1:]))
    torch.testing.assert_close(built[("precond", "shift_heads")], by_hand(x), rtol=0, atol=0)
    assert not torch.allclose(built[("shift_heads", "precond")], built[("precond", "shift_heads")], atol=1e-3)


@pytest.mark.parametrize(
    "parts, fix",
    [
        (["cond_init", "mimetic"], "drop one of them"),  # two initializations of W_Q, W_K, W_V
        (["spectral", "cond_init"], "swap them"),  # an initialization under a parametrization
    ],
)
def test_conflicting_parts_fail_naming_both(parts, fix):
    with pytest.raises(AttentionConfigError) as err:
        attention.compose(parts)
    assert all(p in str(err.value) for p in parts) and fix in str(err.value)


def test_spectral_conflicts_only_on_the_weights_its_targets_name():
    attention.compose(["cond_init", "spectral"], spectral={"targets": "qkv"})  # init, then parametrize
    with pytest.raises(AttentionConfigError, match="W_V"):
        attention.compose(["spectral", "cond_init"], spectral={"targets": "v"})


@pytest.mark.parametrize(
    "parts, options, message",
    [
        (["precond", "precond"], {}, "names precond twice"),
        (["precond"], {"spectral": {"lam": 1}}, "options for spectral, which attn.parts"),
        (["precond", "spectral"], {"spectral": {"lamda": 1}}, "unknown option"),
        ([], {}, "needs attn.parts"),
    ],
)
def test_bad_compositions_are_one_clear_error(parts, options, message):
    with pytest.raises(AttentionConfigError, match=message):
        attention.compose(parts, **options)


def test_the_composed_config_names_every_option_of_every_part(tmp_path):
    cfg = compose_config(
        ["attn=compose", "attn.parts=[cond_init,spectral]", "+attn.spectral.mode=svd"], tmp_path
    )
    built = complete(cfg.attn)
    assert attn_name(cfg.attn) == cfg.attn.variant == "cond_init+spectral"
    assert [p.name for p in built.parts] == ["cond_init", "spectral"]
    assert dict(cfg.attn.spectral) == attention.build("spectral", mode="svd").options()
    assert dict(cfg.attn.cond_init) == attention.build("cond_init").options()
    assert [k for k in cfg.attn if k in attention.VARIANTS] == ["cond_init", "spectral"]  # in order


def test_hydras_list_selection_is_refused_with_the_composing_command(tmp_path):
    """``attn=[a,b]`` would merge both files into one node; the run says what to type instead."""
    from conftest import run_cli

    result = run_cli(["attn=[cond_init,spectral]", f"paths.output_dir={tmp_path}"], cwd=tmp_path)
    assert result.returncode == 2
    assert "attn=compose 'attn.parts=[cond_init,spectral]'" in result.stderr.splitlines()[-1]
    assert not list(tmp_path.rglob("metrics.jsonl"))
