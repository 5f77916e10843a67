"""Gaussian conditionals: the predictive q(f) = ∫ p(f|u) q(u) du of a sparse variational GP.

Whitened form (Hensman et al. 2015; GPflow's ``conditional``): with L = chol(K_zz), u = L v and
q(v) = N(m_w, L_w L_wᵀ), A = L⁻¹ K_zx,

    mean = Aᵀ m_w,    cov = K_xx − AᵀA + (L_wᵀA)ᵀ(L_wᵀA).

Unwhitened q(u) = N(m, S) maps to the whitened one by m_w = L⁻¹m, L_w = L⁻¹ chol(S).
All functions batch over leading dimensions.
"""

from __future__ import annotations

import torch

from pyrogp_models.linalg import triangular_solve


def whiten(prior_chol: torch.Tensor, mean: torch.Tensor, chol: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, chol S) of q(u) → (L⁻¹m, L⁻¹ chol S) of q(v)."""
    mean_w = triangular_solve(prior_chol, mean.unsqueeze(-1)).squeeze(-1)
    return mean_w, triangular_solve(prior_chol, chol)


def unwhiten(prior_chol: torch.Tensor, mean_w: torch.Tensor, chol_w: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(m_w, L_w) of q(v) → (L m_w, L L_w) of q(u); L L_w is lower triangular."""
    return (prior_chol @ mean_w.unsqueeze(-1)).squeeze(-1), prior_chol @ chol_w


def projection(prior_chol: torch.Tensor, cross_cov: torch.Tensor) -> torch.Tensor:
    """A = L⁻¹ K_zx of shape [..., M, N]."""
    return triangular_solve(prior_chol, cross_cov)


def whitened_conditional(A: torch.Tensor, prior_diag: torch.Tensor, mean_w: torch.Tensor,
                         chol_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Marginal mean and variance of q(f), each [..., N], from A = L⁻¹K_zx and diag K_xx."""
    mean = (A.mT @ mean_w.unsqueeze(-1)).squeeze(-1)
    spread = chol_w.mT @ A
    var = prior_diag - A.square().sum(-2) + spread.square().sum(-2)
    return mean, var.clamp_min(0.0)


def whitened_conditional_full(A: torch.Tensor, prior_cov: torch.Tensor, mean_w: torch.Tensor,
                              chol_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean [..., N] and full covariance [..., N, N] of q(f)."""
    mean = (A.mT @ mean_w.unsqueeze(-1)).squeeze(-1)
    spread = chol_w.mT @ A
    return mean, prior_cov - A.mT @ A + spread.mT @ spread
