"""A run's floating-point modes: on a CPU whether denormal floats are flushed to zero, on a CUDA
GPU whether fp32 matmuls and convolutions use TF32.

x86 cores compute with denormal (subnormal) floats many times slower than with normal ones. A
variant that saturates the softmax (``spectral`` at lam=10) fills attention's backward with
them: measured on ViT-S, 2 cores, ``spectral`` ran 1.05× ``standard`` with denormals and 1.00×
with them flushed (``python -m launch.tools.bench --no-flush-denormal``). Flushing changes only values
below 1.2e-38 in fp32, far under any gradient that moves a weight. GPUs compute with denormals
at full speed, so the switch only acts on a CPU; ``trainer.flush_denormal`` turns it off.

TF32 (:func:`use_tf32`): on a CUDA device an fp32 run's matmuls and convolutions use TensorFloat-32
(``torch.set_float32_matmul_precision("high")`` and cuDNN's ``allow_tf32``), as timm's ``train.py``
does: Ampere and later GPUs run them several times faster with a 10-bit mantissa, which training
tolerates (NVIDIA's and PyTorch's guidance). It changes an fp32 GPU run's bits, not its recipe, as
the device does. What needs full fp32 asks for it: the Grams the variants factorise are float64
(:mod:`src.attention.polar`), and the conditioning statistics compute with TF32 off
(:func:`src.conditioning.precision.full_fp32`). A bf16 run's autocast leaves few matmuls in fp32.

The run's autocast (:func:`run_autocast`): ``trainer.precision`` read one way by the trainer and by
``python -m src.eval``, so a checkpoint is evaluated in the precision it was trained in.
"""

from __future__ import annotations

import torch


def flushing_denormals() -> bool:
    """Whether this process flushes denormal floats to zero now (torch has no getter)."""
    tiny = torch.tensor([1e-30], dtype=torch.float32)  # normal; times 1e-10 it is denormal
    return bool((tiny * 1e-10).item() == 0.0)


def flush_denormals(enabled: bool) -> bool:
    """Flush denormals to zero from now on when ``enabled`` (and the CPU supports it), else
    keep them; returns the previous mode, to restore with another call."""
    previous = flushing_denormals()
    torch.set_flush_denormal(enabled)
    return previous


def use_tf32(device: torch.device) -> tuple[str, bool] | None:
    """TF32 for fp32 matmuls and cuDNN convolutions when ``device`` is a CUDA device; returns the
    previous ``(matmul precision, cuDNN allow_tf32)`` for :func:`restore_tf32`, or None on any other
    device, where nothing is touched."""
    if device.type != "cuda":
        return None
    previous = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    return previous


def restore_tf32(previous: tuple[str, bool] | None) -> None:
    """Put back what :func:`use_tf32` returned (nothing for None)."""
    if previous is not None:
        torch.set_float32_matmul_precision(previous[0])
        torch.backends.cudnn.allow_tf32 = previous[1]


def run_autocast(device: torch.device, precision: str) -> torch.autocast:
    """The autocast a run's forward passes enter for ``trainer.precision``: bf16 on ``device``'s
    type for ``bf16`` (CPU and GPU), disabled for ``fp32``. Reusable: each ``with`` enters it anew."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
