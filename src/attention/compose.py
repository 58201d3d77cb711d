"""Several attention variants on one model, applied in a declared order.

``attn=compose attn.parts=[cond_init,spectral]`` conditions the initialization, then adds
spectral's correction. Each part keeps its own options under its name
(``+attn.spectral.lam=1``); parts not set take their variant's defaults, and the run's record
holds every option of every part.

Why a ``compose`` config and not Hydra's list selection (``attn=[cond_init,spectral]``):
Hydra merges the selected files into one ``attn`` node, so the parts' options would share one
namespace (``detach`` is an option of precond, spectral and cond_tokens) and the order would be
lost. A composition is therefore one config of its own, whose ``parts`` name the variants in
order and whose per-part options nest under their names.

Two parts cannot compose when they change the same thing in conflicting ways (each variant
declares what it changes in :meth:`Variant.touches`). On one target, a later part may only
build on an earlier one: a parametrization or a hook over an initialization, a hook over a
parametrization, a hook over a hook (PyTorch chains hooks: the later one receives what the earlier
returned, so ``attn.parts=[precond,my_hook]`` runs ``my_hook(precond(·))``). Two initializations
(the later overwrites the earlier), two parametrizations of one target, or an initialization after
a parametrization, fail before any work, naming both parts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from .registry import AttentionConfigError, Variant, build

#: ``(earlier, later)`` ways of changing one target that compose.
COMPOSABLE = {("init", "parametrize"), ("init", "hook"), ("parametrize", "hook"), ("hook", "hook")}
VERB = {"init": "initializes", "parametrize": "parametrizes", "hook": "rewrites in its forward hook"}


@dataclass(frozen=True)
class Composition:
    """Variants applied in order (``attention.apply`` applies each part)."""

    parts: tuple[Variant, ...]

    @property
    def name(self) -> str:
        return joined(p.name for p in self.parts)

    def options(self) -> dict[str, dict[str, Any]]:
        return {p.name: p.options() for p in self.parts}


def joined(names: Iterable[str]) -> str:
    """``cond_init+spectral``: a composition's name, in the run folder, tables and W&B."""
    return "+".join(names)


def compose(parts: Iterable[str], variant: str | None = None, **options: Mapping[str, Any]) -> Composition:
    """The composition of ``parts`` (variant names, in order), each built with its ``options``;
    fails when a name repeats, options name a variant that is not a part, or two parts conflict.
    ``variant`` (the config's derived name) is accepted and ignored."""
    names = list(parts)
    if not names:
        raise AttentionConfigError("attn=compose needs attn.parts, e.g. attn.parts=[cond_init,spectral]")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise AttentionConfigError(
            f"attn.parts={names} names {', '.join(repeated)} twice; a variant applies once"
        )
    strays = sorted(set(options) - set(names))
    if strays:
        raise AttentionConfigError(
            f"attn has options for {', '.join(strays)}, which attn.parts={names} does not name; "
            f"add it to attn.parts or drop its options"
        )
    built = tuple(build(n, **dict(options.get(n) or {})) for n in names)
    check_composable(built)
    return Composition(built)


def check_composable(parts: tuple[Variant, ...]) -> None:
    """Raise :class:`AttentionConfigError` naming the first pair of parts that conflict."""
    for i, later in enumerate(parts):
        for earlier in parts[:i]:
            mine, theirs = earlier.touches(), later.touches()
            for target in sorted(set(mine) & set(theirs)):
                pair = (mine[target], theirs[target])
                if pair not in COMPOSABLE:
                    fix = "swap them in attn.parts" if pair[::-1] in COMPOSABLE else "drop one of them"
                    raise AttentionConfigError(
                        f"attn.parts: {earlier.name} and {later.name} cannot compose: {earlier.name} "
                        f"{VERB[pair[0]]} {target} and {later.name} then {VERB[pair[1]]} it too; {fix}"
                    )


OmegaConf.register_new_resolver("attn_parts", lambda parts: joined(parts), replace=True)
