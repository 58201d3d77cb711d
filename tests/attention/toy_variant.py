"""A toy variant for the composition and extension tests: ``W_O`` scaled by ``factor`` at
initialization (cond_init leaves ``W_O`` alone, so the two compose). Not registered here:
``test_compose`` registers it for one test, ``test_extension`` writes this file into a copy of
the suite as ``src/attention/scale_out.py`` with a ``register`` line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from src.attention.registry import Variant, register  # noqa: F401  register: see the docstring


@dataclass
class ScaleOut(Variant):
    name: ClassVar[str] = "scale_out"
    writes: ClassVar[dict[str, str]] = {"W_O": "init"}
    factor: float = 0.5

    @torch.no_grad()
    def modify(self, model, sites):
        for site in sites:
            site.out.weight.mul_(self.factor)


@dataclass
class ShiftHeads(Variant):
    """A second hook on the heads' output (what precond rewrites, ``P``): adds ``shift`` to it
    before the output projection, in a forward pre-hook on ``site.head_output``."""

    name: ClassVar[str] = "shift_heads"
    writes: ClassVar[dict[str, str]] = {"P": "hook"}
    shift: float = 0.25

    def modify(self, model, sites):
        for site in sites:
            site.head_output.register_forward_pre_hook(lambda module, args: (args[0] + self.shift, *args[1:]))
