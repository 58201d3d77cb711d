"""The variant registry and ``apply``: one function that conditions any supported model.

A variant is a dataclass whose fields are its options (docs/methods.md#variants) and
whose ``modify`` method changes a model at the sites it finds. ``@register`` adds it to
``VARIANTS`` under its ``name``; adding a variant touches its own module and its
``conf/attn/<name>.yaml``, nothing else: :func:`src.attention.discover` imports every module of
the package (and every plugin's, by entry point) when the package is imported.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, ClassVar, Literal, get_args, get_origin

from torch import nn

from src.errors import SuiteError

from .sites import AttentionSite, TokenEntry, Where
from .timm_families import ADAPTERS, timm_token_entry

VARIANTS: dict[str, type[Variant]] = {}


class AttentionConfigError(SuiteError, ValueError):
    """An attention variant, option or model that cannot be used, with what to do instead."""


@dataclasses.dataclass
class Variant:
    """Base of the attention variants: fields are options, checked on construction."""

    name: ClassVar[str] = ""
    #: Where the variant's row goes in tables (``VARIANTS`` is sorted by it, then by name): the
    #: baseline first, then the papers' variants; a new variant without one comes after them.
    rank: ClassVar[int] = 100
    #: What the variant changes and how, for composing variants (:mod:`.compose`): weights
    #: ``W_Q``, ``W_K``, ``W_V``, ``W_O``, the head output ``P``, the embedded tokens ``X``; each
    #: ``init`` (written once), ``parametrize`` (recomputed each forward) or ``hook`` (an
    #: activation changed each forward). A variant whose targets depend on its options
    #: overrides :meth:`touches`.
    writes: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            setattr(self, f.name, _checked(self.name, f.name, getattr(self, f.name), hints[f.name]))

    def modify(self, model: nn.Module, sites: list[AttentionSite]) -> None:
        """Change ``model`` in place at ``sites``; every variant overrides this."""
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def touches(self) -> dict[str, str]:
        """``{"W_Q": "init", …}``: what this variant, with its options, changes and how."""
        return dict(self.writes)

    def collapse_cause(self) -> str:
        """What, among this variant's options, can make the softmax one-hot at init; the collapse
        guard (:mod:`src.conditioning.collapse`) names it. A variant that knows overrides this."""
        shown = ", ".join(f"attn.{k}={v}" for k, v in self.options().items()) or "no options"
        return f"attn={self.name} ({shown})"

    @classmethod
    def describe_options(cls) -> str:
        """``mode: 'identity' | 'svd' = 'identity', lam: float = 10.0`` (for error messages)."""
        hints = typing.get_type_hints(cls)
        parts = [f"{f.name}: {_type_name(hints[f.name])} = {f.default!r}" for f in dataclasses.fields(cls)]
        return ", ".join(parts) or "(none)"


def register(cls: type[Variant]) -> type[Variant]:
    """Class decorator: make ``cls`` available as ``apply(model, cls.name)``."""
    if not cls.name or cls.name in VARIANTS:
        raise ValueError(f"variant {cls.__name__} needs a unique `name`, got {cls.name!r}")
    VARIANTS[cls.name] = cls
    ordered = sorted(
        VARIANTS.items(), key=lambda item: (item[1].rank, item[0])
    )  # import order is not table order
    VARIANTS.clear()
    VARIANTS.update(ordered)
    return cls


def build(variant: str, **options: Any) -> Variant:
    """The variant ``variant`` with ``options``; unknown names or options fail, listing the valid ones."""
    if variant not in VARIANTS:
        raise AttentionConfigError(
            f"unknown attention variant {variant!r}; valid variants: {', '.join(VARIANTS)}"
        )
    cls = VARIANTS[variant]
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise AttentionConfigError(
            f"unknown option(s) {', '.join(unknown)} for attention variant {variant!r}; "
            f"valid options: {cls.describe_options()}"
        )
    return cls(**options)


def apply(model: nn.Module, variant: str | Variant, **options: Any) -> nn.Module:
    """Apply an attention variant to ``model`` in place and return it.

    ``variant`` is a name from ``VARIANTS`` (with its options as keywords), a built
    :class:`Variant`, or a :class:`~.compose.Composition` (its parts applied in order). The
    applied variants are recorded in ``model.attention_variants``.
    """
    parts = getattr(variant, "parts", None)  # a Composition: checked when it was built
    if parts is not None:
        for part in parts:
            apply(model, part)
        return model
    if isinstance(variant, Variant):
        if options:
            raise AttentionConfigError("pass options either to the Variant or to apply(), not both")
        chosen = variant
    else:
        chosen = build(variant, **options)
    applied = getattr(model, "attention_variants", ())
    if any(v.name == chosen.name for v in applied):
        raise AttentionConfigError(f"attention variant {chosen.name!r} is already applied to this model")
    sites = find_sites(model)
    if not sites:
        raise AttentionConfigError(no_sites_message(model))
    chosen.modify(model, sites)
    model.attention_variants = (*applied, chosen)
    return model


def no_sites_message(model: nn.Module) -> str:
    """One line for a model without any attention module the variants know: what it is, each
    supported attention class once (with the families that use it), and the supported timm model
    whose name is closest to the model's own timm name (its ``pretrained_cfg["architecture"]``,
    set by ``timm.create_model``; else its class name): a cheap rule, by name only."""
    from .timm_families import nearest_supported, supported_attention

    arch = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    named = f"{type(model).__name__} ({arch})" if arch else type(model).__name__
    nearest = nearest_supported(arch or type(model).__name__.lower())
    hint = f"; the nearest supported timm model by name: {nearest}" if nearest else ""
    return (
        f"no attention module the variants know in {named}: supported are {supported_attention()}, "
        f"and any module that defines attention_site(name) -> AttentionSite{hint}"
    )


def find_sites(model: nn.Module) -> list[AttentionSite]:
    """Every attention module of ``model``, in module order."""
    sites = []
    for name, module in model.named_modules():
        if callable(getattr(module, "attention_site", None)):
            sites.append(module.attention_site(name))
        elif type(module) in ADAPTERS:  # a live dict: every registered family's attention classes
            sites.append(ADAPTERS[type(module)](name, module))
    return sites


def find_token_entry(model: nn.Module, where: Where = "block") -> TokenEntry:
    """Where the embedded tokens of ``model`` can be read and replaced: at the input of the first
    transformer layer (``where="block"``), or as the token embeddings before positions and class
    token join (``"embed"``).

    A model's own ``token_entry(where)`` comes first; one that takes no argument describes its
    block entry only (``launch/tools/bench.py``'s).
    """
    if where not in ("embed", "block"):
        raise AttentionConfigError(f"token entry where={where!r} must be 'embed' or 'block'")
    method = getattr(model, "token_entry", None)
    if callable(method):
        if "where" in inspect.signature(method).parameters:
            return method(where)
        if where == "block":
            return method()
        raise AttentionConfigError(
            f"{type(model).__name__}.token_entry() takes no `where`: it names the first layer's input "
            "only; use attn.where=block, or give it token_entry(where) for the embeddings"
        )
    entry = timm_token_entry(model, where)  # timm's features_only wrappers included
    if entry is None:
        from .timm_families import supported_models  # the registered families name themselves

        raise AttentionConfigError(
            f"cannot find the {where} token entry of {type(model).__name__}: supported are "
            f"{supported_models()} (the families of src/attention/timm_families.py), "
            "and any model that defines token_entry(where) -> TokenEntry"
        )
    return entry


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _checked(variant: str, option: str, value: Any, tp: Any) -> Any:
    """``value`` if it fits the option's type (ints widen to floats), else a clear error."""
    ok = True
    if get_origin(tp) is Literal:
        ok = value in get_args(tp)
    elif tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    if not ok:
        raise AttentionConfigError(
            f"attention variant {variant!r}: option {option}={value!r} must be {_type_name(tp)}"
        )
    return value
