"""The norms' curvature the sandbox logs (``norm_jacobian/<norm>``) is RMSNorm's closed form.

For ``y = x / (ρ + ε)``, ``ρ = rms(x)``: ``J = (I − x xᵀ / (D ρ (ρ + ε))) / (ρ + ε)``, symmetric,
``1/(ρ + ε)`` on every direction orthogonal to ``x`` and ``ε/(ρ + ε)²`` along ``x``; its
spectral norm is ``1/(ρ + ε)`` (the sandbox's norms have no gain). Checked against autograd on
the inputs each norm of both sandbox models actually sees in a forward pass.
"""

from __future__ import annotations

import pytest
import torch

from src.models.sandbox import ClusteringHead, MultiHeadSandbox, RMSNorm
from src.sandbox.spikes import norm_jacobian_max


def inputs_seen(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every row each RMSNorm of ``model`` normalizes in one forward pass of ``x``."""
    seen: dict[str, torch.Tensor] = {}
    norms = {n: m for n, m in model.named_modules() if isinstance(m, RMSNorm)}
    handles = [
        m.register_forward_pre_hook(lambda m, a, n=n: seen.__setitem__(n, a[0])) for n, m in norms.items()
    ]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return {n: t.reshape(-1, t.shape[-1]) for n, t in seen.items()}


@pytest.mark.parametrize(
    "model",
    [ClusteringHead(2, 12), MultiHeadSandbox(2, 12, depth=2), MultiHeadSandbox(3, 12, dim=4, depth=1)],
)
def test_the_logged_norm_curvature_is_the_jacobians_spectral_norm(model):
    torch.manual_seed(0)
    model = model.double()
    p = model.token_emb.weight.shape[0]
    x = torch.randint(0, p, (8, 12), generator=torch.Generator().manual_seed(1))
    logged = norm_jacobian_max(model, x)
    seen = inputs_seen(model, x)
    assert set(logged) == set(seen) and len(seen) >= 2
    for name, rows in seen.items():
        norm = dict(model.named_modules())[name]
        top = 0.0
        for row in rows:
            jac = torch.autograd.functional.jacobian(norm, row)
            top = max(top, torch.linalg.matrix_norm(jac, ord=2).item())  # largest singular value
            rho = row.pow(2).mean().sqrt()
            # along x the slope is ε/(ρ + ε)², orthogonal to x it is 1/(ρ + ε): the closed form
            torch.testing.assert_close(
                jac @ row, norm.eps / (rho + norm.eps) ** 2 * row, rtol=1e-9, atol=1e-12
            )
            ortho = torch.linalg.svd(row[None]).Vh[1]  # a unit direction orthogonal to x
            torch.testing.assert_close(jac @ ortho, ortho / (rho + norm.eps), rtol=1e-9, atol=1e-12)
        assert logged[name] == pytest.approx(top, rel=1e-9), name
