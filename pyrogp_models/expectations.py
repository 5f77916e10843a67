"""Closed-form Gaussian cross-entropies and the contrastive expectations of the meta-GP bound.

Cross-entropy (Recyclable GPs, App. B): for u ~ N(m, S) in d dimensions and Σ = L Lᵀ,

    E_{N(m,S)}[log N(u | μ, Σ)] = −½[d log 2π + log|Σ| + tr(Σ⁻¹S) + (m−μ)ᵀΣ⁻¹(m−μ)].

Contrastive expectation (eq. 5–6): the meta-GP's predictive at a module's inducing inputs,
q_C(u_k) = N(m_C, S_C) (eq. 17 with the main-text "+" sign; in whitened form it is
:func:`pyrogp_models.conditionals.whitened_conditional_full` with B_k = L_**⁻¹K_*k and the prior
covariance K_kk^{(*)} of the *global* kernel), scores

    E_{q_C}[log q_k(u_k) − log p_k(u_k)]

against the module's own q_k = N(μ_k, L_k L_kᵀ) and prior p_k = N(0, L_pk L_pkᵀ) (its own kernel).

As a function of the whitened q(v) = N(m, S_v), the sum over modules is a quadratic form
(natural-parameter view):

    Σ_k E_{q_C}[log q_k − log p_k] = −½tr(P S_v) − ½mᵀPm + ηᵀm + c,
    P = Σ_k B_k P_k B_kᵀ,  P_k = S_k⁻¹ − K_kk^{(k)−1},  η = Σ_k B_k S_k⁻¹μ_k,
    c = −½Σ_k[tr(P_k Q_k) + μ_kᵀS_k⁻¹μ_k + log|S_k| − log|K_kk^{(k)}|],  Q_k = K_kk^{(*)} − B_kᵀB_k,

which gives the collapsed optimum and the boundedness test of the meta-GP. Every inverse is a
triangular solve with a cached Cholesky factor; everything batches over leading dimensions.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from pyrogp_models.linalg import cholesky_solve, logdet_from_cholesky, triangular_solve

_LOG_2PI = math.log(2.0 * math.pi)


def trace_of_solve(chol: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """tr(Σ⁻¹A) for Σ = LLᵀ, by two triangular solves."""
    return cholesky_solve(chol, matrix).diagonal(dim1=-2, dim2=-1).sum(-1)


def mahalanobis(chol: torch.Tensor, diff: torch.Tensor) -> torch.Tensor:
    """dᵀΣ⁻¹d = ‖L⁻¹d‖² for Σ = LLᵀ."""
    return triangular_solve(chol, diff.unsqueeze(-1)).squeeze(-1).square().sum(-1)


def gaussian_cross_entropy(mean: torch.Tensor, cov: torch.Tensor, target_mean: torch.Tensor,
                           target_chol: torch.Tensor) -> torch.Tensor:
    """E_{N(mean, cov)}[log N(u | target_mean, LLᵀ)] in closed form (App. B). ``cov`` need not be
    factorised (it may be a difference of covariances, as S_C is)."""
    size = mean.shape[-1]
    return -0.5 * (size * _LOG_2PI + logdet_from_cholesky(target_chol)
                   + trace_of_solve(target_chol, cov) + mahalanobis(target_chol,
                                                                    mean - target_mean))


def contrastive_expectation(mean_c: torch.Tensor, cov_c: torch.Tensor, module_mean: torch.Tensor,
                            module_chol: torch.Tensor, module_prior_chol: torch.Tensor
                            ) -> torch.Tensor:
    """E_{q_C(u_k)}[log q_k(u_k) − log p_k(u_k)], one summand of eq. (6); batched over modules."""
    return (gaussian_cross_entropy(mean_c, cov_c, module_mean, module_chol)
            - gaussian_cross_entropy(mean_c, cov_c, torch.zeros_like(module_mean),
                                     module_prior_chol))


class ContrastiveQuadratic(NamedTuple):
    """Σ_k E_{q_C}[log q_k − log p_k] = −½tr(P S_v) − ½mᵀPm + ηᵀm + c in the whitened q(v)."""

    precision: torch.Tensor  # P = Σ_k B_k P_k B_kᵀ, [M, M]
    shift: torch.Tensor  # η = Σ_k B_k S_k⁻¹ μ_k, [M]
    constant: torch.Tensor  # c, []


def contrastive_quadratic(projection: torch.Tensor, prior_cov: torch.Tensor,
                          module_mean: torch.Tensor, module_chol: torch.Tensor,
                          module_prior_chol: torch.Tensor) -> ContrastiveQuadratic:
    """The quadratic form of the contrastive sum over a batch of K modules (summed over them).

    Args:
        projection: B_k = L_**⁻¹K_*k, [K, M, M_k].
        prior_cov: K_kk^{(*)}, the global kernel at the module inputs, [K, M_k, M_k].
        module_mean, module_chol, module_prior_chol: μ_k [K, M_k], chol S_k and chol K_kk^{(k)}
            [K, M_k, M_k].
    """
    site = triangular_solve(module_chol, projection.mT)  # L_k⁻¹B_kᵀ
    prior_site = triangular_solve(module_prior_chol, projection.mT)  # L_pk⁻¹B_kᵀ
    whitened_mean = triangular_solve(module_chol, module_mean.unsqueeze(-1))  # L_k⁻¹μ_k
    stacked_site = site.reshape(-1, site.shape[-1])  # Σ_k over modules as one product
    stacked_prior_site = prior_site.reshape(-1, site.shape[-1])
    precision = stacked_site.mT @ stacked_site - stacked_prior_site.mT @ stacked_prior_site
    shift = stacked_site.mT @ whitened_mean.reshape(-1)
    site_trace_q = (trace_of_solve(module_chol, prior_cov)  # tr(P_k Q_k)
                    - trace_of_solve(module_prior_chol, prior_cov)
                    - site.square().sum((-2, -1)) + prior_site.square().sum((-2, -1)))
    constant = -0.5 * (site_trace_q + whitened_mean.square().sum((-2, -1))
                       + logdet_from_cholesky(module_chol)
                       - logdet_from_cholesky(module_prior_chol)).sum()
    return ContrastiveQuadratic(precision, shift, constant)
