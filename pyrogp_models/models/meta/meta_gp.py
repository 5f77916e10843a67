"""The meta-GP of Recyclable GPs: one global sparse GP fitted to a dictionary of modules.

It has its own inducing inputs Z_* [M, D], a global stationary kernel ψ_* and a whitened
q(v) = N(m, LLᵀ) with u_* = L_** v (L_** = chol(K_** + jitter)). It maximises the ensemble bound
(Recyclable GPs, eq. 6)

    L_E = Σ_k E_{q_C(u_k)}[log q_k(u_k) − log p_k(u_k)] − KL[q(v) ‖ N(0, I)],

with q_C the meta predictive at the module's inducing inputs (eq. 17, main-text "+" sign) built by
the global kernel, q_k the module's posterior and p_k its prior under its own kernel and jitter.
With new raw data the combined bound (eq. 19) adds Σ_i E_{q(f_i)}[log p(y_i | f_i)] and learns the
new data's likelihood parameters. Modules may differ in kernel family, hyperparameters, M_k, Z_k
and likelihood (heterogeneous modules share the one latent function).

The inducing inputs and q(v) are a :class:`~pyrogp_models.layers.SparseGPLayer` with batch ().
As a Pyro model, v is a sample site with a whitened N(0, I) prior and the guide is q(v), so
``TraceMeanField_ELBO`` evaluates the KL analytically; the contrastive sum (and the data term)
enter as ``pyro.factor`` sites in closed form. ``model``, ``guide`` and ``predictive_model`` run in
Pyro's module context: ``pyro.infer.SVI`` trains every parameter and ``pyro.infer.Predictive``
draws v, f and y.

Collapsed form. Substituting the closed-form Gaussian cross-entropy (App. B) and q_C (eq. 17)
into eq. (6) makes the bound a quadratic form in q(v) — the natural-parameter view of the
modules as Gaussian sites q_k/p_k — with precision Λ_w = I + Σ_k B_k P_k B_kᵀ
(P_k = S_k⁻¹ − K_kk^{(k)−1}; + AAᵀ/σ² for Gaussian raw data) and shift η_w, so for fixed ψ_*, Z_*
the optimum is q(v) = N(Λ_w⁻¹η_w, Λ_w⁻¹) and L_E^* = ½η_wᵀΛ_w⁻¹η_w − ½log|Λ_w| + c. (This
closed form is derived here; the papers optimise q(u_*) by gradients.) In collapsed mode ψ_* and
Z_* are learned by gradients on L_E^*.

Cost. Both bounds are evaluated through that quadratic form, from site parameters P_k, b_k
cached per module (:class:`pyrogp_models.modules.stack.ModuleGroup`): one evaluation is one
kernel matrix K_*· between Z_* and all Σ_k M_k module inducing inputs, block products with the
P_k and M×M algebra — linear in the number of modules K, with no per-module factorisation or
solve. :meth:`MetaGP.contrastive_terms` still scores the modules one by one (eq. 5).

Boundedness: L_E is not a true bound; it is unbounded above when λ_min(Λ_w) ≤ 0 (under-fitted or
overlapping modules, a global kernel unlike the modules'). The model checks λ_min(Λ_w) before
training and every ``check_every`` evaluations (on the Λ_w the evaluation computes anyway),
raising :class:`~pyrogp_models.errors.UnboundedBoundError` (or warning;
:mod:`pyrogp_models.models.meta.boundedness`).
:func:`pyrogp_models.modules.stack.clip_site_precisions` repairs the modules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, pyro_method

from pyrogp_models.data import Standardisation
from pyrogp_models.errors import IncompatibleModulesError, MixedLikelihoodsError
from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.expectations import (
    BlockTerms,
    ContrastiveQuadratic,
    ExpFactors,
    contrastive_expectation,
    evaluate_quadratic,
    site_quadratic,
)
from pyrogp_models.gaussian.linalg import (
    DEFAULT_JITTER,
    cholesky_solve,
    inverse_cholesky,
    triangular_solve,
)
from pyrogp_models.kernels import Kernel, frozen
from pyrogp_models.layers import OneLayer, SparseGPLayer, unique_name
from pyrogp_models.likelihoods import LIKELIHOODS, Likelihood, make_likelihood
from pyrogp_models.models.meta.boundedness import ON_UNBOUNDED, BoundednessGuard, describe_unbounded
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.stack import ModuleStack, StackedSites

_LOG_2PI = math.log(2.0 * math.pi)

__all__ = ["MetaGP", "choose_likelihood", "score_modules"]


def score_modules(stack: ModuleStack, predictives: list[tuple[torch.Tensor, torch.Tensor]]
                  ) -> torch.Tensor:
    """E_{q_C(u_k)}[log q_k − log p_k] per module in stack order, [K], from q_C per M_k-group."""
    terms = predictives[0][0].new_zeros(stack.num_modules)
    for group, (mean_c, cov_c) in zip(stack.groups, predictives, strict=True):
        terms = terms.index_put((group.indices,), contrastive_expectation(
            mean_c, cov_c, *group.first_latent()))
    return terms


class MetaGP(OneLayer, BoundednessGuard, PyroModule):
    """A global sparse GP fitted to modules (and optionally to new raw data): the ensemble bound
    L_E of Recyclable GPs (eq. 6), or the combined bound with raw data (eq. 19); q(v) [M] with
    ``q_sqrt`` [M, M], whitened.

    Args:
        stack: the cached modules, or None for raw data only (the bound is then the SVGP ELBO).
        inducing: initial Z_* [M, D] in model (standardised) units.
        kernel: the global kernel ψ_*, any :class:`~pyrogp_models.kernels.base.Kernel` with
            batch shape ().
        likelihood, raw_X, raw_y: new raw data in model units and its likelihood (batch shape
            ()), whose parameters are learned (combined bound, eq. 19).
        collapsed: train ψ_*, Z_* on the collapsed bound L_E^*; q(v) is then its optimum.
        learn_inducing, learn_kernel: optimise Z_* and ψ_* (``learn_kernel`` sets requires_grad
            of the kernel's parameters).
        jitter: relative jitter on K_**.
        on_unbounded: ``"raise"`` or ``"warn"`` when λ_min(Λ_w) ≤ 0 (collapsed mode always
            raises: its optimum does not exist).
        check_every: evaluations of the model between boundedness checks (the first evaluation
            is always checked).
        standardisation: the units of the modules (default: the stack's, or the identity).
        name: the Pyro name (default: a fresh ``"meta"``).
    """

    def __init__(self, stack: ModuleStack | None, inducing: torch.Tensor, kernel: Kernel,
                 *, likelihood: Likelihood | None = None, raw_X: torch.Tensor | None = None,
                 raw_y: torch.Tensor | None = None, collapsed: bool = False,
                 learn_inducing: bool = True, learn_kernel: bool = True,
                 jitter: float = DEFAULT_JITTER, on_unbounded: str = "raise",
                 check_every: int = 50, standardisation: Standardisation | None = None,
                 name: str | None = None):
        super().__init__(name or unique_name("meta"))
        if on_unbounded not in ON_UNBOUNDED:
            raise ValueError(f"on_unbounded must be one of {ON_UNBOUNDED}, got '{on_unbounded}'")
        if tuple(kernel.batch_shape) != ():
            raise ValueError("the global kernel must have batch shape ()")
        if (likelihood is None) != (raw_X is None) or (raw_X is None) != (raw_y is None):
            raise ValueError("raw data need all of likelihood, raw_X and raw_y")
        if stack is None and likelihood is None:
            raise ValueError("a meta-GP needs modules, raw data or both")
        if collapsed and likelihood is not None and likelihood.name != "gaussian":
            raise ValueError("the collapsed bound needs Gaussian raw data; use collapsed=False")
        if stack is not None and stack.input_dim != inducing.shape[-1]:
            raise IncompatibleModulesError(f"the modules have input dimension "
                                           f"{stack.input_dim}, Z_* has {inducing.shape[-1]}")
        self.stack = stack
        self.collapsed = collapsed
        self.on_unbounded = on_unbounded
        self.check_every = check_every
        self.evaluations = 0
        input_dim = inducing.shape[-1]
        self.standardisation = standardisation or (
            stack.standardisation if stack is not None else
            Standardisation(np.zeros(input_dim), np.ones(input_dim), 0.0, 1.0))
        for parameter in kernel.parameters():
            parameter.requires_grad_(learn_kernel)
        self.layer = SparseGPLayer(kernel, inducing.clone(), (), learn_inducing=learn_inducing,
                                   jitter=jitter, learn_q=not collapsed)
        self._groups = stack.groups if stack is not None else ()
        self.likelihood = likelihood
        if likelihood is not None:
            likelihood.validate_targets(raw_y)
            self.register_buffer("raw_X", raw_X, persistent=False)
            self.register_buffer("raw_y", raw_y, persistent=False)

    @property
    def kernel(self) -> Kernel:
        return self.layer.kernel

    @property
    def inducing(self) -> torch.Tensor:
        """Z_* [M, D]."""
        return self.layer.inducing

    # Kernel evaluations -----------------------------------------------------------------------
    def cross_covariance(self, X: torch.Tensor) -> torch.Tensor:
        """k(Z_*, X) [M, N] under the global kernel for X [N, D]: every cross-covariance the
        meta-GP forms itself (module inducing inputs, raw data) — for the RBF one thin product
        and one exponential (:mod:`pyrogp_models.kernels.fused_rbf`)."""
        return self.kernel.weighted_cross(self.inducing, X)

    def module_covariance(self, inducing: torch.Tensor, other: torch.Tensor | None = None,
                          diagonal: bool = False, paired: bool = False) -> torch.Tensor:
        """k(Z_k, Z_k') [..., M_k, M_k'] under the global kernel for module inducing inputs
        batched over modules (``other`` None: K_kk^{(*)} = k(Z_k, Z_k); ``diagonal``: its
        diagonal [..., M_k]; ``paired``: k(z_i, z'_i) [..., P] row by row): every evaluation of
        the global kernel at the modules' inducing inputs."""
        if diagonal:
            return self.kernel.diag(inducing)
        if paired:
            return self.kernel.paired(inducing, other)
        return self.kernel(inducing, other)

    def site_trace(self) -> torch.Tensor:
        """Σ_k tr(P_k K_kk^{(*)}) from the diagonal and the entries above it of each K_kk^{(*)}
        (:class:`pyrogp_models.modules.stack.SiteTrace`): a third of the kernel entries for
        M_k = 3."""
        total = 0.0
        for trace in self.stack.sites.traces:
            total = total + (self.module_covariance(trace.inducing, diagonal=True)
                             * trace.diagonal).sum()
            if trace.off_diagonal.shape[-1]:
                pairs = self.module_covariance(trace.left, trace.right, paired=True)
                total = total + (pairs * trace.off_diagonal).sum()
        return total

    # Gaussian algebra -------------------------------------------------------------------------
    def prior_cholesky(self) -> torch.Tensor:
        """L_** = chol(K_** + jitter), [M, M]."""
        return self.layer.prior_cholesky()

    def _module_terms(self, prior_chol: torch.Tensor):
        """Per M_k-group: the group, B_k = L_**⁻¹K_*k [G, M, M_k] and K_kk^{(*)} [G, M_k, M_k]."""
        for group in self._groups:
            count, size = len(group.names), group.num_inducing
            cross = self.cross_covariance(group.inducing.reshape(count * size, -1))
            projection = conditionals.projection(prior_chol, cross)  # one solve for the group
            yield (group, projection.reshape(-1, count, size).transpose(0, 1),
                   self.module_covariance(group.inducing))

    def module_quadratic(self, prior_chol: torch.Tensor | None = None) -> ContrastiveQuadratic:
        """(P_w, η_w, c) of the contrastive sum Σ_k E_{q_C}[log q_k − log p_k] =
        −½tr(P_w S_v) − ½mᵀP_w m + η_wᵀm + c, from the cached site parameters
        (:func:`pyrogp_models.gaussian.expectations.site_quadratic`); zeros without modules."""
        prior_chol = self.prior_cholesky() if prior_chol is None else prior_chol
        size = self.num_inducing
        if not self._groups:
            return ContrastiveQuadratic(prior_chol.new_zeros(size, size),
                                        prior_chol.new_zeros(size), prior_chol.new_zeros(()))
        sites = self.stack.sites
        return site_quadratic(self._site_blocks(sites), prior_chol, self.site_trace(),
                              sites.constant)

    def _site_blocks(self, sites: StackedSites) -> Iterator[BlockTerms]:
        """The terms of every site block with its K_*b: for the RBF its factors, formed for all
        blocks at once and split (:class:`pyrogp_models.gaussian.expectations.ExpFactors`),
        otherwise each block's K_*b just before it is used."""
        factors = self.kernel.exponent_factors(self.inducing, sites.inputs)
        if factors is None:
            return ((self.cross_covariance(block.inputs), *block[1:]) for block in sites.blocks)
        left, right = factors
        parts = right.split([block.inputs.shape[0] for block in sites.blocks])
        return ((ExpFactors(left, part), *block[1:])
                for block, part in zip(sites.blocks, parts, strict=True))

    def contrastive_predictives(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """q_C(u_k) = N(m_C, S_C) per M_k-group (eq. 17, whitened): means [G, M_k] and
        covariances [G, M_k, M_k]."""
        return [conditionals.whitened_conditional_full(projection, prior_cov, self.q_mean,
                                                       self.q_sqrt)
                for _, projection, prior_cov in self._module_terms(self.prior_cholesky())]

    def contrastive_terms(self) -> torch.Tensor:
        """E_{q_C(u_k)}[log q_k(u_k) − log p_k(u_k)] per module, in stack order; [K]."""
        if self.stack is None:
            return self.q_mean.new_zeros(0)
        return score_modules(self.stack, self.contrastive_predictives())

    def kl(self) -> torch.Tensor:
        """KL[q(v) ‖ N(0, I)] = KL[q(u_*) ‖ p(u_*)]."""
        return self.layer.kl()

    def latent(self, X: torch.Tensor, prior_chol: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginals of q(f) at X [N, D] (model units): mean and variance [N] (``prior_chol``:
        L_** if already factorised)."""
        return self.layer.marginals(X, prior_chol=prior_chol)

    def expected_log_lik(self, prior_chol: torch.Tensor | None = None) -> torch.Tensor:
        """Σ_i E_{q(f_i)}[log p(y_i | f_i)] over the raw data (0 without raw data)."""
        if self.likelihood is None:
            return self.q_mean.new_zeros(())
        latent = self.latent(self.raw_X, prior_chol)
        return self.likelihood.expected_log_prob(self.raw_y, *latent).sum()

    def contrastive_sum(self, quadratic: ContrastiveQuadratic | None = None) -> torch.Tensor:
        """Σ_k E_{q_C(u_k)}[log q_k(u_k) − log p_k(u_k)] at the current q(v), through the
        quadratic form (``quadratic``: :meth:`module_quadratic` if already computed)."""
        quadratic = self.module_quadratic() if quadratic is None else quadratic
        return evaluate_quadratic(quadratic, self.q_mean, self.q_sqrt)

    def bound(self) -> torch.Tensor:
        """L_E (eq. 6), or the combined bound (eq. 19) with raw data, at the current q(v)."""
        prior_chol = self.prior_cholesky()
        return (self.contrastive_sum(self.module_quadratic(prior_chol))
                + self.expected_log_lik(prior_chol) - self.kl())

    # Collapsed form ---------------------------------------------------------------------------
    def bound_quadratic(self) -> ContrastiveQuadratic:
        """(Λ_w, η_w, c) with bound = −½tr(Λ_w S) − ½mᵀΛ_w m + η_wᵀm + ½log|S| + M/2 + c.

        Λ_w includes the KL's identity and, for Gaussian raw data, its exact quadratic form;
        other raw-data likelihoods are left out (they add curvature for log-concave p(y|f))."""
        prior_chol = self.prior_cholesky()
        return self._with_kl_and_data(self.module_quadratic(prior_chol), prior_chol)

    def _with_kl_and_data(self, modules: ContrastiveQuadratic, prior_chol: torch.Tensor
                          ) -> ContrastiveQuadratic:
        """Λ_w, η_w, c from the modules' quadratic form: + I (the KL) and the Gaussian raw data's
        exact quadratic form."""
        precision, shift, constant = modules
        precision = precision + torch.eye(self.num_inducing, dtype=precision.dtype,
                                          device=precision.device)
        if self.likelihood is not None and self.likelihood.name == "gaussian":
            noise = self.likelihood.variance
            A = conditionals.projection(prior_chol, self.cross_covariance(self.raw_X))
            precision = precision + A @ A.mT / noise
            shift = shift + A @ self.raw_y / noise
            residual = self.raw_y.square() + self.kernel.diag(self.raw_X) - A.square().sum(-2)
            constant = constant - 0.5 * (self.raw_y.numel() * (_LOG_2PI + noise.log())
                                         + residual.sum() / noise)
        return ContrastiveQuadratic(precision, shift, constant)

    def collapsed_bound(self, quadratic: ContrastiveQuadratic | None = None) -> torch.Tensor:
        """L_E^* = ½η_wᵀΛ_w⁻¹η_w − ½log|Λ_w| + c, the bound at the optimal q(v)
        (``quadratic``: :meth:`bound_quadratic` if already computed)."""
        precision, shift, constant = quadratic if quadratic is not None else self.bound_quadratic()
        chol = self.precision_cholesky(precision)
        whitened_shift = triangular_solve(chol, shift.unsqueeze(-1)).squeeze(-1)
        return (0.5 * whitened_shift.square().sum() - chol.diagonal().log().sum() + constant)

    @torch.no_grad()
    def optimal_posterior(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The optimal q(v) = N(Λ_w⁻¹η_w, Λ_w⁻¹): mean [M] and lower Cholesky factor [M, M]."""
        precision, shift, _ = self.bound_quadratic()
        mean = cholesky_solve(self.precision_cholesky(precision), shift.unsqueeze(-1))
        return mean.squeeze(-1), inverse_cholesky(precision, what="meta-GP precision Λ_w")

    @torch.no_grad()
    def set_optimal_posterior(self) -> None:
        """Overwrite q(v) with its optimum for the current ψ_*, Z_* (and likelihood)."""
        self.layer.set_whitened_posterior(*self.optimal_posterior())

    # Boundedness guard ------------------------------------------------------------------------
    def _unbounded_suspects(self) -> list[str]:
        """The modules whose site precision is indefinite (under-fitted)."""
        return self.stack.indefinite_sites() if self.stack is not None else []

    def _unbounded_message(self, smallest: float, suspects: list[str]) -> str:
        return (f"{describe_unbounded(smallest, suspects)}. Repair the modules with "
                "clip_site_precisions (repair_sites=True) or fix the global kernel to the "
                "modules'.")

    # Pyro model / guide -----------------------------------------------------------------------
    @pyro_method
    def model(self):
        """Whitened prior v ~ N(0, I); the contrastive sum and raw-data term as factors (or the
        collapsed bound alone). The boundedness guard reuses this evaluation's Λ_w."""
        if self.collapsed:
            quadratic = self.bound_quadratic()
            self.guard_evaluation(lambda: quadratic.precision)
            pyro.factor(self._pyro_get_fullname("collapsed"), self.collapsed_bound(quadratic))
            return
        prior_chol = self.prior_cholesky()
        modules = self.module_quadratic(prior_chol)
        self.guard_evaluation(lambda: self._with_kl_and_data(modules, prior_chol).precision)
        self.layer.sample(self._pyro_get_fullname("u"), posterior=False)
        if self.stack is not None:
            pyro.factor(self._pyro_get_fullname("contrastive"), self.contrastive_sum(modules))
        if self.likelihood is not None:
            pyro.factor(self._pyro_get_fullname("data"), self.expected_log_lik(prior_chol))

    @pyro_method
    def guide(self, *args, **kwargs):
        """q(v) = N(m, LLᵀ) (nothing in collapsed mode: q is implicit); arguments are ignored."""
        if not self.collapsed:
            self.layer.sample(self._pyro_get_fullname("u"), posterior=True)

    @pyro_method
    def predictive_model(self, X: torch.Tensor):
        """v ~ N(0, I), f | v at X [N, D] (model units) and y | f under the exported
        likelihood (:func:`choose_likelihood`): sites ``u``, ``f`` [N], ``y`` [N]."""
        v = self.layer.sample(self._pyro_get_fullname("u"), posterior=False)
        mean, var = self.layer.conditional_on(v, X)
        f = pyro.sample(self._pyro_get_fullname("f"),
                        dist.Normal(mean, var.sqrt().expand_as(mean)).to_event(1))
        return f, pyro.sample(self._pyro_get_fullname("y"),
                              self.output_likelihood().distribution(f).to_event(1))

    @pyro_method
    def predictive_guide(self, *args, **kwargs):
        """q(v) for :meth:`predictive_model` (collapsed: its optimum); arguments are ignored."""
        if self.collapsed:
            self.set_optimal_posterior()
        self.layer.sample(self._pyro_get_fullname("u"), posterior=True)

    def natural_gradient_objectives(self) -> list:
        """The layer, conjugate (a concave quadratic in q) unless non-Gaussian raw data make the
        bound's safeguard necessary."""
        if self.collapsed:
            return []
        conjugate = self.likelihood is None or self.likelihood.name == "gaussian"
        return [(self.layer, None if conjugate else self.bound)]

    def member_objectives(self, precise: bool = False) -> list:
        """The meta-GP as one member of the library's L-BFGS
        (:mod:`pyrogp_models.inference.batched_lbfgs`): its parameters and the negative (collapsed)
        bound, [1] (computed to rounding whether or not ``precise`` is asked). A trial point where
        Λ_w is not positive definite — in floating point, e.g. far out on a line search — gives a
        non-finite value there and is rejected, where a strong-Wolfe line search would stop the
        fit; the boundedness guard judges the starting and the final point."""
        params = [p for p in self.parameters() if p.requires_grad]
        if self.collapsed:
            return [(params, lambda: -self.collapsed_bound().reshape(1))]
        return [(params, lambda: -self.bound().reshape(1))]

    def held_parameters(self) -> list[torch.nn.Parameter]:
        """Z_*, which the trainer may hold late in a fit to pin ψ_* (and q(v))
        (:class:`~pyrogp_models.inference.protocols.HeldParameters`)."""
        return self.layer.inducing_parameters()

    @torch.no_grad()
    def output_likelihood(self) -> Likelihood:
        """The likelihood the exported module predicts with (:func:`choose_likelihood`)."""
        name, options, params, _ = choose_likelihood(self.stack, self.likelihood)
        return make_likelihood(name, (), self.q_mean.dtype, self.q_mean.device, **options,
                               **params).requires_grad_(False)

    # Export -------------------------------------------------------------------------------------
    @torch.no_grad()
    def to_module(self, likelihood: str | None = None, likelihood_options: dict | None = None,
                  likelihood_params: dict | None = None, name: str | None = None) -> Module:
        """The meta-GP as a :class:`Module` (unwhitened q(u_*), global kernel, Z_*), so it can be
        recycled again or used for predictions. The likelihood follows
        :func:`choose_likelihood`; N = Σ N_k + N_raw; ``elbo`` = Σ_k L_k + the final bound (the
        module-driven evidence estimate of "Modular Gaussian Processes for Transfer Learning",
        NeurIPS 2021), with the bound itself in ``info``."""
        if self.collapsed:
            self.set_optimal_posterior()
        bound = float(self.bound())
        q_mean, q_chol = conditionals.unwhiten(self.prior_cholesky(), self.q_mean, self.q_sqrt)
        lik_name, options, params, source = choose_likelihood(
            self.stack, self.likelihood, likelihood, likelihood_options, likelihood_params)
        num_raw = 0 if self.likelihood is None else int(self.raw_y.numel())
        module_elbos = self.stack.elbo_sum if self.stack is not None else 0.0
        name = name or self._pyro_name
        return Module(
            kernel=frozen(self.kernel.batched((1,))),
            likelihood_name=lik_name, likelihood_options=options, likelihood_params=params,
            inducing=self.inducing.detach().clone(), q_mean=q_mean.unsqueeze(0),
            q_chol=q_chol.unsqueeze(0),
            num_data=(self.stack.num_data if self.stack is not None else 0) + num_raw,
            elbo=module_elbos + bound, standardisation=self.standardisation,
            jitter=self.jitter,
            info={"name": name, "kind": "meta-gp",
                  "modules": self.stack.names if self.stack is not None else [],
                  "num_raw_data": num_raw, "ensemble_bound": bound,
                  "module_elbo_sum": module_elbos, "likelihood_source": source,
                  "collapsed": self.collapsed})


def common_likelihood(modules: Iterable[Module]) -> str:
    """The likelihood the modules share (name and options); :class:`MixedLikelihoodsError`
    when they differ."""
    modules = list(modules)
    kinds = {(m.likelihood_name, repr(sorted(m.likelihood_options.items()))) for m in modules}
    if len(kinds) > 1:
        names = sorted({m.likelihood_name for m in modules})
        found = ", ".join(names) if len(names) > 1 else f"{names[0]} with different options"
        raise MixedLikelihoodsError(
            f"the modules have different likelihoods ({found}); name the one to use "
            "(e.g. likelihood='gaussian')", found)
    return modules[0].likelihood_name


def choose_likelihood(stack: ModuleStack | None, raw_likelihood: Likelihood | None,
                      name: str | None = None, options: dict | None = None,
                      params: dict | None = None
                      ) -> tuple[str, dict, dict[str, torch.Tensor], str]:
    """The likelihood of an exported meta-GP: (name, options, parameter values, source).

    The meta bound has no likelihood of its own (Recyclable GPs, §2.3 "Global prediction",
    predicts with the meta-GP's own fixed likelihood), so one is chosen by this rule:

    1. ``name`` given ("user"): options from ``options``, else from the raw data or modules with
       that likelihood; each parameter from ``params``, else learned from raw data with that
       likelihood, else the N_k-weighted mean over the modules with that likelihood;
    2. otherwise, with raw data ("raw data"): the raw data's likelihood and learned parameters;
    3. otherwise ("modules"): the modules' likelihood when all agree on name and options, with
       N_k-weighted mean parameters; heterogeneous modules need ``name``.
    """
    members = list(stack.modules.values()) if stack is not None else []
    if name is None and raw_likelihood is not None:
        name, source = raw_likelihood.name, "raw data"
    elif name is None:
        name, source = common_likelihood(members), "modules"
    else:
        source = "user"
    if name not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood '{name}'; choose from {sorted(LIKELIHOODS)}")
    same = [m for m in members if m.likelihood_name == name]
    raw = raw_likelihood if raw_likelihood is not None and raw_likelihood.name == name else None
    if options is None:
        options = (raw.options() if raw is not None
                   else dict(same[0].likelihood_options) if same else {})
    values = {}
    for key in LIKELIHOODS[name].PARAMETERS:
        if params is not None and key in params:
            values[key] = torch.as_tensor(params[key], dtype=torch.float64)
        elif raw is not None:
            values[key] = raw.parameter_values()[key].detach().clone()
        elif same:
            stacked = torch.stack([m.likelihood_params[key].to(torch.float64) for m in same])
            weights = torch.tensor([float(m.num_data) for m in same], dtype=torch.float64,
                                   device=stacked.device)
            values[key] = (weights * stacked).sum() / weights.sum()
        else:
            raise ValueError(f"no value for the {name} likelihood's '{key}': no module or raw "
                             "data has that likelihood; pass likelihood_params")
    return name, dict(options), values, source
