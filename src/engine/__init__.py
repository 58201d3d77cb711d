"""The shared engine: the loop, checkpoints, the run record, seeding and processes."""

from .experiment import check_compatible, train

__all__ = ["check_compatible", "train"]
