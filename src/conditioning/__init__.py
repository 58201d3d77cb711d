"""What the papers claim, measured: condition numbers, the attention Jacobian and its bound,
and the monitor a training loop calls every ``k`` steps.

May import: ``src.conditioning``, ``src.attention``.
"""

from .jacobian import (
    attention_jacobian,
    attention_probs,
    head_output,
    jacobian_bound,
    kronecker_jacobian,
    softmax_jacobian,
    softmax_jacobian_kappa,
)
from .kappa import DEFAULT_NONZERO_RTOL, kappa, kappa_from_gram, kappa_of_values
from .monitor import ConditioningMonitor

__all__ = [
    "DEFAULT_NONZERO_RTOL",
    "ConditioningMonitor",
    "attention_jacobian",
    "attention_probs",
    "head_output",
    "jacobian_bound",
    "kappa",
    "kappa_from_gram",
    "kappa_of_values",
    "kronecker_jacobian",
    "softmax_jacobian",
    "softmax_jacobian_kappa",
]
