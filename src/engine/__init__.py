"""The shared engine: :mod:`.loop` (what trains and evaluates a model) and :mod:`.record` (what a
run leaves in its folder), composed by :mod:`.experiment` (one run, :func:`train`) for the task
contract of :mod:`.task`. ``record`` imports nothing of ``loop``, and no file of the engine
imports one that imports it back (``tests/engine/test_layout.py``).

Importing this package imports no torch: :func:`train` loads :mod:`.experiment` on first use
(:func:`check_compatible` loads the torch-free :mod:`.compatible`), so that the command line checks
a config (``src/precheck.py``, with the trainer schema of :mod:`.schema`) before the model's imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import schema  # noqa: F401  registers the trainer schema with Hydra (imports no torch)

if TYPE_CHECKING:
    from .compatible import check_compatible
    from .experiment import train

__all__ = ["check_compatible", "train"]


def __getattr__(name: str) -> Any:
    """``train`` (from :mod:`.experiment`, which imports torch) and ``check_compatible`` (from
    :mod:`.compatible`, which does not), imported when first asked for."""
    if name == "train":
        from .experiment import train

        return train
    if name == "check_compatible":
        from .compatible import check_compatible

        return check_compatible
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
