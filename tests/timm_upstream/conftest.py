"""A pytest plugin that runs timm's own model tests on models with an attention variant applied.

Loaded by ``tests/timm_upstream/run.py`` into a pytest session over ``tests/test_models.py`` of
timm's source distribution (the installed version); inert anywhere else: the suite's own
pytest run never collects this folder (``norecursedirs`` in ``pyproject.toml``), and without a
variant (``--variant`` or ``TIMM_UPSTREAM_VARIANT``) the plugin changes nothing.

With a variant, before timm's test module is imported:

* ``timm.create_model`` (and the names timm re-exports it under) applies the variant to every
  model it creates, ``features_only`` wrappers and the meta device included;
* ``timm.list_models``/``list_pretrained`` keep one name per tiny model of the suite's families
  (``Family.timm_name`` in ``src/attention/timm_families.py``), so the parametrised tests run
  on those models only;
* only the generic per-model tests (:data:`GENERIC_TESTS`) are kept; the TorchScript ones are
  skipped (:data:`NO_TORCHSCRIPT`).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = "TIMM_UPSTREAM_VARIANT"

#: timm's per-model tests this runner keeps: forward, backward, the config checks on the meta
#: device, feature extraction, forward_intermediates, FX forward/backward, and TorchScript
#: (the last two skipped).
GENERIC_TESTS = (
    "test_model_forward",
    "test_model_backward",
    "test_model_default_cfgs",
    "test_model_default_cfgs_non_std",
    "test_model_forward_features",
    "test_model_forward_intermediates_features",
    "test_model_forward_intermediates",
    "test_model_forward_fx",
    "test_model_backward_fx",
    "test_model_forward_torchscript",
    "test_model_forward_fx_torchscript",
)
NO_TORCHSCRIPT = (
    "TorchScript is not supported: torch deprecates it, and the variants' forward hooks (bound "
    "methods of their conditioner modules) and torch.nn.utils.parametrize cannot be scripted"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--variant", default=os.environ.get(ENV), help=f"attention variant to apply (env {ENV})")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timeout(seconds): pytest-timeout's marker (timm's tests use it)")
    variant = config.getoption("--variant")
    if not variant:
        return
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import timm
    import timm.models

    from src import attention
    from src.attention.timm_families import FAMILIES

    attention.build(variant)  # an unknown variant fails here, listing the valid ones
    tiny = {f.timm_name for f in FAMILIES.values() if f.timm_name}
    config.stash[_TINY] = tiny
    create = functools.partial(_create_with_variant, timm.models._factory.create_model, variant)
    for module in (timm, timm.models, timm.models._factory):
        module.create_model = create
    for name in ("list_models", "list_pretrained"):
        for module in (timm, timm.models):
            setattr(module, name, _tiny_only(getattr(timm.models._registry, name), tiny))


def _create_with_variant(create: Callable, variant: str, *args, **kwargs):
    """``timm.create_model`` with ``variant`` applied to what it returns."""
    from src import attention

    return attention.apply(create(*args, **kwargs), variant)


def _tiny_only(listing: Callable[..., list[str]], tiny: set[str]) -> Callable[..., list[str]]:
    """``listing`` (``list_models``) restricted to one name (tag) per model in ``tiny``."""

    @functools.wraps(listing)
    def listed(*args, **kwargs) -> list[str]:
        kept: dict[str, str] = {}
        for name in listing(*args, **kwargs):
            base = name.split(".")[0]
            if base in tiny:
                kept.setdefault(base, name)
        return list(kept.values())

    return listed


_TINY = pytest.StashKey[set]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the generic per-model tests on the tiny models; skip their TorchScript ones."""
    tiny = config.stash.get(_TINY, None)
    if tiny is None:
        return
    kept, dropped = [], []
    for item in items:
        name = getattr(item, "originalname", item.name)
        model = getattr(getattr(item, "callspec", None), "params", {}).get("model_name", "")
        if name in GENERIC_TESTS and model.split(".")[0] in tiny:
            if "torchscript" in name:
                item.add_marker(pytest.mark.skip(reason=NO_TORCHSCRIPT))
            kept.append(item)
        else:
            dropped.append(item)
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept
