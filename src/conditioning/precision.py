"""Conditioning statistics in full fp32, whatever precision the caller trains in.

A condition number is a ratio of the largest to the smallest singular value, and the smallest is
what low precision loses first: under bf16 autocast (8 bits of mantissa) the monitor's forward moved
κ(P) by ×0.25 to ×4.9 and κ(A) by ×0.7–0.85 at init on ViT-Ti against fp32, and on digits at step 0
a ``trainer.precision=bf16`` run logged κ(P) 3.9e18 against fp32's 4.6e6 (issue 38). TF32 matmuls
(10 bits, which the loop turns on for fp32 runs on CUDA, :mod:`src.engine.loop.numerics`) would move
them too. So every statistic the suite logs about a model's conditioning, the conditioning monitor's
and the sandbox's probes (the norms' curvature, the snapshots), computes under :func:`full_fp32`:
autocast off on every device, TF32 off, reduced-precision floating inputs made float32. Its numbers
then mean the same on a GPU run in bf16 as on a CPU run in fp32, up to fp32 kernels' own rounding.
The guarantee sits in the statistics themselves, so that every caller (the shared loop, detection's
hook, ``python -m src.eval``, a notebook) gets it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

#: the device types whose autocast :func:`full_fp32` turns off (those this build knows)
AUTOCAST_DEVICES = tuple(d for d in ("cpu", "cuda") if torch.amp.is_autocast_available(d))
REDUCED = (torch.float16, torch.bfloat16)


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """Inside: no autocast on any device (an enclosing ``torch.autocast`` included) and fp32 matmuls
    and convolutions in IEEE fp32 (TF32 off, through the same switches the loop sets); the switches
    are restored on leaving."""
    matmul, conv = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
        with contextlib.ExitStack() as stack:
            for device in AUTOCAST_DEVICES:
                stack.enter_context(torch.autocast(device, enabled=False))
            yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = conv


def as_fp32(obj: Any) -> Any:
    """``obj`` with every float16/bfloat16 tensor made float32 (tuples, lists and dicts walked):
    a bf16 batch meets the fp32 weights as fp32."""
    if isinstance(obj, Tensor):
        return obj.float() if obj.dtype in REDUCED else obj
    if isinstance(obj, dict):
        return {k: as_fp32(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(as_fp32(v) for v in obj)
    return obj
