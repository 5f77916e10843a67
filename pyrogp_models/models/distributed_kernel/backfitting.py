"""Mean-field optimum by backfitting: the fast O(n m²) inner solver.

For a Gaussian likelihood and fixed (θ, Z, cuts), the optimal mean-field q(v_j) given the other
regions is Titsias' optimum for the residual r⁽ʲ⁾ = y − Σ_{l≠j} μ_·l with kernel k_j. Whitened, with
A_j = L_j⁻¹ k_j(Z_j, X_{D_j}) on region j's halo:

    B̃_jj = I + A_j A_jᵀ/σ²,   S_j = B̃_jj⁻¹ (independent of the others),   m_j = B̃_jj⁻¹A_j r⁽ʲ⁾/σ².

Updating every region in turn is block Gauss–Seidel on a concave quadratic, so the ELBO rises
monotonically to the global mean-field optimum. Regions whose halos share no point do not interact,
so each colour class of the region graph is updated at once (vectorised); a sweep costs
(number of colours) × O(n m²), and in 1-D two or three colours suffice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from pyrogp_models.gaussian.kullback_leiblers import kl_to_standard_normal
from pyrogp_models.gaussian.linalg import cholesky, cholesky_solve, inverse_cholesky
from pyrogp_models.kernels import Stationary
from pyrogp_models.likelihoods import Likelihood
from pyrogp_models.models.distributed_kernel.halo import Halo, greedy_colouring, region_graph
from pyrogp_models.models.distributed_kernel.projections import (
    pair_means,
    pair_residual_variances,
)
from pyrogp_models.models.distributed_kernel.regions import Regions

#: Relative CG residual ‖b − Hm‖/‖b‖ at which a solve inside the collapsed bound freezes, and at
#: which the closing solve of a fit (checked, so it can run to rounding) stops.
SOLVE_TOL, FINAL_SOLVE_TOL = 1e-7, 1e-10


def solve_tol(dtype: torch.dtype, target: float = SOLVE_TOL) -> float:
    """``target``, or 16ε where the dtype cannot reach it (float32: 1.9e−6)."""
    return max(target, 16 * torch.finfo(dtype).eps)


#: Warm-started CG iterations per evaluation of the collapsed bound (unchecked: every one runs,
#: frozen once at the tolerance).
OBJECTIVE_ITERATIONS = 30


class MeanFieldProblem(Protocol):
    """What the solvers read of a distributed-kernel GP
    (:class:`~pyrogp_models.models.distributed_kernel.model.DistributedKernelGP`) and write back."""

    @property
    def variational(self) -> str: ...

    @property
    def likelihood(self) -> Likelihood: ...

    @property
    def kernel(self) -> Stationary: ...

    @property
    def regions(self) -> Regions: ...

    @property
    def inducing(self) -> torch.Tensor: ...

    @property
    def halo_eps(self) -> float: ...

    @property
    def num_regions(self) -> int: ...

    @property
    def q_mean(self) -> torch.Tensor: ...

    def projections(self, X: torch.Tensor, halo: Halo | None = None
                    ) -> tuple[Halo, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(halo, A [J, m, P], k_j(x, x) [J, P], L [J, m, m]) at the points X [N, D]."""

    def set_whitened_posterior(self, mean: torch.Tensor, chol: torch.Tensor) -> None:
        """Overwrite q(v) (``mean`` of J·m values in region order, ``chol`` as ``q_sqrt``)."""


def require_solvable(model: MeanFieldProblem) -> None:
    """The mean-field solvers need mean-field q and a Gaussian likelihood."""
    if model.variational != "meanfield" or model.likelihood.name != "gaussian":
        raise ValueError("the mean-field optimum in closed form needs mean-field q and a "
                         "Gaussian likelihood")


@dataclass
class BackfitResult:
    """ELBO after each sweep (the first entry is before any mean update) and the stop reason."""

    elbos: list[float] = field(default_factory=list)
    sweeps: int = 0
    converged: bool = False


def region_colours(model: MeanFieldProblem) -> torch.Tensor:
    """A colouring [J] of the region graph for the current ℓ, cuts and halo threshold."""
    lower, upper = model.regions.bounds()
    ell = model.regions.active_lengthscale(model.kernel.lengthscale)
    if not model.regions.active_dims:
        return torch.zeros(model.num_regions, dtype=torch.long, device=model.inducing.device)
    return greedy_colouring(region_graph(lower, upper, ell, model.halo_eps))


