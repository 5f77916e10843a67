"""The collapsed (Titsias 2009) bound for Gaussian likelihoods, batched over partitions.

With A = L⁻¹K_zx/σ (L = chol K_zz), B = I + AAᵀ = L_B L_Bᵀ and c = L_B⁻¹Ay/σ (Titsias 2009, eq. 9):

    F = log N(y | 0, Q_ff + σ²I) − tr(K_ff − Q_ff)/(2σ²)
      = −½N log 2πσ² − Σ log diag L_B − ½‖y‖²/σ² + ½‖c‖² − ½Σk_ii/σ² + ½‖A‖²_F.

The optimal whitened q(v) for fixed hyperparameters is N(L_B⁻ᵀc, B⁻¹); plugging it into the
uncollapsed ELBO gives exactly F. Padded points are removed by zeroing their columns of A, their
targets and their prior variances, and by counting only real points in N.

Only M×M statistics of the data enter: AAᵀ = L⁻¹Ψ₂L⁻ᵀ/σ² and Ay = L⁻¹Ψ₁/σ with Ψ₂ = K_zxWK_xz,
Ψ₁ = K_zxWy. In the inverse form (:mod:`pyrogp_models.gaussian.conditionals`, float64 with
jitter ≥ 10⁻⁶) the bound is computed from them without any solve against N right-hand sides,
about twice as fast; but the rounding error of Ψ₂ is amplified by ‖L⁻¹‖² = 1/λ_min(K_zz), so
the value carries errors of ~1e-9 relative and the gradient ~1e-5. The projected form
A = L⁻¹(√W K_xz)ᵀ is accurate to rounding: training ends on it (``precise``).
The functions take a :class:`~pyrogp_models.models.local.svgp.BatchedSVGP` with one latent
function per partition.
"""

from __future__ import annotations

import math

import torch

from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.linalg import cholesky, inverse_cholesky, triangular_solve


def _terms(model, X, y, mask, inverse_form: bool = False):
    """(σ², L_B, c, ‖A‖²_F, Σwy², w) of the bound; [K]-batched."""
    if model.likelihood.name != "gaussian":
        raise ValueError("the collapsed bound needs a Gaussian likelihood")
    weights = mask.to(X.dtype)
    noise = model.likelihood.variance  # [K]
    prior_chol = model.prior_cholesky().squeeze(-3)  # [K, M, M]
    if inverse_form:
        gram, projected_y = model.weighted_gram(X, y, weights)
        gram, projected_y = gram.squeeze(-3), projected_y.squeeze(-2)  # one latent function
        half = triangular_solve(prior_chol, gram)  # L⁻¹Ψ₂
        AAt = triangular_solve(prior_chol, half.mT) / noise[:, None, None]
        Ay = triangular_solve(prior_chol, projected_y.unsqueeze(-1)).squeeze(-1)
        Ay = Ay / noise.sqrt().unsqueeze(-1)
    else:
        cross = model.kernel.weighted_cross(X.unsqueeze(-3), model.inducing.unsqueeze(-3),
                                            weights.unsqueeze(-2)).squeeze(-3)  # √w k(x, z)
        A = conditionals.projection(prior_chol, cross.mT) / noise.sqrt()[:, None, None]
        AAt, Ay = A @ A.mT, (A @ (y * weights.sqrt()).unsqueeze(-1)).squeeze(-1)
    eye = torch.eye(AAt.shape[-1], dtype=AAt.dtype, device=AAt.device)
    B_chol = cholesky(eye + AAt, 0.0, what="collapsed-bound matrix I + AAᵀ")
    c = triangular_solve(B_chol, Ay.unsqueeze(-1)).squeeze(-1) / noise.sqrt().unsqueeze(-1)
    trace = AAt.diagonal(dim1=-2, dim2=-1).sum(-1)
    return noise, B_chol, c, trace, (weights * y.square()).sum(-1), weights


def collapsed_bound(model, X, y, mask, inverse_form: bool | None = None) -> torch.Tensor:
    """Titsias' bound F for each partition; [K]. ``inverse_form`` as in
    :meth:`~pyrogp_models.models.local.svgp.BatchedSVGP.inverse_form` (default: where accurate)."""
    noise, B_chol, c, trace, weighted_y2, weights = _terms(
        model, X, y, mask, inverse_form=model.inverse_form(inverse_form))
    count = weights.sum(-1)
    prior_diag = (model.kernel.diag(X.unsqueeze(-3)).squeeze(-2) * weights).sum(-1)
    return (-0.5 * count * torch.log(2 * math.pi * noise)
            - B_chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
            - 0.5 * weighted_y2 / noise + 0.5 * c.square().sum(-1)
            - 0.5 * prior_diag / noise + 0.5 * trace)


@torch.no_grad()
def optimal_whitened_posterior(model, X, y, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimal q(v) = N(L_B⁻ᵀc, B⁻¹): mean [K, 1, M] and lower Cholesky factor [K, 1, M, M]."""
    _, B_chol, c, _, _, _ = _terms(model, X, y, mask)
    mean = triangular_solve(B_chol, c.unsqueeze(-1), transpose=True).squeeze(-1)
    chol = inverse_cholesky(B_chol @ B_chol.mT, what="collapsed-bound matrix I + AAᵀ")
    return mean.unsqueeze(-2), chol.unsqueeze(-3)


@torch.no_grad()
def set_optimal_posterior(model, X, y, mask) -> None:
    """Overwrite q(v) with its optimum for the current hyperparameters."""
    model.layer.set_whitened_posterior(*optimal_whitened_posterior(model, X, y, mask))
