"""The shared engine: the loop, checkpoints, the run record, seeding and processes."""

from . import schema  # noqa: F401  registers the trainer schema with Hydra
from .experiment import check_compatible, train

__all__ = ["check_compatible", "train"]
