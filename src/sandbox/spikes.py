"""Loss-spike detection, and what to log at a spike: gradient norms and the norms' curvature.

P5 sees loss spikes come with gradient-norm spikes, caused by the curvature of the
normalization (and feed-forward) layers: where a norm's input nears the origin its
Jacobian's largest eigenvalue ``1/(rms(x) + eps)`` explodes. :class:`SpikeDetector` flags
the steps whose training loss exceeds ``factor`` times the running median of the previous
``window`` losses; :func:`grad_norms` and :func:`norm_jacobian_max` give the numbers to log
beside each. The detector's state is plain floats, so a checkpoint can carry it. The norms'
curvature is measured in fp32 whatever the run's precision (:func:`src.conditioning.precision.full_fp32`).
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any

import torch
from torch import Tensor, nn

from src.conditioning.precision import as_fp32, full_fp32


class SpikeDetector:
    """Flags a loss above ``factor × max(median of the last window losses, floor)``.

    Args:
        factor: how many times the running median a loss must exceed.
        window: how many previous losses the median runs over.
        min_history: losses needed before anything is flagged (default: ``window``), so
            the first steps of training (a falling loss) are never compared with too few.
        floor: a lower bound on the median, so that the ordinary batch-to-batch noise of
            a loss already near zero (``1e-4`` against a median ``1e-5``) is not a spike.
    """

    def __init__(
        self, factor: float = 3.0, window: int = 100, min_history: int | None = None, floor: float = 0.0
    ) -> None:
        if factor <= 1 or window < 1:
            raise ValueError(f"spike detection needs factor > 1 and window ≥ 1, got {factor}, {window}")
        self.factor, self.window, self.floor = factor, window, floor
        self.min_history = window if min_history is None else min_history
        self.history: deque[float] = deque(maxlen=window)

    def update(self, loss: float) -> dict[str, float] | None:
        """Add the next step's loss; ``{"spike/loss", "spike/median", "spike/ratio"}`` when it is a spike."""
        spike = None
        if len(self.history) >= self.min_history:
            median = max(statistics.median(self.history), self.floor)
            if loss > self.factor * median:
                spike = {"spike/loss": loss, "spike/median": median, "spike/ratio": loss / median}
        self.history.append(loss)
        return spike

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = deque(state["history"], maxlen=self.window)


def module_of(parameter_name: str) -> str:
    """The module that owns a parameter: ``mlp.fc1.bias -> mlp.fc1``; ``pos_emb -> pos_emb``.

    A parametrized weight (``qkv.parametrizations.weight.original``) belongs to ``qkv``.
    """
    name = parameter_name.replace(".parametrizations.weight.original", ".weight")
    return name.rsplit(".", 1)[0] if "." in name else name


def grad_norms(model: nn.Module) -> dict[str, float]:
    """The gradient norm of each module (its parameters together) and of the whole model."""
    groups: dict[str, list[Tensor]] = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            groups.setdefault(module_of(name), []).append(p.grad.detach())
    if not groups:
        return {}
    flat = [g for gs in groups.values() for g in gs]
    squares = torch.stack(torch._foreach_norm(flat)).double().pow(2).tolist()
    out, i = {}, 0
    for module, gs in groups.items():
        out[module] = sum(squares[i : i + len(gs)]) ** 0.5
        i += len(gs)
    out["total"] = sum(squares) ** 0.5
    return out


@torch.no_grad()
def norm_jacobian_max(model: nn.Module, *inputs: Any) -> dict[str, float]:
    """For each module with a ``jacobian_max(x)`` method (the sandbox's RMSNorm), the largest
    eigenvalue of its Jacobian over every row it sees in one forward pass of ``inputs``, in fp32
    with autocast off."""
    seen: dict[str, float] = {}
    handles = [
        module.register_forward_pre_hook(
            lambda m, a, n=name: seen.__setitem__(n, max(seen.get(n, 0.0), m.jacobian_max(a[0]).max().item()))
        )
        for name, module in model.named_modules()
        if callable(getattr(module, "jacobian_max", None))
    ]
    try:
        with full_fp32():
            model(*as_fp32(inputs))
    finally:
        for h in handles:
            h.remove()
    return seen
