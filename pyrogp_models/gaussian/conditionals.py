"""Gaussian conditionals: the predictive q(f) = ∫ p(f|u) q(u) du of a sparse variational GP.

Whitened form (Hensman et al. 2015; GPflow's ``conditional``): with L = chol(K_zz), u = L v and
q(v) = N(m_w, L_w L_wᵀ), A = L⁻¹ K_zx,

    mean = Aᵀ m_w,    cov = K_xx − AᵀA + (L_wᵀA)ᵀ(L_wᵀA).

Unwhitened q(u) = N(m, S) maps to the whitened one by m_w = L⁻¹m, L_w = L⁻¹ chol(S).

Inverse form: the same marginals without projecting every input through L⁻¹,

    mean = K_xz α,   cov = K_xx + K_xz B K_zx,   α = L⁻ᵀm_w,   B = L⁻ᵀ(L_wL_wᵀ − I)L⁻¹,

(B = K_zz⁻¹SK_zz⁻¹ − K_zz⁻¹), where α and B cost O(M³) once and each input only matrix products.
It cancels K_xzK_zz⁻¹K_zx against k_xx, losing about cond(K_zz)·ε relative to k_xx, so it suits
float64 with a K_zz jitter of at least 10⁻⁶ of its diagonal (cond ≲ M·10⁶).
All functions batch over leading dimensions.
"""

from __future__ import annotations

import torch

from pyrogp_models.gaussian.linalg import triangular_solve

#: Smallest relative K_zz jitter for which float64 models use the inverse form.
INVERSE_FORM_MIN_JITTER = 1e-6


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


def inverse_form_ready(dtype: torch.dtype, relative_jitter: float) -> bool:
    """Whether the inverse form is accurate enough: float64 and jitter ≥ 10⁻⁶."""
    return dtype == torch.float64 and relative_jitter >= INVERSE_FORM_MIN_JITTER


def inverse_form(prior_chol: torch.Tensor, mean_w: torch.Tensor, chol_w: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """α = L⁻ᵀm_w [..., M] and B = L⁻ᵀ(L_wL_wᵀ − I)L⁻¹ [..., M, M]."""
    alpha = triangular_solve(prior_chol, mean_w.unsqueeze(-1), transpose=True).squeeze(-1)
    spread = triangular_solve(prior_chol, chol_w, transpose=True)
    return alpha, spread @ spread.mT - torch.cholesky_inverse(prior_chol)


def inverse_form_conditional(cross: torch.Tensor, prior_diag: torch.Tensor, alpha: torch.Tensor,
                             B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Marginal mean and variance of q(f), each [..., N], from K_xz [..., N, M], diag K_xx and
    (α, B) of :func:`inverse_form`."""
    mean = (cross @ alpha.unsqueeze(-1)).squeeze(-1)
    var = prior_diag + ((cross @ B) * cross).sum(-1)
    return mean, var.clamp_min(0.0)
