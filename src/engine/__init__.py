"""The shared engine: :mod:`.loop` (what trains and evaluates a model) and :mod:`.record` (what a
run leaves in its folder), composed by :mod:`.experiment` (one run, :func:`train`) for the task
contract of :mod:`.task`. ``record`` imports nothing of ``loop``, and no file of the engine
imports one that imports it back (``tests/engine/test_layout.py``).

Importing this package imports no torch: :func:`train` and :func:`check_compatible` load
:mod:`.experiment` on first use, so that ``src.engine.schema`` (the trainer schema Hydra composes
with) answers config errors before the model's imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import schema  # noqa: F401  registers the trainer schema with Hydra (imports no torch)

if TYPE_CHECKING:
    from .experiment import check_compatible, train

__all__ = ["check_compatible", "train"]


def __getattr__(name: str) -> Any:
    """``train`` and ``check_compatible``, imported from :mod:`.experiment` when first asked for."""
    if name in __all__:
        from . import experiment

        return getattr(experiment, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
