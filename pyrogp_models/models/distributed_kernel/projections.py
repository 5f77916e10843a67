"""Pair projections and the moments of q(f): the pure functions of the distributed-kernel GP,
shared by the model, the mean-field solvers and the shards.

For region j with inducing inputs Z_j and L_j = chol(k_j(Z_j, Z_j) + jitter), and a point x_i in
its halo, A_ij = L_j⁻¹ k_j(Z_j, x_i). Under q(v) the marginal of f(x_i) is N(μ_i, v_i) with

    μ_i = Σ_j A_ijᵀ m_j,   v_i = Σ_j [k_j(x_i, x_i) − ‖A_ij‖²] + (mean-field) Σ_j ‖L_j^wᵀ A_ij‖²
                                                            (joint)      ‖L^wᵀ [A_i1; …; A_iJ]‖²,

the sums running over the halo pairs (:mod:`~pyrogp_models.models.distributed_kernel.halo`).
"""

from __future__ import annotations

import torch

from pyrogp_models.gaussian.linalg import DEFAULT_JITTER, cholesky, triangular_solve
from pyrogp_models.models.distributed_kernel.halo import Halo
from pyrogp_models.models.distributed_kernel.local_kernels import (
    local_cross_covariance,
    local_diagonal,
)


def prior_cholesky(Z: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                   lengthscale: torch.Tensor, variance: torch.Tensor, active_dims: list[int],
                   jitter: float = DEFAULT_JITTER) -> torch.Tensor:
    """L_j = chol(k_j(Z_j, Z_j) + jitter) for Z [J, m, D] → [J, m, m]."""
    Kzz = local_cross_covariance(Z, Z, lower, upper, lengthscale, variance, active_dims)
    return cholesky(Kzz, jitter, what="local inducing covariance k_j(Z_j, Z_j)")


def pair_projections(X: torch.Tensor, halo: Halo, Z: torch.Tensor, lower: torch.Tensor,
                     upper: torch.Tensor, lengthscale: torch.Tensor, variance: torch.Tensor,
                     active_dims: list[int], prior_chol: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """A_j = L_j⁻¹ k_j(Z_j, X_{D_j}) [J, m, P] and k_j(x, x) on the pairs [J, P]; padding
    entries are zero."""
    X_pairs = halo.gather(X)                                              # [J, P, D]
    cross = local_cross_covariance(Z, X_pairs, lower, upper, lengthscale, variance, active_dims)
    mask = halo.mask.to(cross.dtype)
    A = triangular_solve(prior_chol, cross * mask.unsqueeze(-2))
    prior_diag = local_diagonal(X_pairs, lower, upper, lengthscale, variance, active_dims) * mask
    return A, prior_diag


def pair_means(A: torch.Tensor, whitened: torch.Tensor) -> torch.Tensor:
    """A_ijᵀ v_j on every pair: A [J, m, P] and v [..., J, m] → [..., J, P]."""
    return (whitened.unsqueeze(-2) @ A).squeeze(-2)


def pair_residual_variances(A: torch.Tensor, prior_diag: torch.Tensor) -> torch.Tensor:
    """k_j(x_i, x_i) − ‖A_ij‖², the variance of f_j(x_i) given v_j, on every pair [J, P]."""
    return prior_diag - A.square().sum(-2)


def meanfield_moments(halo: Halo, A: torch.Tensor, prior_diag: torch.Tensor,
                      q_mean: torch.Tensor, q_sqrt: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ_i, v_i) of q(f(x_i)) [N] under the mean-field q, summed over the halo pairs."""
    spread = (q_sqrt.mT @ A).square().sum(-2)
    var_pairs = pair_residual_variances(A, prior_diag) + spread
    return halo.scatter(pair_means(A, q_mean)), halo.scatter(var_pairs).clamp_min(0.0)


def joint_moments(halo: Halo, A: torch.Tensor, prior_diag: torch.Tensor, q_mean: torch.Tensor,
                  q_sqrt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ_i, v_i) under the joint q over all J·m whitened variables (dense; reference only)."""
    num_regions, num_inducing, _ = A.shape
    dense = A.new_zeros(num_regions, num_inducing, halo.num_points)
    dense = dense.scatter_add(-1, halo.index.unsqueeze(-2).expand_as(A),
                              A * halo.mask.unsqueeze(-2))
    spread = q_sqrt.mT @ dense.reshape(num_regions * num_inducing, halo.num_points)
    var = halo.scatter(pair_residual_variances(A, prior_diag)) + spread.square().sum(-2)
    mean = pair_means(A, q_mean.reshape(num_regions, num_inducing))
    return halo.scatter(mean), var.clamp_min(0.0)
