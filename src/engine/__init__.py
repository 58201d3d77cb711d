"""The shared engine: the loop, checkpoints, the run record, seeding and processes.

Importing the package imports no torch: ``train`` and ``check_compatible`` load on first use, so
the command line checks a config (``src/cli.py``) before paying for the model code."""

from . import schema  # noqa: F401  registers the trainer schema with Hydra

__all__ = ["check_compatible", "train"]


def __getattr__(name: str):
    if name == "train":
        from .experiment import train

        return train
    if name == "check_compatible":
        from .compatible import check_compatible

        return check_compatible
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
