"""The distributed-kernel sparse GP as a Pyro model/guide pair (the slides' model and bound).

f = Σ_j f_j with independent f_j ~ GP(0, k_j), k_j = k · w_j; region j carries m inducing
variables u_j = f_j(Z_j) = L_j v_j, L_j = chol(k_j(Z_j, Z_j) + jitter). Whitened q(v):

- ``variational="meanfield"`` (the slides' bound): q(v) = Π_j N(m_j, L_j^w L_j^wᵀ), a plate
  over regions;
- ``variational="joint"`` (the reference, an SVGP with block-diagonal K_uu): one N(m, L^w L^wᵀ)
  over all J·m variables.

Under q the marginal of f(x_i) is N(μ_i, v_i) with, for A_ij = L_j⁻¹ k_j(Z_j, x_i),

    μ_i = Σ_j A_ijᵀ m_j,   v_i = Σ_j [k_j(x_i, x_i) − ‖A_ij‖²] + (mean-field) Σ_j ‖L_j^wᵀ A_ij‖²
                                                             (joint)      ‖L^wᵀ [A_i1; …; A_iJ]‖²,

and the ELBO is Σ_i E_{N(μ_i, v_i)}[log p(y_i|f_i)] − KL[q(v) ‖ N(0, I)] (closed form for the
Gaussian likelihood, Gauss–Hermite for the others). The sums over j run over the halo pairs only
(:mod:`~pyrogp_models.models.distributed_kernel.halo`), so the data term costs O(n m²), not O(n J
m²).

In the Pyro model the whitened prior v ~ N(0, I) is a latent site in a plate over regions, the
guide is q(v), ``TraceMeanField_ELBO`` evaluates the KL analytically, and the data term enters as a
per-point ``pyro.factor`` inside a data plate (``subsample_size`` for minibatches), computed from
the guide's parameters as in :class:`~pyrogp_models.models.local.svgp.BatchedSVGP`.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam

from pyrogp_models.gaussian.kullback_leiblers import kl_to_standard_normal
from pyrogp_models.gaussian.linalg import cholesky, triangular_solve
from pyrogp_models.kernels import Stationary
from pyrogp_models.likelihoods import Likelihood
from pyrogp_models.models.distributed_kernel.halo import DEFAULT_EPS, Halo, build_halo, full_halo
from pyrogp_models.models.distributed_kernel.local_kernels import (
    check_family,
    local_cross_covariance,
    local_diagonal,
)
from pyrogp_models.models.distributed_kernel.regions import Regions

#: Relative jitter on k_j(Z_j, Z_j) (× its mean diagonal), as for the other sparse GPs.
DEFAULT_JITTER = 1e-6
VARIATIONAL = ("meanfield", "joint")


# pure functions (shared with the shards) ------------------------------------------------------
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


def meanfield_moments(halo: Halo, A: torch.Tensor, prior_diag: torch.Tensor,
                      q_mean: torch.Tensor, q_sqrt: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ_i, v_i) of q(f(x_i)) [N] under the mean-field q, summed over the halo pairs."""
    mean_pairs = (A * q_mean.unsqueeze(-1)).sum(-2)                       # [J, P]
    spread = q_sqrt.mT @ A
    var_pairs = prior_diag - A.square().sum(-2) + spread.square().sum(-2)
    return halo.scatter(mean_pairs), halo.scatter(var_pairs).clamp_min(0.0)


