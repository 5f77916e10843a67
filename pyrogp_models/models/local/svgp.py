"""Many sparse variational GPs (Hensman et al. 2015) fitted as one batched Pyro model.

K partitions share one number of inducing inputs M. Each partition k has its own inducing inputs
Z_k, kernel hyperparameters, likelihood parameters and, for each of its L latent functions, a
whitened q(v_kl) — one :class:`~pyrogp_models.layers.SparseGPLayer` with batch (K, L). Partitions
of unequal size are padded and masked; the data are bound to the model (non-persistent buffers:
never in a checkpoint).

The ELBO of partition k (Hensman et al. 2015, eq. 4) is

    L_k = Σ_{i ∈ D_k} E_{q(f_i)}[log p(y_i | f_i)] − KL[q(v_k) ‖ N(0, I)].

In the Pyro model the whitened v is a latent site with an N(0, I) prior and the guide is q(v), so
``TraceMeanField_ELBO`` evaluates the KL analytically; the data term enters as a ``pyro.factor``
computed in closed form (or by deterministic quadrature) from q's parameters, so the objective is
the exact ELBO with no sampling noise. With ``collapsed=True`` (Gaussian likelihoods) the model's
only term is Titsias' bound (:mod:`~pyrogp_models.models.local.collapsed`), the guide is empty
and q(v) is its optimum.

``model``, ``guide`` and ``predictive_model`` run in Pyro's module context, so ``pyro.infer.SVI``
trains every parameter and ``pyro.infer.Predictive`` draws v, f and y. An ``offset`` [K, N] added
to the latent mean lets a user's own Pyro model put the GP on the residual of its other terms.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, pyro_method

from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.linalg import DEFAULT_JITTER
from pyrogp_models.kernels import Kernel, describable
from pyrogp_models.layers import OneLayer, SparseGPLayer, unique_name
from pyrogp_models.likelihoods import Likelihood, latent_layout
from pyrogp_models.models.local import collapsed


class BatchedSVGP(OneLayer, PyroModule):
    """K independent SVGPs sharing M, as one Pyro model/guide pair, with their data bound;
    ``q_mean`` [K, L, M] and ``q_sqrt`` [K, L, M, M] are the layer's whitened q(v). The model
    maximises Σ_k L_k, each L_k the SVGP ELBO of Hensman et al. (2015, eq. 4), or with
    ``collapsed=True`` Titsias' (2009, eq. 9) bound.

    Args:
        inducing: initial Z [K, M, D].
        kernel: a :class:`~pyrogp_models.kernels.base.Kernel` with batch shape (K, L).
        likelihood: a likelihood with batch shape (K,); L = ``likelihood.num_latent``.
        X, y, mask: the partitions' data, padded: [K, N, D], [K, N], [K, N] (True on real
            points); without them, methods take the data as arguments.
        learn_inducing: optimise Z (otherwise it is a fixed buffer).
        inducing_scale: [K, D] scale of each partition's coordinates for Z (e.g. the spread of
            its inputs); without it Z is optimised in the shared input coordinates.
        collapsed: train on Titsias' collapsed bound (Gaussian likelihood; q(v) implicit).
        batch_size: positions of the padded data drawn per evaluation, shared by all partitions
            (uncollapsed bound only; see :meth:`model`).
        jitter: relative jitter on K_zz.
        name: the Pyro name (default: a fresh ``"svgp"``).
    """

    def __init__(self, inducing: torch.Tensor, kernel: Kernel, likelihood: Likelihood,
                 X: torch.Tensor | None = None, y: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, *,
                 learn_inducing: bool = True, inducing_scale: torch.Tensor | None = None,
                 collapsed: bool = False, batch_size: int | None = None,
                 jitter: float = DEFAULT_JITTER, name: str | None = None):
        super().__init__(name or unique_name("svgp"))
        num_partitions, _, _ = inducing.shape
        num_latent = likelihood.num_latent
        if tuple(kernel.batch_shape) != (num_partitions, num_latent):
            raise ValueError(f"kernel batch shape {tuple(kernel.batch_shape)} != "
                             f"(partitions, latents) = {(num_partitions, num_latent)}")
        if collapsed and likelihood.name != "gaussian":
            raise ValueError("the collapsed bound is only available for a Gaussian likelihood")
        if collapsed and batch_size is not None:
            raise ValueError("the collapsed bound uses all data; minibatches need the "
                             "uncollapsed ELBO")
        self.layer = SparseGPLayer(
            kernel, inducing.unsqueeze(-3), (num_partitions, num_latent),
            learn_inducing=learn_inducing, jitter=jitter, learn_q=not collapsed,
            inducing_scale=None if inducing_scale is None else inducing_scale.unsqueeze(-2))
        self.likelihood = likelihood
        self.collapsed = collapsed
        self.batch_size = batch_size
        if mask is None and X is not None:
            mask = torch.ones(X.shape[:-1], dtype=torch.bool, device=X.device)
        self.register_buffer("data_X", X, persistent=False)
        self.register_buffer("data_y", y, persistent=False)
        self.register_buffer("data_mask", mask, persistent=False)

    # Shapes -------------------------------------------------------------------------------------
    @property
    def kernel(self) -> Kernel:
        return self.layer.kernel

    @property
    def inducing(self) -> torch.Tensor:
        """Z [K, M, D]."""
        return self.layer.inducing.squeeze(-3)

    @property
    def num_partitions(self) -> int:
        return self.layer.batch_shape[0]

    @property
    def num_latent(self) -> int:
        return self.likelihood.num_latent

    # Gaussian algebra -------------------------------------------------------------------------
    def prior_cholesky(self, check: bool | None = None) -> torch.Tensor:
        """chol(K_zz + jitter) of shape [K, L, M, M]."""
        return self.layer.prior_cholesky(check)

    def inverse_form(self, requested: bool | None = None) -> bool:
        """Whether to evaluate q(f) in the inverse form (see
        :mod:`~pyrogp_models.gaussian.conditionals`): ``requested`` if given, else where it is
        accurate (float64, jitter ≥ 10⁻⁶)."""
        if requested is not None:
            return requested
        return conditionals.inverse_form_ready(self.q_mean.dtype, self.jitter)

    def latent(self, X: torch.Tensor, prior_chol: torch.Tensor | None = None,
               inverse_form: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginals of q(f) at X [K, N, D], in the likelihood's layout ([K, N] or [K, N, L])."""
        X_ = X.unsqueeze(-3)
        if self.inverse_form(inverse_form):
            prior_chol = self.prior_cholesky() if prior_chol is None else prior_chol
            alpha, B = conditionals.inverse_form(prior_chol, self.q_mean, self.q_sqrt)
            mean, var = conditionals.inverse_form_conditional(
                self.kernel.weighted_cross(X_, self.layer.inducing), self.kernel.diag(X_),
                alpha, B)
        else:
            mean, var = self.layer.marginals(X_, prior_chol=prior_chol)
        return latent_layout(mean), latent_layout(var)

    def kl(self) -> torch.Tensor:
        """KL[q(v_k) ‖ N(0, I)] summed over latent functions; [K]."""
        return self.layer.kl().sum(-1)

    def expected_log_lik(self, X, y, weights, inverse_form: bool | None = None,
                         offset: torch.Tensor | None = None) -> torch.Tensor:
        """Σ_i w_ki E_q[log p(y_ki | f_ki + offset_ki)] per partition; [K]. Weights mask padding
        or rescale a minibatch."""
        if self.likelihood.name == "gaussian":
            targets = y if offset is None else y - offset
            return self._gaussian_expected_log_lik(X, targets, weights,
                                                   self.inverse_form(inverse_form))
        mean, var = self.latent(X, inverse_form=inverse_form)
        mean = mean if offset is None else mean + offset
        return (self.likelihood.expected_log_prob(y, mean, var) * weights).sum(-1)

    def _gaussian_expected_log_lik(self, X, y, weights, inverse_form: bool) -> torch.Tensor:
        """The Gaussian data term from M×M statistics of the data, in closed form.

        E = −½Σw·log 2πσ² − (Σ w(y − m)² + Σ wv)/(2σ²) with W = diag(w) and either
        Φ = AWAᵀ, ψ = AWy (A = L⁻¹K_zx):
            Σ w(y − m)² = Σ wy² − 2m_wᵀψ + m_wᵀΦm_w,   Σ wv = Σ wk_ii − tr Φ + tr(L_wᵀΦL_w);
        or, in the inverse form, Ψ₂ = K_zxWK_xz, Ψ₁ = K_zxWy:
            Σ w(y − m)² = Σ wy² − 2αᵀΨ₁ + αᵀΨ₂α,   Σ wv = Σ wk_ii + tr(BΨ₂).
        Both equal the pointwise sum with fewer operations of size N×M; the inverse form needs
        no triangular solve against N right-hand sides.
        """
        if inverse_form:
            gram, projected_y = self.weighted_gram(X, y, weights)
            vector, B = conditionals.inverse_form(self.prior_cholesky(), self.q_mean, self.q_sqrt)
            spread = (gram * B).sum((-2, -1))
        else:
            A = self.layer.projection(X.unsqueeze(-3))
            weighted_A = A * weights.sqrt().unsqueeze(-2).unsqueeze(-2)  # A√W, [K, 1, M, N]
            gram = weighted_A @ weighted_A.mT
            projected_y = (weighted_A @ (weights.sqrt() * y).unsqueeze(-2).unsqueeze(-1)
                           ).squeeze(-1)
            vector, chol_w = self.q_mean, self.q_sqrt
            spread = (-gram.diagonal(dim1=-2, dim2=-1).sum(-1)
                      + ((gram @ chol_w) * chol_w).sum((-2, -1)))
        fit = (-2.0 * (projected_y * vector).sum(-1)
               + (vector * (gram @ vector.unsqueeze(-1)).squeeze(-1)).sum(-1))
        residual = (weights * y.square()).sum(-1).unsqueeze(-1) + fit
        spread = spread + (self.kernel.diag(X.unsqueeze(-3)) * weights.unsqueeze(-2)).sum(-1)
        noise = self.likelihood.variance
        return (-0.5 * weights.sum(-1) * torch.log(2 * math.pi * noise)
                - 0.5 * (residual + spread).squeeze(-1) / noise)

    def weighted_gram(self, X, y, weights) -> tuple[torch.Tensor, torch.Tensor]:
        """Ψ₂ = K_zxWK_xz [K, L, M, M] and Ψ₁ = K_zxWy [K, L, M], W = diag(w): the data enter
        the Gaussian bounds only through these."""
        return self.kernel.weighted_gram(X.unsqueeze(-3), self.layer.inducing,
                                         weights.unsqueeze(-2), y.unsqueeze(-2))

    def elbo(self, X=None, y=None, mask=None) -> torch.Tensor:
        """The exact ELBO of every partition on full data (the bound data by default), in the
        projected form; [K]."""
        X, y, mask = self._data(X, y, mask)
        return self.expected_log_lik(X, y, mask.to(X.dtype), inverse_form=False) - self.kl()

    def data_term(self, offset: torch.Tensor | None = None, precise: bool = False
                  ) -> torch.Tensor:
        """Σ_i E_q[log p(y_i | f_i + offset_i)] per partition [K] on the bound data; with a
        ``batch_size``, estimated without bias from B positions of the padded layout drawn
        without replacement (:meth:`pointwise_data_term` scaled by N_max/B, as the
        subsampled plate of :meth:`model` scales it); ``precise``: never in the inverse form."""
        if self.batch_size is None:
            return self.expected_log_lik(self.data_X, self.data_y, self.data_mask.to(
                self.data_X.dtype), inverse_form=False if precise else None, offset=offset)
        size = self.data_X.shape[1]
        positions = torch.randperm(size, device=self.data_X.device)[:self.batch_size]
        return self.pointwise_data_term(positions, offset).sum(-1) * (size / len(positions))

    def pointwise_data_term(self, positions: torch.Tensor,
                            offset: torch.Tensor | None = None) -> torch.Tensor:
        """E_q[log p(y_ki | f_ki + offset_ki)] at the positions [B] of every partition's padded
        data, zero on padding; [K, B]."""
        X, y = self.data_X[:, positions], self.data_y[:, positions]
        mean, var = self.latent(X, inverse_form=False)
        mean = mean if offset is None else mean + offset[:, positions]
        terms = self.likelihood.expected_log_prob(y, mean, var)
        return torch.where(self.data_mask[:, positions], terms, 0.0)

    def objective(self, offset: torch.Tensor | None = None, precise: bool = False
                  ) -> torch.Tensor:
        """What training maximises, per partition [K]: the collapsed bound, or the ELBO.
        ``precise`` evaluates it to rounding (not in the faster inverse form, whose value and
        gradient carry errors of about cond(K_zz)·ε)."""
        if self.collapsed:
            targets = self.data_y if offset is None else self.data_y - offset
            return collapsed.collapsed_bound(self, self.data_X, targets, self.data_mask,
                                             inverse_form=False if precise else None)
        return self.data_term(offset, precise) - self.kl()

    def member_objectives(self, precise: bool = False) -> list:
        """(parameters, −objective [K]): the K partitions are independent members, so an
        optimiser may keep one memory and one step length per partition. A kernel from outside
        the library keeps one copy per partition with no member dimension: the K partitions are
        then one member, −Σ_k objective_k [1]."""
        parameters = [p for p in self.parameters() if p.requires_grad]
        if not describable(self.kernel) and math.prod(self.kernel.batch_shape) > 1:
            return [(parameters, lambda: -self.objective(precise=precise).sum().reshape(1))]
        return [(parameters, lambda: -self.objective(precise=precise))]

    def held_parameters(self) -> list[torch.nn.Parameter]:
        """Z, which the trainer may hold late in a fit to pin the rest
        (:class:`~pyrogp_models.inference.protocols.HeldParameters`)."""
        return self.layer.inducing_parameters()

    def _data(self, X, y, mask):
        if X is not None:
            return X, y, torch.ones(X.shape[:-1], dtype=torch.bool, device=X.device) \
                if mask is None else mask
        if self.data_X is None:
            raise ValueError("this SVGP has no data bound; pass X, y (and mask)")
        return self.data_X, self.data_y, self.data_mask

    # Pyro model / guide -----------------------------------------------------------------------
    @pyro_method
    def model(self, offset: torch.Tensor | None = None):
        """Whitened prior v ~ N(0, I); the expected log-likelihood as a factor (or the collapsed
        bound alone). ``offset`` [K, N] (padded like the data) is added to the latent mean. With
        a ``batch_size`` B the factor is per position [B] inside ``pyro.plate(...,
        subsample_size=B)`` over the N_max positions of the padded data (shared by all
        partitions, drawn without replacement), which scales it by N_max/B."""
        if self.collapsed:
            pyro.factor(self._pyro_get_fullname("collapsed"), self.objective(offset).sum())
            return
        self.layer.sample(self._pyro_get_fullname("u"), posterior=False)
        if self.batch_size is None:
            pyro.factor(self._pyro_get_fullname("data"), self.data_term(offset).sum())
            return
        size = self.data_X.shape[1]
        with pyro.plate(self._pyro_get_fullname("points"), size,
                        subsample_size=min(self.batch_size, size), device=self.data_X.device,
                        dim=-1) as positions:
            pyro.factor(self._pyro_get_fullname("data"),
                        self.pointwise_data_term(positions, offset).sum(0))

    @pyro_method
    def guide(self, *args, **kwargs):
        """q(v) per partition and latent function (nothing for the collapsed bound, whose q is
        implicit). Arguments of the model are accepted and ignored."""
        if not self.collapsed:
            self.layer.sample(self._pyro_get_fullname("u"), posterior=True)

    @pyro_method
    def predictive_model(self, X: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """v ~ N(0, I), f | v at X [K, N, D] (default: the bound inputs, padded) and y | f, as
        sample sites ``u``, ``f`` [K, N(, L)] and ``y`` [K, N]. With :meth:`predictive_guide`,
        ``pyro.infer.Predictive`` draws from the posterior predictive."""
        X = self.data_X if X is None else X
        v = self.layer.sample(self._pyro_get_fullname("u"), posterior=False)
        mean, var = self.layer.conditional_on(v, X.unsqueeze(-3))
        mean, var = latent_layout(mean), latent_layout(var)
        event = mean.dim() - v.dim() + 3  # K and N (and L) dimensions
        f = pyro.sample(self._pyro_get_fullname("f"),
                        dist.Normal(mean, var.sqrt().expand_as(mean)).to_event(event))
        y = pyro.sample(self._pyro_get_fullname("y"),
                        self.likelihood.distribution(f).to_event(2))
        return f, y

    @pyro_method
    def predictive_guide(self, *args, **kwargs):
        """q(v) for :meth:`predictive_model` (for the collapsed bound: its optimum)."""
        if self.collapsed:
            self.finalise()
        self.layer.sample(self._pyro_get_fullname("u"), posterior=True)

    @torch.no_grad()
    def finalise(self) -> None:
        """Write the collapsed bound's optimal q(v) into the layer (nothing when uncollapsed)."""
        if self.collapsed:
            collapsed.set_optimal_posterior(self, self.data_X, self.data_y, self.data_mask)

    def natural_gradient_objectives(self) -> list:
        """The layer and, for a non-conjugate likelihood, its per-partition ELBO [K] on the full
        data, which safeguards natural-gradient steps
        (:mod:`pyrogp_models.inference.natural_gradient`)."""
        if self.collapsed:
            return []
        return [(self.layer, None if self.likelihood.name == "gaussian" else self.elbo)]

    # Export -----------------------------------------------------------------------------------
    @torch.no_grad()
    def unwhitened_posterior(self) -> tuple[torch.Tensor, torch.Tensor]:
        """q(u) = N(L m, (L L_w)(L L_w)ᵀ): mean [K, L, M] and lower Cholesky factor [K, L, M, M]."""
        return self.layer.unwhitened_posterior()

