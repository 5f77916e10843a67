"""Collapsed bounds of the distributed-kernel GP for a Gaussian likelihood (derived here).

Whitened throughout: with L = blockdiag(L_j) and Ψ = [k_1(X, Z_1), …, k_J(X, Z_J)] (n × Jm),
Ã = L⁻¹Ψᵀ (Jm × n) and B̃ = I + ÃÃᵀ/σ² (= L⁻¹ B L⁻ᵀ for B = K + ΨᵀΨ/σ², K = blockdiag K_jj):

(a) joint q (Titsias 2009, eq. 9, with K_fu = Ψ and K_uu = K):
    F_joint = −½n log 2πσ² − ½log|B̃| − ½‖y‖²/σ² + ½‖c‖² − ½Σ_i k(x_i, x_i)/σ² + ½‖Ã‖²_F/σ²,
    c = L_B⁻¹Ãy/σ², optimum q(v) = N(B̃⁻¹Ãy/σ², B̃⁻¹);
(b) mean-field optimum: the mean part of both bounds is the same ridge problem, so the means
    equal the joint optimum; S_j = B̃_jj⁻¹, and
    F_MF = F_joint − ½(Σ_j log|B̃_jj| − log|B̃|)   (≥ 0 gap by Fischer's inequality).

These are dense O(n J²m² + J³m³) references for small data (tests, greedy tree splits); the
O(n m²) mean-field solver is :func:`~pyrogp_models.models.distributed_kernel.backfitting.backfit`.
"""

from __future__ import annotations

import math

import torch

from pyrogp_models.gaussian.linalg import (
    cholesky,
    inverse_cholesky,
    logdet_from_cholesky,
    triangular_solve,
)
from pyrogp_models.models.distributed_kernel.halo import Halo, full_halo
from pyrogp_models.models.distributed_kernel.model import DistributedKernelGP


def _check_gaussian(model: DistributedKernelGP) -> torch.Tensor:
    if model.likelihood.name != "gaussian":
        raise ValueError("the collapsed bounds need a Gaussian likelihood")
    return model.likelihood.variance


def dense_projection(model: DistributedKernelGP, X: torch.Tensor, halo: Halo | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Ã = L⁻¹Ψᵀ as a dense [J·m, n] matrix and Σ_i k(x_i, x_i) over the pairs used.

    Without ``halo`` every (point, region) pair is kept (no truncation)."""
    halo = full_halo(X.shape[0], model.num_regions, X.device) if halo is None else halo
    _, A, prior_diag, _ = model.projections(X, halo)
    num_regions, num_inducing, _ = A.shape
    dense = A.new_zeros(num_regions, num_inducing, X.shape[0])
    dense = dense.scatter_add(-1, halo.index.unsqueeze(-2).expand_as(A),
                              A * halo.mask.unsqueeze(-2))
    return dense.reshape(num_regions * num_inducing, X.shape[0]), (prior_diag * halo.mask).sum()


def _collapsed_terms(model: DistributedKernelGP, X, y, halo):
    noise = _check_gaussian(model)
    A, trace_k = dense_projection(model, X, halo)
    eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
    B = eye + A @ A.mT / noise
    B_chol = cholesky(B, 0.0, what="collapsed matrix I + ÃÃᵀ/σ²")
    c = triangular_solve(B_chol, (A @ y).unsqueeze(-1)).squeeze(-1) / noise
    return noise, A, trace_k, B, B_chol, c


def joint_collapsed_bound(model: DistributedKernelGP, X: torch.Tensor, y: torch.Tensor,
                          halo: Halo | None = None) -> torch.Tensor:
    """F_joint: the Titsias (2009, eq. 9) bound with K_fu = Ψ and block-diagonal K_uu."""
    noise, A, trace_k, _, B_chol, c = _collapsed_terms(model, X, y, halo)
    n = X.shape[0]
    return (-0.5 * n * torch.log(2 * math.pi * noise) - 0.5 * logdet_from_cholesky(B_chol)
            - 0.5 * y.square().sum() / noise + 0.5 * c.square().sum()
            - 0.5 * (trace_k - A.square().sum()) / noise)


def _diagonal_blocks(B: torch.Tensor, num_regions: int, num_inducing: int) -> torch.Tensor:
    regions = torch.arange(num_regions, device=B.device)
    return B.reshape(num_regions, num_inducing, num_regions, num_inducing)[regions, :, regions, :]


def meanfield_gap(model: DistributedKernelGP, X: torch.Tensor, y: torch.Tensor,
                  halo: Halo | None = None) -> torch.Tensor:
    """½(Σ_j log|B̃_jj| − log|B̃|) ≥ 0: what the mean-field optimum loses to the joint one."""
    _, _, _, B, B_chol, _ = _collapsed_terms(model, X, y, halo)
    blocks = _diagonal_blocks(B, model.num_regions, model.num_inducing)
    block_logdet = logdet_from_cholesky(cholesky(blocks, 0.0, what="block B̃_jj")).sum()
    return 0.5 * (block_logdet - logdet_from_cholesky(B_chol))


def meanfield_collapsed_bound(model: DistributedKernelGP, X: torch.Tensor, y: torch.Tensor,
                              halo: Halo | None = None) -> torch.Tensor:
    """F_MF = F_joint − ½(Σ_j log|B̃_jj| − log|B̃|), the mean-field optimum of the slides' bound."""
    return joint_collapsed_bound(model, X, y, halo) - meanfield_gap(model, X, y, halo)


@torch.no_grad()
def optimal_joint_posterior(model: DistributedKernelGP, X: torch.Tensor, y: torch.Tensor,
                            halo: Halo | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The joint optimum q(v) = N(B̃⁻¹Ãy/σ², B̃⁻¹): mean [Jm], lower Cholesky factor [Jm, Jm]."""
    _, _, _, B, B_chol, c = _collapsed_terms(model, X, y, halo)
    mean = triangular_solve(B_chol, c.unsqueeze(-1), transpose=True).squeeze(-1)
    return mean, inverse_cholesky(B, what="collapsed matrix I + ÃÃᵀ/σ²")


@torch.no_grad()
def optimal_meanfield_posterior(model: DistributedKernelGP, X: torch.Tensor, y: torch.Tensor,
                                halo: Halo | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean-field optimum in closed form: the joint optimal means and purely
    local covariances S_j = B̃_jj⁻¹. Returns means [J, m] and Cholesky factors [J, m, m]."""
    _, _, _, B, B_chol, c = _collapsed_terms(model, X, y, halo)
    mean = triangular_solve(B_chol, c.unsqueeze(-1), transpose=True).squeeze(-1)
    blocks = _diagonal_blocks(B, model.num_regions, model.num_inducing)
    chol = inverse_cholesky(blocks, what="block B̃_jj")
    return mean.reshape(model.num_regions, model.num_inducing), chol