def joint_moments(halo: Halo, A: torch.Tensor, prior_diag: torch.Tensor, q_mean: torch.Tensor,
                  q_sqrt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ_i, v_i) under the joint q over all J·m whitened variables (dense; reference only)."""
    num_regions, num_inducing, _ = A.shape
    mean_pairs = (A * q_mean.reshape(num_regions, num_inducing, 1)).sum(-2)
    local = prior_diag - A.square().sum(-2)
    dense = A.new_zeros(num_regions, num_inducing, halo.num_points)
    dense = dense.scatter_add(-1, halo.index.unsqueeze(-2).expand_as(A),
                              A * halo.mask.unsqueeze(-2))
    spread = q_sqrt.mT @ dense.reshape(num_regions * num_inducing, halo.num_points)
    var = halo.scatter(local) + spread.square().sum(-2)
    return halo.scatter(mean_pairs), var.clamp_min(0.0)


# the model ------------------------------------------------------------------------------------
class DistributedKernelGP(PyroModule):
    """Sum-of-local-GPs sparse GP with m inducing variables per region.

    Args:
        regions: the partition (:class:`Regions`), J regions.
        inducing: initial Z [J, m, D].
        kernel: an SE :class:`Stationary` kernel with ``batch_shape=()`` (shared by all k_j).
        likelihood: a likelihood with ``batch_shape=()``.
        variational: ``"meanfield"`` (slides) or ``"joint"`` (reference).
        learn_inducing: optimise Z.
        jitter: relative jitter on k_j(Z_j, Z_j).
        halo_eps: window threshold ε of the halo (0 keeps every pair).
        name: prefix of the Pyro sites.
    """

    def __init__(self, regions: Regions, inducing: torch.Tensor, kernel: Stationary,
                 likelihood: Likelihood, variational: str = "meanfield",
                 learn_inducing: bool = True, jitter: float = DEFAULT_JITTER,
                 halo_eps: float = DEFAULT_EPS, name: str = "dk"):
        super().__init__(name)
        check_family(kernel)
        if variational not in VARIATIONAL:
            raise ValueError(f"unknown variational family '{variational}'; use {VARIATIONAL}")
        if kernel.batch_shape != torch.Size([]) or likelihood.batch_shape != torch.Size([]):
            raise ValueError("the distributed kernel shares one kernel and one likelihood: "
                             "build them with batch_shape=()")
        if likelihood.num_latent != 1:
            raise ValueError("the distributed-kernel GP has one latent function")
        num_regions, num_inducing, input_dim = inducing.shape
        if num_regions != regions.num_regions or input_dim != regions.input_dim:
            raise ValueError(f"inducing inputs {tuple(inducing.shape)} do not match "
                             f"{regions.num_regions} regions in {regions.input_dim} dimensions")
        self.regions = regions
        self.kernel = kernel
        self.likelihood = likelihood
        self.variational = variational
        self.jitter = jitter
        self.halo_eps = halo_eps
        self.site_prefix = name
        if learn_inducing:
            self.inducing = PyroParam(inducing.clone())
        else:
            self.register_buffer("inducing", inducing.clone())
        eye = torch.eye(num_inducing, dtype=inducing.dtype, device=inducing.device)
        if variational == "meanfield":
            self.q_mean = PyroParam(inducing.new_zeros(num_regions, num_inducing))
            self.q_sqrt = PyroParam(eye.expand(num_regions, -1, -1).clone(),
                                    constraint=constraints.lower_cholesky)
        else:
            size = num_regions * num_inducing
            self.q_mean = PyroParam(inducing.new_zeros(size))
            self.q_sqrt = PyroParam(torch.eye(size, dtype=inducing.dtype,
                                              device=inducing.device),
                                    constraint=constraints.lower_cholesky)

    @property
    def num_regions(self) -> int:
        return self.inducing.shape[0]

    @property
    def num_inducing(self) -> int:
        return self.inducing.shape[1]

    # Gaussian algebra ----------------------------------------------------------------------------
    def _kernel_args(self):
        lower, upper = self.regions.bounds()
        return lower, upper, self.kernel.lengthscale, self.kernel.variance, self.regions.active_dims

    def prior_cholesky(self) -> torch.Tensor:
        """L_j = chol(k_j(Z_j, Z_j) + jitter) [J, m, m]."""
        return prior_cholesky(self.inducing, *self._kernel_args(), jitter=self.jitter)

    def halo(self, X: torch.Tensor, eps: float | None = None) -> Halo:
        """The (point, region) pairs for the current ℓ and cuts (rebuild when they move)."""
        lower, upper = self.regions.bounds()
        ell = self.regions.active_lengthscale(self.kernel.lengthscale)
        return build_halo(X, lower, upper, ell, self.regions.active_dims,
                          self.halo_eps if eps is None else eps)

    def projections(self, X: torch.Tensor, halo: Halo | None = None,
                    prior_chol: torch.Tensor | None = None):
        """(halo, A [J, m, P], k_j(x, x) [J, P], L [J, m, m]) at the points X [N, D]."""
        halo = self.halo(X) if halo is None else halo
        prior_chol = self.prior_cholesky() if prior_chol is None else prior_chol
        A, prior_diag = pair_projections(X, halo, self.inducing, *self._kernel_args(), prior_chol)
        return halo, A, prior_diag, prior_chol

    def latent(self, X: torch.Tensor, halo: Halo | None = None, projections=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginal mean and variance of q(f) = ∫ p(f | u) q(u) du at X [N, D], each [N].

        ``projections`` reuses the output of :meth:`projections` (it does not depend on q)."""
        halo, A, prior_diag, _ = self.projections(X, halo) if projections is None else projections
        moments = meanfield_moments if self.variational == "meanfield" else joint_moments
        return moments(halo, A, prior_diag, self.q_mean, self.q_sqrt)

    def region_latent(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each local GP's q(f_j) at X [N, D]: means and variances [J, N] (all pairs)."""
        halo = full_halo(X.shape[0], self.num_regions, X.device)
        _, A, prior_diag, _ = self.projections(X, halo)
        q_mean = self.q_mean.reshape(self.num_regions, self.num_inducing)
        mean = (A * q_mean.unsqueeze(-1)).sum(-2)
        if self.variational == "meanfield":
            var = prior_diag - A.square().sum(-2) + (self.q_sqrt.mT @ A).square().sum(-2)
        else:
            covariance = (self.q_sqrt @ self.q_sqrt.mT).reshape(
                self.num_regions, self.num_inducing, self.num_regions, self.num_inducing)
            regions = torch.arange(self.num_regions, device=covariance.device)
            blocks = covariance[regions, :, regions, :]                   # [J, m, m]
            var = prior_diag - A.square().sum(-2) + (A * (blocks @ A)).sum(-2)
        return mean, var.clamp_min(0.0)

    def kl(self) -> torch.Tensor:
        """KL[q(v) ‖ N(0, I)] summed over regions (= Σ_j KL[q(u_j) ‖ p(u_j)] for mean-field)."""
        return kl_to_standard_normal(self.q_mean, self.q_sqrt).sum()

    def expected_log_lik(self, X: torch.Tensor, y: torch.Tensor, halo: Halo | None = None,
                         projections=None) -> torch.Tensor:
        """E_q[log p(y_i | f_i)] per point [N]."""
        mean, var = self.latent(X, halo, projections)
        return self.likelihood.expected_log_prob(y, mean, var)

    def elbo(self, X: torch.Tensor, y: torch.Tensor, halo: Halo | None = None,
             projections=None) -> torch.Tensor:
        """The exact ELBO on full data (a scalar)."""
        return self.expected_log_lik(X, y, halo, projections).sum() - self.kl()

    # Pyro model / guide ---------------------------------------------------------------------------
    def _prior_site(self):
        if self.variational == "meanfield":
            zeros = self.q_mean.new_zeros(self.num_inducing)
            eye = torch.eye(self.num_inducing, dtype=zeros.dtype, device=zeros.device)
            with pyro.plate(f"{self.site_prefix}.regions", self.num_regions, dim=-1):
                pyro.sample(f"{self.site_prefix}.u", dist.MultivariateNormal(zeros,
                                                                             scale_tril=eye))
        else:
            zeros = self.q_mean.new_zeros(self.q_mean.shape[-1])
            eye = torch.eye(zeros.shape[-1], dtype=zeros.dtype, device=zeros.device)
            pyro.sample(f"{self.site_prefix}.u", dist.MultivariateNormal(zeros, scale_tril=eye))

    def model(self, X: torch.Tensor, y: torch.Tensor, batch_size: int | None = None):
        """Whitened prior v ~ N(0, I) (a plate over regions for mean-field); the data term as a
        per-point factor in a data plate, subsampled to ``batch_size`` points (scaled n/B)."""
        self._prior_site()
        with pyro.plate(f"{self.site_prefix}.points", X.shape[0], subsample_size=batch_size,
                        dim=-1) as index:
            if batch_size is not None:
                index = index.sort().values
                X, y = X[index], y[index]
            pyro.factor(f"{self.site_prefix}.data", self.expected_log_lik(X, y))

    def guide(self, X: torch.Tensor, y: torch.Tensor, batch_size: int | None = None):
        """q(v) = Π_j N(m_j, L_j L_jᵀ) (mean-field) or N(m, L Lᵀ) (joint)."""
        if self.variational == "meanfield":
            with pyro.plate(f"{self.site_prefix}.regions", self.num_regions, dim=-1):
                pyro.sample(f"{self.site_prefix}.u",
                            dist.MultivariateNormal(self.q_mean, scale_tril=self.q_sqrt))
        else:
            pyro.sample(f"{self.site_prefix}.u",
                        dist.MultivariateNormal(self.q_mean, scale_tril=self.q_sqrt))

    # predictions ----------------------------------------------------------------------------------
    @torch.no_grad()
    def predict_latent(self, X: torch.Tensor, chunk_size: int = 65536
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f_*) at test points, using only the regions whose window exceeds ε there."""
        means, variances = [], []
        for start in range(0, X.shape[0], chunk_size):
            mean, var = self.latent(X[start:start + chunk_size])
            means.append(mean)
            variances.append(var)
        return torch.cat(means), torch.cat(variances)

    @torch.no_grad()
    def predict(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance of y_* (for the Gaussian likelihood: + σ²)."""
        return self.likelihood.predictive_moments(*self.predict_latent(X))

    @torch.no_grad()
    def log_predictive(self, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """log p(y_* | data) per test point (for NLPD)."""
        return self.likelihood.log_predictive(y, *self.predict_latent(X))

    # export and overwrite -----------------------------------------------------------------------
    @torch.no_grad()
    def set_whitened_posterior(self, mean: torch.Tensor, chol: torch.Tensor) -> None:
        """Overwrite q(v) (shapes as ``q_mean``/``q_sqrt``)."""
        self.q_mean = mean.reshape(self.q_mean.shape).clone()
        self.q_sqrt = chol.reshape(self.q_sqrt.shape).clone()

    @torch.no_grad()
    def unwhitened_posterior(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean-field q(u_j) = N(L_j m_j, (L_j L_j^w)(L_j L_j^w)ᵀ): [J, m] and [J, m, m]."""
        if self.variational != "meanfield":
            raise ValueError("per-region q(u_j) exists for the mean-field variant only")
        prior_chol = self.prior_cholesky()
        return (prior_chol @ self.q_mean.unsqueeze(-1)).squeeze(-1), prior_chol @ self.q_sqrt