@torch.no_grad()
def backfit(model: MeanFieldProblem, X: torch.Tensor, y: torch.Tensor,
            max_sweeps: int = 100, tol: float = 1e-10, halo: Halo | None = None,
            colours: torch.Tensor | None = None) -> BackfitResult:
    """Overwrite the mean-field q(v) with the optimum for the current θ, Z and cuts.

    Covariances are set to B̃_jj⁻¹ once; means start from the current ``q_mean`` (warm start) and
    are updated colour by colour until no mean moves by more than ``tol`` (relative to the
    largest mean) in a sweep. The ELBO after every sweep is recorded.
    """
    require_solvable(model)
    noise = model.likelihood.variance
    halo, A, prior_diag, _ = model.projections(X, halo)
    colours = region_colours(model) if colours is None else colours
    colours = colours.to(X.device)
    B = block_precisions(A, noise)
    B_chol = cholesky(B, 0.0, what="backfitting matrix I + A_jA_jᵀ/σ²")
    q_sqrt = inverse_cholesky(B, what="backfitting matrix I + A_jA_jᵀ/σ²")
    var = halo.scatter(pair_residual_variances(A, prior_diag)
                       + (q_sqrt.mT @ A).square().sum(-2))
    y_pairs = halo.gather(y) * halo.mask
    mean = model.q_mean.detach().clone()
    mean_pairs = pair_means(A, mean)                                          # [J, P]
    total = halo.scatter(mean_pairs)
    kl_cov = kl_to_standard_normal(torch.zeros_like(mean), q_sqrt).sum()
    n = X.shape[0]

    def elbo() -> float:
        data = (-0.5 * n * torch.log(2 * math.pi * noise)
                - 0.5 * ((y - total).square() + var).sum() / noise)
        return float(data - kl_cov - 0.5 * mean.square().sum())

    result = BackfitResult(elbos=[elbo()])
    groups = [torch.nonzero(colours == c).flatten() for c in torch.unique(colours).tolist()]
    for _ in range(max_sweeps):
        previous = mean.clone()
        for group in groups:
            index, mask = halo.index[group], halo.mask[group]
            residual = y_pairs[group] - total[index] * mask + mean_pairs[group]
            rhs = (A[group] @ residual.unsqueeze(-1)) / noise
            mean[group] = cholesky_solve(B_chol[group], rhs).squeeze(-1)
            new_pairs = pair_means(A[group], mean[group])
            total = total.index_add(0, index.reshape(-1),
                                    (new_pairs - mean_pairs[group]).reshape(-1))
            mean_pairs[group] = new_pairs
        result.elbos.append(elbo())
        result.sweeps += 1
        change = float((mean - previous).abs().max())
        if change <= tol * max(float(mean.abs().max()), 1.0):
            result.converged = True
            break
    model.set_whitened_posterior(mean, q_sqrt)
    return result


def block_precisions(A: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The diagonal blocks B̃_jj = I + A_jA_jᵀ/σ² of the ridge system, [J, m, m]."""
    eye = torch.eye(A.shape[-2], dtype=A.dtype, device=A.device)
    return eye + A @ A.mT / noise


@dataclass
class SolveResult:
    """The relative residual ‖b − Hm‖/‖b‖ before and after each conjugate-gradient iteration
    ([iterations + 1], on the model's device) and the tolerance the solve aimed at."""

    residuals: torch.Tensor
    tol: float

    @property
    def iterations(self) -> int:
        return self.residuals.numel() - 1

    @property
    def converged(self) -> bool:
        """Whether the last residual met the tolerance (reads it back to the host)."""
        return bool(self.residuals[-1] <= self.tol)


@torch.no_grad()
def solve_meanfield(model: MeanFieldProblem, X: torch.Tensor, y: torch.Tensor,
                    max_iters: int = 500, tol: float = 1e-10, halo: Halo | None = None,
                    projections=None, checked: bool = True) -> SolveResult:
    """Overwrite the mean-field q(v) with its optimum by block-Jacobi-preconditioned CG.

    The optimal means solve the same ridge system as backfitting, H m = Ãy/σ² with
    H = I + ÃÃᵀ/σ² (they equal the joint optimum, see
    :mod:`pyrogp_models.models.distributed_kernel.collapsed`); backfitting is block
    Gauss–Seidel on it and crawls when neighbouring regions explain the same data (small σ², wide
    halos), so this solver runs conjugate gradients preconditioned by the diagonal blocks B̃_jj
    instead, warm-started from the current ``q_mean``.
    A matrix–vector product with H costs O(Σ_j |D_j| m) through the halo; the preconditioner
    O(J m²); all regions at once. Covariances are set to B̃_jj⁻¹ as in :func:`backfit`.
    ``projections`` reuses the output of the model's ``projections``.

    ``checked`` (the final solve): the residual is read back after every iteration and the solve
    stops once ‖r‖ ≤ tol‖b‖. Unchecked (inside the model's ``collapsed_bound``): exactly
    ``max_iters`` iterations and nothing read back; the same test runs on the device and gives
    the converged iterations steps of length zero (``torch.where``), freezing the solution. A
    non-finite warm start (left by a failed evaluation) restarts from zero.
    """
    require_solvable(model)
    noise = model.likelihood.variance.detach()
    halo, A, _, _ = model.projections(X, halo) if projections is None else projections
    A = A.detach()
    B = block_precisions(A, noise)
    B_chol = cholesky(B, 0.0, what="block matrix I + A_jA_jᵀ/σ²")

    def apply(v: torch.Tensor) -> torch.Tensor:                # H v, v [J, m]
        f = halo.scatter(pair_means(A, v))
        return v + (A @ halo.gather(f).unsqueeze(-1)).squeeze(-1) / noise

    def precondition(r: torch.Tensor) -> torch.Tensor:
        return cholesky_solve(B_chol, r.unsqueeze(-1)).squeeze(-1)

    b = (A @ halo.gather(y).unsqueeze(-1)).squeeze(-1) / noise
    b_norm = b.norm().clamp_min(torch.finfo(b.dtype).tiny)
    mean = model.q_mean.detach()
    mean = torch.where(torch.isfinite(mean).all(), mean, 0.0)
    residual = b - apply(mean)
    z = precondition(residual)
    direction = z
    rz = (residual * z).sum()
    residuals = [residual.norm() / b_norm]
    for _ in range(max_iters):
        if checked and float(residuals[-1]) <= tol:
            break
        active = residuals[-1] > tol
        Hd = apply(direction)
        step = torch.where(active, rz / (direction * Hd).sum(), 0.0)
        mean = mean + step * direction
        residual = residual - step * Hd
        z = precondition(residual)
        rz_new = (residual * z).sum()
        direction = z + torch.where(active, rz_new / rz, 0.0) * direction
        rz = rz_new
        residuals.append(residual.norm() / b_norm)
    model.set_whitened_posterior(mean, inverse_cholesky(B, what="block matrix I + A_jA_jᵀ/σ²"))
    return SolveResult(torch.stack(residuals), tol)
