"""The collapse guard: a run whose attention is one-hot at init says so, once, before training.

A softmax whose logits are scaled far up (``spectral`` with ``lam = 10`` on both ``W_Q`` and
``W_K`` scales them by about ``lam²``) makes every query attend to a single key: ``P`` is a
permutation (usually the identity), its normalised row entropy is 0, and ``κ(P) = 1``, the best
κ there is. A table of κ alone would reward that collapse; the guard and the report's entropy
column are there so that nobody does.

The guard reads ``entropy/P/median`` from the conditioning monitor's init row (the median over
every site, head and row of ``H(P_i) / log(keys_i)``: 1 uniform, 0 one-hot) and, below the
threshold (``trainer.collapse_entropy``, default 0.05), returns one warning naming the variant
and the option that causes it (:meth:`src.attention.Variant.collapse_cause`).
"""

from __future__ import annotations

from collections.abc import Sequence

ENTROPY_KEY = "entropy/P/median"


def collapse_warning(values: dict[str, float], variants: Sequence, threshold: float) -> str | None:
    """The warning for monitor ``values`` taken at init, or ``None`` when the attention is open
    (or the monitor read no ``P``: a model whose attention modules have no explicit path)."""
    entropy = values.get(ENTROPY_KEY)
    if entropy is None or entropy >= threshold:
        return None
    applied = [v for v in variants if v.name != "standard"]
    cause = "; ".join(v.collapse_cause() for v in applied) or "the model's own initialization"
    return (
        f"attention is collapsed at init: median attention entropy {entropy:.3f} < {threshold:g} "
        f"(trainer.collapse_entropy), every query attends to about one key and κ(P) ≈ 1 says nothing "
        f"good. Cause: {cause}."
    )
