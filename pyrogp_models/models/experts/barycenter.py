"""Wasserstein-2 barycenters of Gaussian expert predictions (Cohen et al., ICML 2020, §3).

* :func:`barycenter_paper` — the paper's pointwise rule, eqs. (10–12): m = Σβ_j m_j and
  σ² = Σβ_j σ_j² (averages *variances*; this is what the paper's tables use).
* :func:`barycenter_w2` — the exact 1-D W2 barycenter, eq. (9) in 1-D: m = Σβ_j m_j and
  σ = Σβ_j σ_j (averages *standard deviations*). By Jensen its variance is ≤ the paper's, with
  equality iff the σ_j with positive weight are all equal.
* :func:`barycenter_full` — full covariances by the fixed-point iteration of Álvarez-Esteban et
  al. (2016, Thm 4.2): S ← S^{-1/2} (Σ_j β_j (S^{1/2} K_j S^{1/2})^{1/2})² S^{-1/2}.

Weights are normalised over experts (a barycenter is defined for simplex weights only, eq. 8).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from .weights import _align, _min_var, normalise_weights

__all__ = [
    "barycenter_paper",
    "barycenter_w2",
    "barycenter_full",
    "w2_squared_1d",
    "w2_squared",
    "sqrtm_psd",
    "fixed_point_residual",
]


def _simplex(weights, mean: Tensor) -> Tensor:
    beta = _align(weights, mean, "weights").expand_as(mean)
    return normalise_weights(beta)


def barycenter_paper(mean: Tensor, var: Tensor, weights) -> tuple[Tensor, Tensor]:
    """The paper's GP barycenter, eqs. (11–12): m = Σβ_j m_j, σ² = Σβ_j σ_j² (pointwise)."""
    if mean.shape != var.shape:
        raise ValueError(f"mean {tuple(mean.shape)} and var {tuple(var.shape)} differ in shape")
    beta = _simplex(weights, mean)
    return (beta * mean).sum(0), (beta * var).sum(0)


def barycenter_w2(mean: Tensor, var: Tensor, weights) -> tuple[Tensor, Tensor]:
    """Exact 1-D W2 barycenter, eq. (9) with scalars: m = Σβ_j m_j, σ = Σβ_j σ_j."""
    if mean.shape != var.shape:
        raise ValueError(f"mean {tuple(mean.shape)} and var {tuple(var.shape)} differ in shape")
    beta = _simplex(weights, mean)
    sd = (beta * var.clamp_min(0.0).sqrt()).sum(0)
    return (beta * mean).sum(0), sd * sd


def w2_squared_1d(mean1, var1, mean2, var2) -> Tensor:
    """Squared 2-Wasserstein distance between 1-D Gaussians, eq. (7): (m1−m2)² + (σ1−σ2)²."""
    mean1, var1, mean2, var2 = (torch.as_tensor(t) for t in (mean1, var1, mean2, var2))
    return (mean1 - mean2) ** 2 + (var1.sqrt() - var2.sqrt()) ** 2


def _sym(a: Tensor) -> Tensor:
    return 0.5 * (a + a.transpose(-1, -2))


def _eig_fn(a: Tensor, fn) -> Tensor:
    evals, evecs = torch.linalg.eigh(_sym(a))
    return (evecs * fn(evals).unsqueeze(-2)) @ evecs.transpose(-1, -2)


def sqrtm_psd(a: Tensor) -> Tensor:
    """Symmetric PSD square root via eigendecomposition (eigenvalues clipped at 0), batched."""
    return _eig_fn(a, lambda e: e.clamp_min(0.0).sqrt())


def _sqrt_and_isqrt(a: Tensor) -> tuple[Tensor, Tensor]:
    evals, evecs = torch.linalg.eigh(_sym(a))
    root = evals.clamp_min(_min_var(a.dtype)).sqrt()
    vt = evecs.transpose(-1, -2)
    return (evecs * root.unsqueeze(-2)) @ vt, (evecs / root.unsqueeze(-2)) @ vt


def w2_squared(mean1: Tensor, cov1: Tensor, mean2: Tensor, cov2: Tensor) -> Tensor:
    """Squared W2 between N(m1, K1) and N(m2, K2), eq. (7), batched over leading axes."""
    r1 = sqrtm_psd(cov1)
    cross = sqrtm_psd(r1 @ cov2 @ r1)
    trace = torch.diagonal(cov1 + cov2 - 2.0 * cross, dim1=-2, dim2=-1).sum(-1)
    return ((mean1 - mean2) ** 2).sum(-1) + trace


def _weighted_root_sum(s_half: Tensor, covs: Tensor, beta: Tensor) -> Tensor:
    """Σ_j β_j (S^{1/2} K_j S^{1/2})^{1/2}; covs [J, *B, D, D], beta [J, *B]."""
    inner = sqrtm_psd(s_half.unsqueeze(0) @ covs @ s_half.unsqueeze(0))
    return (beta[..., None, None] * inner).sum(0)


def fixed_point_residual(cov: Tensor, covs: Tensor, weights) -> Tensor:
    """‖K̄ − Σβ_j (K̄^{1/2} K_j K̄^{1/2})^{1/2}‖_F / ‖K̄‖_F: zero exactly at the eq. (9) solution."""
    beta = _full_weights(weights, covs)
    rhs = _weighted_root_sum(sqrtm_psd(cov), covs, beta)
    return torch.linalg.matrix_norm(cov - rhs) / torch.linalg.matrix_norm(cov)


def _full_weights(weights, covs: Tensor) -> Tensor:
    batch = covs.shape[:-2]
    beta = _align(weights, torch.empty(batch, dtype=covs.dtype, device=covs.device), "weights")
    return normalise_weights(beta.expand(batch))


def barycenter_full(
    means: Tensor,
    covs: Tensor,
    weights,
    *,
    tol: float | None = None,
    max_iter: int = 500,
    init: Tensor | None = None,
    return_info: bool = False,
):
    """W2 barycenter of N(m_j, K_j), eqs. (8–9), by the Álvarez-Esteban et al. (2016) iteration.

    means ``[J, *B, D]``, covs ``[J, *B, D, D]``, weights ``[J]`` or ``[J, *B]`` (normalised
    here). Starts from S_0 = Σβ_j K_j (or ``init``) and stops when the relative Frobenius change
    ‖S_{k+1} − S_k‖/‖S_k‖ ≤ ``tol`` for every batch element (default 1e-12 in float64,
    100·eps otherwise), warning if ``max_iter`` is reached. Returns ``(mean, cov)`` and, with
    ``return_info=True``, a dict with ``iterations``, ``converged`` and the fixed-point
    ``residual`` (see :func:`fixed_point_residual`).
    """
    if covs.dim() < 3 or covs.shape[-1] != covs.shape[-2] or covs.shape[:-1] != means.shape:
        raise ValueError(
            f"expected means [J, *B, D] and covs [J, *B, D, D], got {tuple(means.shape)} "
            f"and {tuple(covs.shape)}"
        )
    if tol is None:
        tol = max(1e-12, 100 * torch.finfo(covs.dtype).eps)
    covs = _sym(covs)
    beta = _full_weights(weights, covs)
    mean = (beta.unsqueeze(-1) * means).sum(0)
    s = (beta[..., None, None] * covs).sum(0) if init is None else _sym(init.to(covs))
    converged = False
    iterations = 0
    for iterations in range(1, max_iter + 1):  # noqa: B007 - the count is reported
        s_half, s_ihalf = _sqrt_and_isqrt(s)
        t = _weighted_root_sum(s_half, covs, beta)
        s_new = _sym(s_ihalf @ t @ t @ s_ihalf)
        change = torch.linalg.matrix_norm(s_new - s) / torch.linalg.matrix_norm(s)
        s = s_new
        if bool((change <= tol).all()):
            converged = True
            break
    if not converged:
        warnings.warn(
            f"barycenter_full did not converge in {max_iter} iterations "
            f"(relative change {float(change.max()):.3g} > tol {tol:.3g})",
            RuntimeWarning,
            stacklevel=2,
        )
    if not return_info:
        return mean, s
    info = {
        "iterations": iterations,
        "converged": converged,
        "residual": fixed_point_residual(s, covs, beta),
    }
    return mean, s, info
