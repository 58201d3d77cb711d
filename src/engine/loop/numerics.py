"""The CPU's floating-point mode for a run: whether denormal floats are flushed to zero.

x86 cores compute with denormal (subnormal) floats many times slower than with normal ones. A
variant that saturates the softmax (``spectral`` at lam=10) fills attention's backward with
them: measured on ViT-S, 2 cores, ``spectral`` ran 1.05× ``standard`` with denormals and 1.00×
with them flushed (``python -m launch.bench --no-flush-denormal``). Flushing changes only values
below 1.2e-38 in fp32, far under any gradient that moves a weight. GPUs compute with denormals
at full speed, so the switch only acts on a CPU; ``trainer.flush_denormal`` turns it off.
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
