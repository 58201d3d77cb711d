"""The attention variants, discovered and registered by name, and ``apply`` to put one into a model.

>>> import timm
>>> from src import attention
>>> model = attention.apply(timm.create_model("vit_tiny_patch16_224"), "spectral", mode="svd")

``VARIANTS`` maps each name to its class (its dataclass fields are its options), in table order
(:attr:`Variant.rank`). A new variant is one module in this package with a ``@register``-ed
:class:`Variant`, and one config ``conf/attn/<name>.yaml``: every module here is imported when
the package is, so nothing else names it. A variant that lives in another package registers
through the entry-point group ``conditioned_attention.variants`` (its config joins through
``hydra.searchpath``); see docs/extending.md.

May import: ``src.attention``, ``src.errors``.
"""

import importlib
import pkgutil
from importlib.metadata import entry_points

from .compose import Composition, compose
from .config import attn_name, attn_options, part_names, variant_from_config
from .registry import (
    VARIANTS,
    AttentionConfigError,
    Variant,
    apply,
    build,
    find_sites,
    find_token_entry,
    register,
)
from .sites import AttentionSite, Projection, TokenEntry

ENTRY_POINTS = "conditioned_attention.variants"


def discover() -> None:
    """Import every module of this package, then every installed plugin's (entry points): each
    ``@register`` adds its variant to ``VARIANTS``. Importing twice is a no-op."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    for plugin in entry_points(group=ENTRY_POINTS):
        plugin.load()


discover()

__all__ = [
    "VARIANTS",
    "AttentionConfigError",
    "AttentionSite",
    "Composition",
    "Projection",
    "TokenEntry",
    "Variant",
    "apply",
    "attn_name",
    "attn_options",
    "build",
    "compose",
    "discover",
    "find_sites",
    "find_token_entry",
    "part_names",
    "register",
    "variant_from_config",
]
