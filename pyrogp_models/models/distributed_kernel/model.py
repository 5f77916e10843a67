"""The distributed-kernel sparse GP as a Pyro model/guide pair (the slides' model and bound).

f = Σ_j f_j with independent f_j ~ GP(0, k_j), k_j = k · w_j; region j carries m inducing
variables u_j = f_j(Z_j) = L_j v_j, L_j = chol(k_j(Z_j, Z_j) + jitter). Z and the whitened q(v)
are a :class:`~pyrogp_models.layers.SparseGPLayer` with batch (J,) whose kernel is the J local
kernels (:class:`~pyrogp_models.models.distributed_kernel.local_kernels.LocalKernels`):

- ``variational="meanfield"`` (the slides' bound): q(v) = Π_j N(m_j, L_j^w L_j^wᵀ), one factor
  per region (the layer's ``covariance="meanfield"``);
- ``variational="joint"`` (the reference, an SVGP with block-diagonal K_uu): one N(m, L^w L^wᵀ)
  over all J·m variables (the layer's ``covariance="joint"``).

Under q the marginal of f(x_i) is N(μ_i, v_i) with, for A_ij = L_j⁻¹ k_j(Z_j, x_i),

    μ_i = Σ_j A_ijᵀ m_j,   v_i = Σ_j [k_j(x_i, x_i) − ‖A_ij‖²] + (mean-field) Σ_j ‖L_j^wᵀ A_ij‖²
                                                             (joint)      ‖L^wᵀ [A_i1; …; A_iJ]‖²,

and the ELBO is Σ_i E_{N(μ_i, v_i)}[log p(y_i|f_i)] − KL[q(v) ‖ N(0, I)] (closed form for the
Gaussian likelihood, Gauss–Hermite for the others). The sums over j run over the halo pairs only
(:mod:`~pyrogp_models.models.distributed_kernel.halo`), so the data term costs O(n m²), not O(n J
m²). Given whitened inducing values v, f(x_i) | v ~ N(Σ_j A_ijᵀ v_j, Σ_j [k_j(x_i, x_i) − ‖A_ij‖²])
(the f_j are independent), which is what :meth:`DistributedKernelGP.predictive_model` draws.

In the Pyro model the whitened prior v ~ N(0, I) is the layer's latent site, the guide is q(v),
``TraceMeanField_ELBO`` evaluates the KL analytically, and the data term enters as a per-point
``pyro.factor`` inside a data plate (subsampled to ``batch_size`` points), computed from the
guide's parameters as in :class:`~pyrogp_models.models.local.svgp.BatchedSVGP`. The training data
are bound to the model as non-persistent buffers (never in a checkpoint), so ``model()`` and
``guide()`` take no arguments; ``model``, ``guide``, ``predictive_model`` and
``predictive_guide`` run in Pyro's module context, so ``pyro.infer.SVI`` trains every parameter
and ``pyro.infer.Predictive`` draws v, f and y.

The pure functions below (prior factors, pair projections, moments) are shared with the sharded
evaluation (:mod:`~pyrogp_models.models.distributed_kernel.shards`).
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, pyro_method

from pyrogp_models.gaussian.linalg import DEFAULT_JITTER, cholesky, triangular_solve
from pyrogp_models.kernels import Stationary
from pyrogp_models.layers import SparseGPLayer, unique_name
from pyrogp_models.layers.sparse_gp import COVARIANCES
from pyrogp_models.likelihoods import Likelihood
from pyrogp_models.models.distributed_kernel.halo import DEFAULT_EPS, Halo, build_halo
from pyrogp_models.models.distributed_kernel.local_kernels import (
    LocalKernels,
    local_cross_covariance,
    local_diagonal,
)
from pyrogp_models.models.distributed_kernel.regions import Regions

#: The variational families: the layer's covariance structures.
VARIATIONAL = COVARIANCES


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


# the model ------------------------------------------------------------------------------------
class DistributedKernelGP(PyroModule):
    """Sum-of-local-GPs sparse GP with m inducing variables per region, its data bound; the
    ELBO of the module docstring (the slides' mean-field bound, or the joint q).

    Args:
        regions: the partition (:class:`Regions`), J regions.
        inducing: initial Z [J, m, D].
        kernel: an SE :class:`Stationary` kernel with ``batch_shape=()`` (shared by all k_j).
        likelihood: a likelihood with ``batch_shape=()``.
        X, y: the training data [N, D], [N] in model units (optional: a model read from a file
            has none; ``model()`` then refuses to run).
        variational: ``"meanfield"`` (slides) or ``"joint"`` (reference).
        learn_inducing: optimise Z, in coordinates of the initial lengthscale (Z = c_j + ℓ₀·Z̃_j
            with c_j the initial centre of region j's Z): an optimiser step then moves Z by a
            fraction of ℓ in any input units.
        jitter: relative jitter on k_j(Z_j, Z_j).
        halo_eps: window threshold ε of the halo (0 keeps every pair).
        batch_size: points drawn per evaluation of ``model()`` (None: all).
        name: the Pyro name (default: a fresh ``"dk"``).
    """

    def __init__(self, regions: Regions, inducing: torch.Tensor, kernel: Stationary,
                 likelihood: Likelihood, X: torch.Tensor | None = None,
                 y: torch.Tensor | None = None, *, variational: str = "meanfield",
                 learn_inducing: bool = True, jitter: float = DEFAULT_JITTER,
                 halo_eps: float = DEFAULT_EPS, batch_size: int | None = None,
                 name: str | None = None):
        super().__init__(name or unique_name("dk"))
        if variational not in VARIATIONAL:
            raise ValueError(f"unknown variational family '{variational}'; use {VARIATIONAL}")
        if likelihood.batch_shape != torch.Size([]):
            raise ValueError("the distributed kernel shares one likelihood: build it with "
                             "batch_shape=()")
        if likelihood.num_latent != 1:
            raise ValueError("the distributed-kernel GP has one latent function")
        num_regions, _, input_dim = inducing.shape
        if num_regions != regions.num_regions or input_dim != regions.input_dim:
            raise ValueError(f"inducing inputs {tuple(inducing.shape)} do not match "
                             f"{regions.num_regions} regions in {regions.input_dim} dimensions")
        if (X is None) != (y is None):
            raise ValueError("bind both X and y, or neither")
        # learned Z moves in units of the initial lengthscale, whatever the input units
        scale = kernel.lengthscale.detach().expand(num_regions, input_dim) if learn_inducing \
            else None
        self.layer = SparseGPLayer(LocalKernels(kernel, regions), inducing, (num_regions,),
                                   learn_inducing=learn_inducing, inducing_scale=scale,
                                   jitter=jitter, covariance=variational)
        self.likelihood = likelihood
        self.halo_eps = halo_eps
        self.batch_size = batch_size
        self.register_buffer("data_X", X, persistent=False)
        self.register_buffer("data_y", y, persistent=False)
        self._kept_projections = None

    # Shapes -------------------------------------------------------------------------------------
    @property
    def kernel(self) -> Stationary:
        """The SE kernel shared by every k_j."""
        return self.layer.kernel.kernel

    @property
    def regions(self) -> Regions:
        return self.layer.kernel.regions

    @property
    def variational(self) -> str:
        return self.layer.covariance

    @property
    def jitter(self) -> float:
        return self.layer.jitter

    @property
    def inducing(self) -> torch.Tensor:
        """Z [J, m, D]."""
        return self.layer.inducing

    @property
    def q_mean(self) -> torch.Tensor:
        """Whitened means [J, m] (for the joint q too)."""
        return self.layer.q_mean

    @property
    def q_sqrt(self) -> torch.Tensor:
        """Whitened Cholesky factors [J, m, m] (mean-field) or [J·m, J·m] (joint)."""
        return self.layer.q_sqrt

    @property
    def num_regions(self) -> int:
        return self.layer.batch_shape[0]

    @property
    def num_inducing(self) -> int:
        return self.layer.num_inducing

    def bound_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The training data (X [N, D], y [N]) bound at construction."""
        if self.data_X is None:
            raise ValueError("this distributed-kernel GP has no training data bound; build it "
                             "with X and y")
        return self.data_X, self.data_y

    # Gaussian algebra ---------------------------------------------------------------------------
    def _kernel_args(self):
        lower, upper = self.regions.bounds()
        return lower, upper, self.kernel.lengthscale, self.kernel.variance, self.regions.active_dims

    def prior_cholesky(self) -> torch.Tensor:
        """L_j = chol(k_j(Z_j, Z_j) + jitter) [J, m, m]."""
        return self.layer.prior_cholesky()

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

    def keep_projections(self, projections) -> None:
        """Hand :meth:`projections` of the bound inputs to the next full-batch evaluation of
        :meth:`model`, which uses them (once) if no parameter has changed in between: a solve for
        q before a training step then shares the step's O(n m²) projection."""
        self._kept_projections = (self._state_versions(), projections)

    def _take_projections(self):
        """The kept projections if still valid (no parameter changed), else None; forgets them."""
        kept, self._kept_projections = self._kept_projections, None
        if kept is None or kept[0] != self._state_versions():
            return None
        return kept[1]

    def _state_versions(self) -> tuple[tuple[int, int], ...]:
        """Identity and in-place version of every parameter and buffer (the bound data too)."""
        return tuple((id(t), t._version) for t in (*self.parameters(), *self.buffers()))

    def latent(self, X: torch.Tensor, halo: Halo | None = None, projections=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginal mean and variance of q(f) = ∫ p(f | u) q(u) du at X [N, D], each [N].

        ``projections`` reuses the output of :meth:`projections` (it does not depend on q)."""
        halo, A, prior_diag, _ = self.projections(X, halo) if projections is None else projections
        moments = meanfield_moments if self.variational == "meanfield" else joint_moments
        return moments(halo, A, prior_diag, self.q_mean, self.q_sqrt)

    def conditional_on(self, whitened: torch.Tensor, X: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """p(f(X) | v) for whitened draws v [..., J, m] (any leading sample shape): mean
        Σ_j A_ijᵀv_j [..., N] and variance Σ_j [k_j(x_i, x_i) − ‖A_ij‖²] [N]."""
        halo, A, prior_diag, _ = self.projections(X)
        mean = halo.scatter(pair_means(A, whitened))
        return mean, halo.scatter(pair_residual_variances(A, prior_diag)).clamp_min(0.0)

    def kl(self) -> torch.Tensor:
        """KL[q(v) ‖ N(0, I)] summed over regions (= Σ_j KL[q(u_j) ‖ p(u_j)] for mean-field)."""
        return self.layer.kl().sum()

    def expected_log_lik(self, X: torch.Tensor, y: torch.Tensor, halo: Halo | None = None,
                         projections=None) -> torch.Tensor:
        """E_q[log p(y_i | f_i)] per point [N]."""
        mean, var = self.latent(X, halo, projections)
        return self.likelihood.expected_log_prob(y, mean, var)

    def elbo(self, X: torch.Tensor | None = None, y: torch.Tensor | None = None,
             halo: Halo | None = None, projections=None) -> torch.Tensor:
        """The exact ELBO on full data (a scalar); by default on the bound data."""
        if X is None:
            X, y = self.bound_data()
        return self.expected_log_lik(X, y, halo, projections).sum() - self.kl()

    # Pyro model / guide ---------------------------------------------------------------------------
    @pyro_method
    def model(self):
        """Whitened prior v ~ N(0, I); the data term as a per-point factor in a data plate,
        subsampled to ``batch_size`` points (scaled n/B)."""
        X, y = self.bound_data()
        projections = self._take_projections()
        self.layer.sample(self._pyro_get_fullname("u"), posterior=False)
        with pyro.plate(self._pyro_get_fullname("points"), X.shape[0],
                        subsample_size=self.batch_size, device=X.device, dim=-1) as index:
            if self.batch_size is not None:
                index = index.sort().values        # sorted points keep the halo a binary search
                X, y, projections = X[index], y[index], None
            pyro.factor(self._pyro_get_fullname("data"),
                        self.expected_log_lik(X, y, projections=projections))

    @pyro_method
    def guide(self, *args, **kwargs):
        """q(v) = Π_j N(m_j, L_j L_jᵀ) (mean-field) or N(m, L Lᵀ) (joint); arguments are
        ignored."""
        self.layer.sample(self._pyro_get_fullname("u"), posterior=True)

    @pyro_method
    def predictive_model(self, X: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """v ~ N(0, I), f | v at X [N, D] (model units; default: the bound inputs) through the
        halo (module docstring) and y | f: sample sites ``u`` [J, m], ``f`` [N] and ``y`` [N].
        With :meth:`predictive_guide`, ``pyro.infer.Predictive`` draws from the posterior
        predictive."""
        X = self.bound_data()[0] if X is None else X
        v = self.layer.sample(self._pyro_get_fullname("u"), posterior=False)
        mean, var = self.conditional_on(v, X)
        f = pyro.sample(self._pyro_get_fullname("f"),
                        dist.Normal(mean, var.sqrt().expand_as(mean)).to_event(1))
        y = pyro.sample(self._pyro_get_fullname("y"), self.likelihood.distribution(f).to_event(1))
        return f, y

    @pyro_method
    def predictive_guide(self, *args, **kwargs):
        """q(v) for :meth:`predictive_model`; arguments are ignored."""
        self.layer.sample(self._pyro_get_fullname("u"), posterior=True)

    def natural_gradient_objectives(self) -> list:
        """The layer and the safeguard of its natural-gradient steps.

        The joint q with a Gaussian likelihood is conjugate: one unit step puts it at the joint
        optimum. The mean-field q is not, even for a Gaussian likelihood: the regions share the
        points of their halos, so the step on the means is block-Jacobi on the coupled ridge
        system (:mod:`.backfitting`), which can overshoot; the ELBO safeguards it (as it does
        every non-Gaussian step)."""
        conjugate = self.variational == "joint" and self.likelihood.name == "gaussian"
        return [(self.layer, None if conjugate else self.elbo)]

    # predictions ----------------------------------------------------------------------------------
    @torch.no_grad()
    def predict_latent(self, X: torch.Tensor, chunk_size: int = 65536
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f_*) at test points X [N, D] (model units), using only the regions whose window
        exceeds ε there, ``chunk_size`` points at a time."""
        means, variances = [], []
        for start in range(0, X.shape[0], chunk_size):
            mean, var = self.latent(X[start:start + chunk_size])
            means.append(mean)
            variances.append(var)
        return torch.cat(means), torch.cat(variances)

    # overwrite ------------------------------------------------------------------------------------
    @torch.no_grad()
    def set_whitened_posterior(self, mean: torch.Tensor, chol: torch.Tensor) -> None:
        """Overwrite q(v) (``mean`` of J·m values in region order, ``chol`` as ``q_sqrt``)."""
        self.layer.set_whitened_posterior(mean, chol)
