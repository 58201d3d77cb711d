"""The registry and apply(): names, options, and the errors a user meets."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal, get_args, get_origin

import pytest
import torch
from conftest import CONF, tiny_model
from omegaconf import OmegaConf
from torch import nn

from src import attention
from src.attention import AttentionConfigError


def test_variants_are_discovered_in_table_order():
    """Every module of the package is imported (no import list to forget), and ``VARIANTS`` is
    ordered by rank, the baseline first, whatever the import order."""
    assert list(attention.VARIANTS)[:6] == [
        "standard",
        "precond",
        "spectral",
        "cond_init",
        "cond_tokens",
        "mimetic",
    ]
    ranks = [(cls.rank, name) for name, cls in attention.VARIANTS.items()]
    assert ranks == sorted(ranks)


def test_each_variant_has_one_config_whose_defaults_are_its_own():
    """``conf/attn/<name>.yaml`` exists for every registered variant, every file but ``compose``
    names one, and the file's options are the variant's defaults: a composition's parts (built
    from the dataclass) and a single run (from the file) cannot disagree."""
    from omegaconf import OmegaConf

    files = {p.stem: OmegaConf.to_container(OmegaConf.load(p)) for p in (CONF / "attn").glob("*.yaml")}
    assert set(files) - {"compose"} == set(attention.VARIANTS)
    for name, cfg in files.items():
        if name != "compose":
            options = {k: v for k, v in cfg.items() if k not in ("_target_", "variant")}
            assert cfg["variant"] == name and options == attention.build(name).options(), name


def test_unknown_variant_names_the_valid_ones():
    with pytest.raises(AttentionConfigError) as err:
        attention.apply(tiny_model("vit"), "softmax")
    for name in attention.VARIANTS:
        assert name in str(err.value)


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(AttentionConfigError) as err:
        attention.apply(tiny_model("vit"), "spectral", lamda=3)
    message = str(err.value)
    assert "lamda" in message and "mode: 'identity' | 'svd'" in message and "lam: float" in message


@pytest.mark.parametrize(
    "variant, options",
    [
        ("spectral", {"mode": "exact"}),
        ("spectral", {"lam": "ten"}),
        ("precond", {"detach": 1}),
        ("cond_tokens", {"steps": 2.5}),
        ("cond_init", {"value": "shared"}),
    ],
)
def test_option_of_the_wrong_type_or_value_fails(variant, options):
    with pytest.raises(AttentionConfigError, match=next(iter(options))):
        attention.build(variant, **options)


def test_integer_options_widen_to_float():
    assert attention.build("spectral", lam=2).lam == 2.0 and isinstance(
        attention.build("spectral", lam=2).lam, float
    )


def test_apply_accepts_a_built_variant_and_records_it():
    model = attention.apply(tiny_model("vit"), attention.build("precond", eps=1e-3))
    assert [(v.name, v.options()) for v in model.attention_variants] == [
        ("precond", {"eps": 1e-3, "detach": True, "gain": False})
    ]


def test_the_same_variant_twice_is_refused():
    model = attention.apply(tiny_model("vit"), "precond")
    with pytest.raises(AttentionConfigError, match="already applied"):
        attention.apply(model, "precond")


def test_a_model_without_attention_is_refused():
    with pytest.raises(AttentionConfigError, match="attention_site"):
        attention.apply(nn.Sequential(nn.Linear(4, 4)), "standard")


def test_cond_tokens_needs_a_token_entry():
    class Bare(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = tiny_model("vit").blocks[0].attn

        def forward(self, x):
            return self.attn(x)

    with pytest.raises(AttentionConfigError, match="token_entry"):
        attention.apply(Bare(), "cond_tokens")


class OwnAttention(nn.Module):
    """The suite's interface: a module that describes itself (here, separate q/k/v Linears)."""

    def __init__(self, dim: int = 12, heads: int = 3):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))

    def attention_site(self, name):
        from src.attention.timm_families import separate_qkv_site

        return separate_qkv_site(name, self, self.heads)

    def forward(self, x):  # (B, N, D)
        q, k, v = (lin(x).unflatten(-1, (self.heads, -1)).transpose(1, 2) for lin in (self.q, self.k, self.v))
        out = nn.functional.scaled_dot_product_attention(q, k, v)  # (B, H, N, d)
        return self.proj(out.transpose(1, 2).flatten(2))


class OwnModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.attn = nn.Linear(5, 12), OwnAttention()

    def token_entry(self):
        return attention.TokenEntry(self.attn, "BND")

    def forward(self, x):
        return self.attn(self.embed(x))


@pytest.mark.parametrize("variant", attention.VARIANTS)
def test_a_model_of_the_suite_takes_every_variant_through_the_interface(variant):
    torch.manual_seed(0)
    model, x = OwnModel(), torch.randn(2, 7, 5)
    before = model(x)
    attention.apply(model, variant)
    after = model(x)
    after.sum().backward()
    assert (variant == "standard") == torch.allclose(before, after)


# -- the config's _target_ is the path that builds it (house item 3) ---------------------------


def test_each_conf_attn_file_names_the_builder_that_builds_it():
    """`_target_` in conf/attn is no longer stripped and unused: it names one of the builders,
    and `compose.yaml` names compose."""
    from src.attention.config import BUILDERS

    conf = CONF / "attn"
    targets = {p.stem: OmegaConf.load(p)["_target_"] for p in conf.glob("*.yaml")}
    assert set(targets.values()) <= set(BUILDERS)
    assert targets["compose"] == "src.attention.compose"
    assert {t for name, t in targets.items() if name != "compose"} == {"src.attention.build"}


def test_the_target_decides_what_is_built_and_a_record_without_one_still_builds():
    from src.attention import Composition, variant_from_config

    one = {"_target_": "src.attention.build", "variant": "precond", "gain": True}
    assert variant_from_config(one).gain is True
    assert variant_from_config({k: v for k, v in one.items() if k != "_target_"}).gain is True
    parts = ["cond_init", "precond"]
    both = {"_target_": "src.attention.compose", "variant": "cond_init+precond", "parts": parts}
    assert isinstance(variant_from_config(both), Composition)
    assert isinstance(variant_from_config({"parts": ["cond_init", "precond"]}), Composition)
    with pytest.raises(AttentionConfigError, match=r"attn._target_='os.system' builds no attention variant"):
        variant_from_config({"_target_": "os.system", "variant": "precond"})
    with pytest.raises(AttentionConfigError, match=r"^unknown option\(s\) alpha for attention variant"):
        variant_from_config({**one, "alpha": 1})  # the variant's own one line, not wrapped


# -- every option reaches the built variant from the command line --------------------------------


def other_value(tp: Any, default: Any) -> Any:
    """A value of type ``tp`` that is not ``default``: what a command line would change it to."""
    choices = [a for a in get_args(tp) if a is not type(None)]
    if get_origin(tp) is Literal or (choices and get_origin(choices[0]) is Literal):
        options = get_args(tp) if get_origin(tp) is Literal else get_args(choices[0])
        return next(a for a in options if a != default)
    if tp is bool:
        return not default
    return default + 1 if tp is int else default * 0.5 + 0.25


@pytest.mark.parametrize(
    "variant", [name for name, cls in attention.VARIANTS.items() if dataclasses.fields(cls)]
)
def test_every_option_given_as_attn_key_value_reaches_the_built_variant(variant, tmp_path):
    """``attn=<variant> attn.<option>=<value>`` for every option at once (no ``+``): Hydra takes each
    key, and the variant the run builds holds each value, not its default."""
    from conftest import compose

    cls = attention.VARIANTS[variant]
    hints = typing.get_type_hints(cls)
    given = {f.name: other_value(hints[f.name], f.default) for f in dataclasses.fields(cls)}
    overrides = [f"attn.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in given.items()]
    built = attention.variant_from_config(compose([f"attn={variant}", *overrides], tmp_path).attn)
    assert built.options() == given
