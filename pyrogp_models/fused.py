"""The squared-exponential cross-covariance as one thin matrix product and one exponential.

For the RBF kernel k(x, z) = σ² exp(−½|x − z|²/ℓ²) the weighted cross-covariance
G_nm = √w_n k(x_n, z_m) is exp(E_nm) with

    E_nm = x̃_n·z̃_m + a_n + b_m,   a_n = ½ log w_n − ½|x̃_n|²,   b_m = log σ² − ½|z̃_m|²,

x̃ = (x − c)/ℓ and z̃ = (z − c)/ℓ, i.e. E = P Qᵀ with the augmented rows P_n = [x̃_n, a_n, 1] and
Q_m = [z̃_m, 1, b_m]. One product with D + 2 columns and an in-place exponential produce G, and the
backward pass needs only G itself (∂E = ∂G ∘ G), where autograd through the distance would keep
every N×M intermediate. The shift c (the mean of the inducing inputs, held constant) leaves the
distances unchanged and keeps |x̃|² small, so the expanded square loses no accuracy.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

#: Log-weight given to padding (w = 0): exp(−10⁴) is exactly zero in every floating-point type.
PADDING_LOG_WEIGHT = -1.0e4


class ExpOfProduct(torch.autograd.Function):
    """G = exp(P Qᵀ) for batched P [..., N, R] and Q [..., M, R] of equal batch shape; the
    backward keeps only P, Q and G."""

    @staticmethod
    def forward(ctx, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(left, right.mT).exp_()
        ctx.save_for_backward(left, right, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        left, right, out = ctx.saved_tensors
        grad_exponent = grad * out
        return grad_exponent @ right, grad_exponent.mT @ left


def rbf_weighted_cross_covariance(X: torch.Tensor, Z: torch.Tensor, lengthscale: torch.Tensor,
                                  variance: torch.Tensor, weights: torch.Tensor | None = None
                                  ) -> torch.Tensor:
    """G_nm = √w_n σ² exp(−½|x_n − z_m|²/ℓ²), batched; [*batch, N, M].

    Args:
        X: [*batch, N, D] (broadcastable batch), Z: [*batch, M, D].
        lengthscale: [*batch, D] or [*batch, 1]; variance: [*batch].
        weights: non-negative point weights [*batch, N] (broadcastable); zero marks padding.
    """
    centre = Z.detach().mean(-2, keepdim=True)
    scale = lengthscale.unsqueeze(-2)
    X_scaled = (X - centre) / scale
    Z_scaled = (Z - centre) / scale
    a = -0.5 * X_scaled.square().sum(-1)
    if weights is not None:
        log_weight = torch.where(weights > 0, weights.clamp_min(torch.finfo(weights.dtype).tiny)
                                 .log(), PADDING_LOG_WEIGHT)
        a = a + 0.5 * log_weight
    b = variance.log().unsqueeze(-1) - 0.5 * Z_scaled.square().sum(-1)
    batch = torch.broadcast_shapes(X_scaled.shape[:-2], Z_scaled.shape[:-2], a.shape[:-1],
                                   b.shape[:-1])
    left = torch.cat([X_scaled.expand(*batch, *X_scaled.shape[-2:]),
                      a.expand(*batch, a.shape[-1]).unsqueeze(-1),
                      torch.ones_like(a).expand(*batch, a.shape[-1]).unsqueeze(-1)], -1)
    right = torch.cat([Z_scaled.expand(*batch, *Z_scaled.shape[-2:]),
                       torch.ones_like(b).expand(*batch, b.shape[-1]).unsqueeze(-1),
                       b.expand(*batch, b.shape[-1]).unsqueeze(-1)], -1)
    return ExpOfProduct.apply(left, right)
