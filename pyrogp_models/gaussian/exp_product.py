"""exp(P Qᵀ) for thin factors P, Q and the gradients of its exponent: the form of the RBF kernel
(:mod:`pyrogp_models.kernels.fused_rbf`) that the meta-GP's site Gram steps take directly
(:class:`pyrogp_models.gaussian.expectations.ExpFactors`).

Exponents below log of the dtype's smallest normal number are raised to it before the
exponential: far pairs (half the entries of a meta-GP's cross-covariance) would otherwise
underflow to subnormals or zero, which the vectorised exponential computes several times more
slowly; the entries they become (≤ 3·10⁻³⁰⁸ in float64) change no sum they enter.

The exponential is taken as 2^(log₂e · PQᵀ), the scale folded into P: torch's base-2 exponential
is 1.3× (float64) to 2× (float32) faster than its natural one on CPUs, and the extra rounding,
≈ |PQᵀ|·ε relative, is of the order of the rounding the factored exponent already carries.
"""

from __future__ import annotations

import math

import torch

#: log₂e: e^x = 2^(x log₂e).
LOG2_E = math.log2(math.e)


def exp_of_product(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """exp(left @ rightᵀ) [B, N, M] = 2^(log₂e · left @ rightᵀ), the exponent floored at
    ⌈log₂ of the smallest normal number⌉ of the dtype (see the module docstring)."""
    floor = math.ceil(math.log2(torch.finfo(left.dtype).tiny))
    return torch.bmm(left * LOG2_E, right.mT).clamp_min_(floor).exp2_()


def exponent_gradients(grad_exponent: torch.Tensor, left: torch.Tensor, right: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """P̄ = ∂E Q [..., N, R] and Q̄ = ∂Eᵀ P [..., M, R] of E = P Qᵀ, each formed transposed
    (Qᵀ∂Eᵀ, Pᵀ∂E: products with R output rows, several times faster than R output columns)."""
    return ((right.mT @ grad_exponent.mT).mT, (left.mT @ grad_exponent).mT)
