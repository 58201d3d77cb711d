"""Reading the ``attn`` config group: one variant, or a composition of several.

Two forms, one per kind of file in ``conf/attn/``:

* one variant (``conf/attn/spectral.yaml``): ``{variant: spectral, mode: …, lam: …}``;
* a composition (``conf/attn/compose.yaml``): ``{variant: cond_init+spectral,
  parts: [cond_init, spectral], spectral: {lam: …}}``, see :mod:`.compose`.

Each file's ``_target_`` names the function that builds it (:data:`BUILDERS`): ``build`` for one
variant, ``compose`` for a composition. Everything that reads ``attn`` (the run, the detection
backbones, the summary, the report) goes through these functions, so the two forms are told
apart in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from .compose import Composition, compose, joined
from .registry import VARIANTS, AttentionConfigError, Variant, build


def as_dict(attn: Mapping[str, Any] | DictConfig | None) -> dict[str, Any]:
    """``attn`` as a plain dict, without Hydra's ``_``-keys (``_target_``)."""
    if attn is None:
        return {}
    plain = OmegaConf.to_container(attn, resolve=True) if isinstance(attn, DictConfig) else dict(attn)
    return {k: v for k, v in plain.items() if not str(k).startswith("_")}


def is_composition(attn: Mapping[str, Any] | DictConfig | None) -> bool:
    return attn is not None and "parts" in attn


def part_names(attn: Mapping[str, Any] | DictConfig) -> list[str]:
    """The variants ``attn`` applies, in order: ``["spectral"]`` or ``["cond_init", "spectral"]``."""
    return list(attn["parts"]) if is_composition(attn) else [attn["variant"]]


def attn_name(attn: Mapping[str, Any] | DictConfig) -> str:
    """``spectral`` or ``cond_init+spectral``."""
    return joined(part_names(attn))


def attn_options(attn: Mapping[str, Any] | DictConfig | None) -> dict[str, Any]:
    """The options, without ``variant`` and ``_``-keys: flat for one variant, per part
    (``{"cond_init": {…}, "spectral": {…}}``) for a composition."""
    options = as_dict(attn)
    options.pop("variant", None)
    options.pop("parts", None)
    return options


def variant_from_config(attn: Mapping[str, Any] | DictConfig | str | None) -> Variant | Composition:
    """What ``attention.apply`` takes for ``attn``: a config of either form, a variant's name, or
    None (``standard``)."""
    if attn is None or isinstance(attn, str):
        return build(attn or "standard")
    if _builder(attn) is compose:
        return compose(list(attn.get("parts") or []), **attn_options(attn))
    return build(attn_name(attn), **attn_options(attn))


BUILDERS = {"src.attention.build": build, "src.attention.compose": compose}


def _builder(attn: Mapping[str, Any] | DictConfig):
    """The function the config's ``_target_`` names (``src.attention.build`` for one variant,
    ``src.attention.compose`` for a composition): the path that builds it, called here with the
    variant's name and options rather than through ``hydra.utils.instantiate``, which would wrap
    an unknown option's one-line error in its own. A config without ``_target_`` (a record
    written by hand, a dict in a test) takes its form's builder (``compose`` when it names
    ``parts``); a ``_target_`` that is not one of :data:`BUILDERS` is refused, as it would build
    something other than an attention variant."""
    target = attn.get("_target_")
    if target is None:
        return compose if is_composition(attn) else build
    if target not in BUILDERS:
        raise AttentionConfigError(
            f"attn._target_={target!r} builds no attention variant; use one of {', '.join(BUILDERS)}"
        )
    return BUILDERS[target]


def complete(attn: DictConfig) -> Variant | Composition:
    """Check ``attn`` and fill in, for a composition, every part's options with its defaults, so
    that the record names every option of every part; returns what ``attention.apply`` takes.
    Fails (``AttentionConfigError``) before any work on an unknown part or option, or a conflict."""
    built = variant_from_config(attn)
    if isinstance(built, Composition):
        with open_dict(attn):
            for name, options in built.options().items():  # in the order of attn.parts
                attn.pop(name, None)
                attn[name] = options
    return built


def changed_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options that differ from the variant's defaults (its dataclass fields), flat and in
    order: ``{"mode": "svd"}`` for ``spectral``; ``{"spectral.lam": 1.0}`` for a composition
    (``name`` ``cond_init+spectral``, ``options`` per part, as :func:`attn_options` gives them).
    Run names, the report's variant column and the dashboard's groups say a variant this way;
    a variant not installed here keeps all its options."""
    parts = name.split("+")
    per_part = {p: options.get(p) or {} for p in parts} if len(parts) > 1 else {name: options}
    changed = {}
    for part, given in per_part.items():
        cls = VARIANTS.get(part)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)} if cls else {}
        prefix = f"{part}." if len(parts) > 1 else ""
        for key, value in given.items():
            if key in ("variant", "parts") or key.startswith("_"):
                continue
            if key not in defaults or defaults[key] != value:
                changed[prefix + key] = value
    return changed
