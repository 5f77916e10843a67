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

**Collapsed** (``collapsed=True``; Gaussian likelihood, mean-field q, full batches): the model's
one factor is the collapsed mean-field bound F_MF(θ, Z, cuts) = max_q ELBO, and the guide is empty.
Each evaluation sets q to its optimum for the current θ, Z and cuts by warm-started conjugate
gradients (:func:`~pyrogp_models.models.distributed_kernel.backfitting.solve_meanfield`, nothing
read back) and returns the ELBO there, whose gradient in θ, Z and cuts at fixed q is that of
F_MF (envelope theorem). A deterministic objective of the hyperparameters alone: L-BFGS
(:meth:`DistributedKernelGP.member_objectives`) converges on it in far fewer steps than Adam.

Training steps read nothing back to the host: the halo of the bound data is planned
(:class:`~pyrogp_models.models.distributed_kernel.halo.HaloPlans`), and factorisations defer
their checks inside the trainer. The pure functions of the algebra are in
:mod:`~pyrogp_models.models.distributed_kernel.projections`.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, pyro_method

from pyrogp_models.gaussian.linalg import DEFAULT_JITTER
from pyrogp_models.kernels import Stationary
from pyrogp_models.layers import SparseGPLayer, unique_name
from pyrogp_models.layers.sparse_gp import COVARIANCES
from pyrogp_models.likelihoods import Likelihood
from pyrogp_models.models.distributed_kernel import backfitting
from pyrogp_models.models.distributed_kernel.halo import (
    DEFAULT_EPS,
    Halo,
    HaloPlans,
    build_halo,
    is_sorted,
)
from pyrogp_models.models.distributed_kernel.local_kernels import LocalKernels
from pyrogp_models.models.distributed_kernel.projections import (
    joint_moments,
    meanfield_moments,
    pair_means,
    pair_projections,
    pair_residual_variances,
)
from pyrogp_models.models.distributed_kernel.regions import Regions

#: The variational families: the layer's covariance structures.
VARIATIONAL = COVARIANCES


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
        collapsed: train on the collapsed mean-field bound (module docstring): Gaussian
            likelihood, mean-field q and full batches only.
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
                 collapsed: bool = False, learn_inducing: bool = True,
                 jitter: float = DEFAULT_JITTER, halo_eps: float = DEFAULT_EPS,
                 batch_size: int | None = None, name: str | None = None):
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
        self.collapsed = collapsed
        self.register_buffer("data_X", X, persistent=False)
        self.register_buffer("data_y", y, persistent=False)
        active = regions.active_dims
        self._halo_plans = None if X is None else HaloPlans(
            len(active) == 1 and is_sorted(X[:, active[0]]))
        if collapsed:
            backfitting.require_solvable(self)
            if batch_size is not None:
                raise ValueError("the collapsed bound uses all data; minibatches need "
                                 "collapsed=False")

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
        """The (point, region) pairs at any points X for the current ℓ and cuts, exactly sized
        (reads the size back to the host: for predictions and references, not training)."""
        lower, upper = self.regions.bounds()
        ell = self.regions.active_lengthscale(self.kernel.lengthscale)
        return build_halo(X, lower, upper, ell, self.regions.active_dims,
                          self.halo_eps if eps is None else eps)

    def training_halo(self, X: torch.Tensor, subsample: bool = False) -> Halo:
        """The pairs at the bound inputs (or a sorted random ``subsample`` of them) within a
        planned width: nothing read back but once every few builds (:class:`HaloPlans`)."""
        lower, upper = self.regions.bounds()
        ell = self.regions.active_lengthscale(self.kernel.lengthscale)
        return self._halo_plans.build(X, lower, upper, ell, self.regions.active_dims,
                                      self.halo_eps, subsample)

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
        """The exact ELBO on full data (a scalar); by default on the bound data (through the
        planned halo of training, so that a training step may call it)."""
        if X is None:
            X, y = self.bound_data()
            if halo is None and projections is None:
                halo = self.training_halo(X)
        return self.expected_log_lik(X, y, halo, projections).sum() - self.kl()

    def collapsed_bound(self) -> torch.Tensor:
        """F_MF(θ, Z, cuts) on the bound data, q set to its optimum on the way (module
        docstring)."""
        return self._collapsed_bound()[0]

    def _collapsed_bound(self) -> tuple[torch.Tensor, torch.Tensor]:
        """F_MF and whether the planned halo overflowed (then F_MF missed pairs: a lengthscale
        grew past the margin since the last width check)."""
        X, y = self.bound_data()
        projections = self.projections(X, self.training_halo(X))
        backfitting.solve_meanfield(self, X, y, max_iters=backfitting.OBJECTIVE_ITERATIONS,
                                    tol=backfitting.solve_tol(X.dtype), projections=projections,
                                    checked=False)
        return self.elbo(X, y, projections=projections), projections[0].overflow

    def _lbfgs_objective(self) -> torch.Tensor:
        """−F_MF [1], NaN where the halo overflowed, so that L-BFGS rejects that step."""
        bound, overflow = self._collapsed_bound()
        return torch.where(overflow, math.nan, -bound).reshape(1)

    def member_objectives(self, precise: bool = False) -> list | None:
        """One member for the batched L-BFGS of the trainer: (the parameters but q, −F_MF) when
        collapsed, else (all parameters, −ELBO) on full batches. There is no more precise
        objective (``precise=True`` gives None): the fit ends on the trainer's change test, as
        pinning hundreds of inducing inputs to rounding would take hundreds of steps for nothing
        a prediction could show."""
        if precise:
            return None
        if self.collapsed:
            owned = {id(p) for p in self.layer.variational_parameters()}
            parameters = [p for p in self.parameters() if p.requires_grad and id(p) not in owned]
            return [(parameters, self._lbfgs_objective)]
        if self.batch_size is not None:
            raise ValueError("L-BFGS needs full batches; minibatches train with Adam")
        return [([p for p in self.parameters() if p.requires_grad],
                 lambda: -self.elbo().reshape(1))]

    # Pyro model / guide ---------------------------------------------------------------------------
    @pyro_method
    def model(self):
        """Whitened prior v ~ N(0, I); the data term as a per-point factor in a data plate,
        subsampled to ``batch_size`` points (scaled n/B). Collapsed: the one factor F_MF."""
        if torch.jit.is_tracing():
            raise NotImplementedError(
                "the distributed-kernel GP cannot be traced (JitTraceMeanField_ELBO): which "
                "points each region touches changes with ℓ and the cuts; use "
                "TraceMeanField_ELBO")
        if self.collapsed:
            pyro.factor(self._pyro_get_fullname("collapsed"), self.collapsed_bound())
            return
        X, y = self.bound_data()
        self.layer.sample(self._pyro_get_fullname("u"), posterior=False)
        with pyro.plate(self._pyro_get_fullname("points"), X.shape[0],
                        subsample_size=self.batch_size, device=X.device, dim=-1) as index:
            subsample = self.batch_size is not None
            if subsample:
                index = index.sort().values        # sorted points keep the halo a binary search
                X, y = X[index], y[index]
            halo = self.training_halo(X, subsample)
            pyro.factor(self._pyro_get_fullname("data"), self.expected_log_lik(X, y, halo))

    @pyro_method
    def guide(self, *args, **kwargs):
        """q(v) = Π_j N(m_j, L_j L_jᵀ) (mean-field) or N(m, L Lᵀ) (joint); nothing when
        collapsed (q is set by the model). Arguments are ignored."""
        if not self.collapsed:
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
