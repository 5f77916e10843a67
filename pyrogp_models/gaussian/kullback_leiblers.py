"""KL divergences between multivariate Gaussians given by Cholesky factors.

KL[N(m, LLᵀ) ‖ N(0, K)] = ½[tr(K⁻¹S) + mᵀK⁻¹m − M + log|K| − log|S|]   (K = L_K L_Kᵀ).
Batched over leading dimensions; whitened priors use K = I.
"""

from __future__ import annotations

import torch

from pyrogp_models.gaussian.linalg import logdet_from_cholesky, triangular_solve


def _logdet_triangular(chol: torch.Tensor) -> torch.Tensor:
    return 2.0 * chol.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1)


def kl_to_standard_normal(mean: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
    """KL[N(m, LLᵀ) ‖ N(0, I)] = ½[‖L‖²_F + ‖m‖² − M − log|LLᵀ|]."""
    size = mean.shape[-1]
    return 0.5 * (chol.square().sum((-2, -1)) + mean.square().sum(-1) - size
                  - _logdet_triangular(chol))


def kl_to_zero_mean(mean: torch.Tensor, chol: torch.Tensor, prior_chol: torch.Tensor
                    ) -> torch.Tensor:
    """KL[N(m, LLᵀ) ‖ N(0, L_K L_Kᵀ)] via triangular solves with L_K."""
    size = mean.shape[-1]
    scaled_chol = triangular_solve(prior_chol, chol)
    scaled_mean = triangular_solve(prior_chol, mean.unsqueeze(-1)).squeeze(-1)
    return 0.5 * (scaled_chol.square().sum((-2, -1)) + scaled_mean.square().sum(-1) - size
                  + logdet_from_cholesky(prior_chol) - _logdet_triangular(chol))
