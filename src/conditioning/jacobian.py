"""The Jacobian of one attention head with respect to its weights, and the bound on its κ.

One head: ``P = softmax(s · X W_Q W_Kᵀ Xᵀ)`` row-wise, ``A = P X W_V`` with ``X (N, D)``,
``W_* (D, d)``. docs/methods.md#jacobian-bound states (for ``s = 1``; the scale multiplies the Q and K blocks)

* ``∂A/∂W_Q = (W_Vᵀ Xᵀ ⊗ I_N) Λ(P) (X W_K ⊗ X)``
* ``∂A/∂W_K = (W_Vᵀ Xᵀ ⊗ I_N) Λ(P) (X ⊗ X W_Q) T``
* ``∂A/∂W_V = I_d ⊗ P X``

in the column-stacking ``vec`` convention, ``Λ(P)`` the derivative of the row-wise softmax
and ``T`` the commutation matrix (``vec(Wᵀ) = T vec(W)``). ``J = [∂A/∂W_Q, ∂A/∂W_K, ∂A/∂W_V]``
is ``(N·d, 3·D·d)``.

:func:`attention_jacobian` builds ``J`` by autograd (``torch.func.jacrev``);
:func:`kronecker_jacobian` builds it from the expressions above; both are for small sizes.
:func:`jacobian_bound` is the right-hand side ``B(J)`` of P2 Thm 3.4 / P4 Thm 3.1:
``κ(J) ≤ κ(X)³ · κ(Λ(P)) · κ(W_V) · (κ(W_Q) + κ(W_K)) + κ(X) · κ(P)``, with ``κ(Λ(P))``
over its non-zero singular values ([reading]: ``Λ(P)`` is singular).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kappa import DEFAULT_NONZERO_RTOL, kappa, kappa_of_values


def head_output(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, scale: float = 1.0) -> Tensor:
    """``A = softmax(scale · X W_Q W_Kᵀ Xᵀ) X W_V`` for one head, ``(N, d)``."""
    return attention_probs(x, w_q, w_k, scale) @ x @ w_v


def attention_probs(x: Tensor, w_q: Tensor, w_k: Tensor, scale: float = 1.0) -> Tensor:
    """``P = softmax(scale · X W_Q W_Kᵀ Xᵀ)``, row-wise, ``(N, N)``."""
    return torch.softmax(scale * (x @ w_q) @ (x @ w_k).mT, dim=-1)


def vec(m: Tensor) -> Tensor:
    """Column-stacking ``vec`` of a matrix (docs/methods.md#jacobian-bound)."""
    return m.mT.reshape(-1)


def attention_jacobian(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, scale: float = 1.0) -> Tensor:
    """``J = ∂vec(A) / ∂[vec W_Q, vec W_K, vec W_V]``, ``(N·d, 3·D·d)``, by ``torch.func.jacrev``."""

    def vec_a(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return vec(head_output(x, q, k, v, scale))

    blocks = torch.func.jacrev(vec_a, argnums=(0, 1, 2))(w_q, w_k, w_v)  # each (N·d, D, d)
    # Column-stacking vec of W (D, d): index c·D + r, so put the column axis first.
    return torch.cat([b.transpose(1, 2).flatten(1) for b in blocks], dim=1)


def softmax_jacobian(p: Tensor) -> Tensor:
    """``Λ(P) = ∂vec(P)/∂vec(S)`` for the row-wise softmax, ``(N², N²)``, column-stacking vec.

    Row ``i`` of ``P`` depends on row ``i`` of ``S`` only, through ``Diag(p_i) − p_i p_iᵀ``.
    """
    n = p.shape[0]
    blocks = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]  # (N, N, N): per row i
    lam = torch.zeros(n, n, n, n, dtype=p.dtype, device=p.device)  # [j, i, l, i'] ~ vec index j·N+i
    idx = torch.arange(n)
    lam[:, idx, :, idx] = blocks  # (i, j, l) -> lam[j, i, l, i]
    return lam.reshape(n * n, n * n)


def commutation(rows: int, cols: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """``T`` with ``vec(Mᵀ) = T vec(M)`` for ``M (rows, cols)``."""
    t = torch.zeros(rows * cols, rows * cols, dtype=dtype)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    t[(r * cols + c).reshape(-1), (c * rows + r).reshape(-1)] = 1
    return t


def kronecker_jacobian(x: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, scale: float = 1.0) -> Tensor:
    """``J`` from the closed-form (docs/methods.md#jacobian-bound) Kronecker expressions, ``(N·d, 3·D·d)``."""
    n, d = x.shape[0], w_q.shape[1]
    p = attention_probs(x, w_q, w_k, scale)
    left = torch.kron(w_v.mT @ x.mT, torch.eye(n, dtype=x.dtype)) @ softmax_jacobian(p)  # (N·d, N²)
    j_q = scale * left @ torch.kron(x @ w_k, x)
    j_k = scale * left @ torch.kron(x, x @ w_q) @ commutation(*w_k.shape, dtype=x.dtype)
    j_v = torch.kron(torch.eye(d, dtype=x.dtype), p @ x)
    return torch.cat([j_q, j_k, j_v], dim=1)


def softmax_jacobian_kappa(p: Tensor, nonzero_rtol: float = DEFAULT_NONZERO_RTOL) -> Tensor:
    """``κ(Λ(P))`` over its non-zero singular values, for ``p (…, N, N)``; shape ``(…)``.

    ``Λ(P)`` is a permuted block diagonal of the symmetric PSD blocks ``Diag(p_i) − p_i p_iᵀ``,
    so its singular values are their eigenvalues: no ``N²×N²`` matrix is formed.
    """
    p = p.detach().double()
    blocks = torch.diag_embed(p) - p[..., :, None] * p[..., None, :]  # (…, N, N, N)
    eig = torch.linalg.eigvalsh(blocks).clamp_min(0).flatten(-2)  # (…, N·N)
    return kappa_of_values(eig, nonzero_rtol)


def jacobian_bound(
    x: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    scale: float = 1.0,
    nonzero_rtol: float = DEFAULT_NONZERO_RTOL,
) -> Tensor:
    """``B(J) = κ(X)³ κ(Λ(P)) κ(W_V) (κ(W_Q) + κ(W_K)) + κ(X) κ(P)`` for one head (a scalar).

    Batched over leading dimensions of ``x``/``w_*`` where they broadcast.
    """
    p = attention_probs(x.double(), w_q.double(), w_k.double(), scale)
    k_x = kappa(x)
    return k_x**3 * softmax_jacobian_kappa(p, nonzero_rtol) * kappa(w_v) * (
        kappa(w_q) + kappa(w_k)
    ) + k_x * kappa(p)
