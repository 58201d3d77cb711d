"""The attention variants, registered by name, and ``apply`` to put one into a model.

>>> import timm
>>> from src import attention
>>> model = attention.apply(timm.create_model("vit_tiny_patch16_224"), "spectral", mode="svd")

``VARIANTS`` maps each name to its class (its dataclass fields are its options). A new
variant is one module here with a ``@register``-ed :class:`Variant`, imported below.
"""

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

# Registration order is the order of VARIANTS: the baseline first, the papers' variants, MI.
from . import standard, precond, spectral, cond_init, cond_tokens, mimetic  # noqa: E402,F401  isort: skip

__all__ = [
    "VARIANTS",
    "AttentionConfigError",
    "AttentionSite",
    "Projection",
    "TokenEntry",
    "Variant",
    "apply",
    "build",
    "find_sites",
    "find_token_entry",
    "register",
]
