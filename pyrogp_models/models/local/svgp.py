"""Many sparse variational GPs (Hensman et al. 2015) fitted as one batched Pyro model.

K partitions share one number of inducing inputs M. Each partition k has its own inducing inputs
Z_k, kernel hyperparameters, likelihood parameters and whitened q(v_k) = N(m_k, L_k L_kᵀ) for every
latent function, with u_k = chol(K_zz) v_k. Partitions of unequal size are padded and masked.

The ELBO of partition k (Hensman et al. 2015, eq. 4) is

    L_k = Σ_{i ∈ D_k} E_{q(f_i)}[log p(y_i | f_i)] − KL[q(v_k) ‖ N(0, I)].

In the Pyro model, ``u`` is a latent site with a whitened N(0, I) prior and the guide is q(v);
``TraceMeanField_ELBO`` evaluates the KL analytically, and the data term enters as a ``pyro.factor``
computed in closed form (or by Gauss–Hermite quadrature) from q's parameters, so the training
objective is the exact ELBO with no sampling noise. :meth:`BatchedSVGP.elbo` computes the same
quantity without Pyro, per partition.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam

from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.kullback_leiblers import kl_to_standard_normal
from pyrogp_models.gaussian.linalg import cholesky
from pyrogp_models.kernels import Stationary
from pyrogp_models.likelihoods import Gaussian, Likelihood

#: Default relative jitter on K_zz (× its mean diagonal).
DEFAULT_JITTER = 1e-6


class BatchedSVGP(PyroModule):
    """K independent SVGPs sharing M, as one Pyro model/guide pair.

    Args:
        inducing: initial Z of shape [K, M, D].
        kernel: a :class:`Stationary` kernel with batch shape (K, L).
        likelihood: a likelihood with batch shape (K,); L = ``likelihood.num_latent``.
        learn_inducing: optimise Z (otherwise it is a fixed buffer).
        jitter: relative jitter on K_zz.
        name: prefix for Pyro sample sites, so several models can share one trace.
        inducing_scale: [K, D] scale of each partition's coordinates for Z (e.g. the spread of
            its inputs); without it Z is optimised in the shared input coordinates.
    """

    def __init__(self, inducing: torch.Tensor, kernel: Stationary, likelihood: Likelihood,
                 learn_inducing: bool = True, jitter: float = DEFAULT_JITTER,
                 name: str = "svgp", inducing_scale: torch.Tensor | None = None):
        super().__init__(name)
        num_partitions, num_inducing, _ = inducing.shape
        num_latent = likelihood.num_latent
        if tuple(kernel.batch_shape) != (num_partitions, num_latent):
            raise ValueError(f"kernel batch shape {tuple(kernel.batch_shape)} != "
                             f"(partitions, latents) = {(num_partitions, num_latent)}")
        self.kernel = kernel
        self.likelihood = likelihood
        self.jitter = jitter
        self.site_prefix = name
        if inducing_scale is None:
            centre, scale = inducing.new_zeros(()), inducing.new_ones(())
        else:
            centre = inducing.mean(-2, keepdim=True)
            scale = inducing_scale.to(inducing).unsqueeze(-2)
        self.register_buffer("inducing_centre", centre)
        self.register_buffer("inducing_scale", scale)
        unit = ((inducing - centre) / scale).clone()
        if learn_inducing:
            self.inducing_unit = PyroParam(unit)
        else:
            self.register_buffer("inducing_unit", unit)
        shape = (num_partitions, num_latent, num_inducing)
        self.q_mean = PyroParam(inducing.new_zeros(shape))
        eye = torch.eye(num_inducing, dtype=inducing.dtype, device=inducing.device)
        self.q_sqrt = PyroParam(eye.expand(*shape, num_inducing).clone(),
                                constraint=constraints.lower_cholesky)

    @property
    def inducing(self) -> torch.Tensor:
        """Z = c + s·Z̃ [K, M, D]: optimised as Z̃ in each partition's own coordinates (centre c,
        scale s), so an optimiser step moves every partition's Z in proportion to its spread."""
        return self.inducing_centre + self.inducing_scale * self.inducing_unit

    @property
    def num_partitions(self) -> int:
        return self.inducing.shape[0]

    @property
    def num_inducing(self) -> int:
        return self.inducing.shape[1]

    @property
    def num_latent(self) -> int:
        return self.likelihood.num_latent

    # Gaussian algebra -------------------------------------------------------------------------
    def prior_cholesky(self, check: bool = True) -> torch.Tensor:
        """chol(K_zz + jitter) of shape [K, L, M, M]."""
        Z = self.inducing.unsqueeze(-3)
        return cholesky(self.kernel(Z), self.jitter, what="inducing covariance K_zz",
                        check=check)

    def inverse_form(self, requested: bool | None = None) -> bool:
        """Whether to evaluate q(f) in the inverse form
        (:mod:`pyrogp_models.gaussian.conditionals`):
        ``requested`` if given, else whenever it is accurate (float64, jitter ≥ 10⁻⁶)."""
        if requested is not None:
            return requested
        return conditionals.inverse_form_ready(self.q_mean.dtype, self.jitter)

    def latent(self, X: torch.Tensor, prior_chol: torch.Tensor | None = None,
               inverse_form: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginals of q(f) at X [K, N, D], in the likelihood's layout ([K, N] or [K, N, L])."""
        prior_chol = self.prior_cholesky() if prior_chol is None else prior_chol
        X_, Z_ = X.unsqueeze(-3), self.inducing.unsqueeze(-3)
        if self.inverse_form(inverse_form):
            alpha, B = conditionals.inverse_form(prior_chol, self.q_mean, self.q_sqrt)
            mean, var = conditionals.inverse_form_conditional(
                self.kernel.weighted_cross(X_, Z_), self.kernel.diag(X_), alpha, B)
        else:
            A = conditionals.projection(prior_chol, self.kernel(Z_, X_))
            mean, var = conditionals.whitened_conditional(A, self.kernel.diag(X_), self.q_mean,
                                                          self.q_sqrt)
        return latent_layout(mean), latent_layout(var)

    def kl(self) -> torch.Tensor:
        """KL[q(v_k) ‖ N(0, I)] summed over latent functions; [K]."""
        return kl_to_standard_normal(self.q_mean, self.q_sqrt).sum(-1)

    def expected_log_lik(self, X, y, weights, inverse_form: bool | None = None) -> torch.Tensor:
        """Σ_i w_ki E_q[log p(y_ki | f_ki)] per partition; [K]. Weights mask padding or
        rescale a minibatch."""
        if isinstance(self.likelihood, Gaussian):
            return self._gaussian_expected_log_lik(X, y, weights, self.inverse_form(inverse_form))
        mean, var = self.latent(X, inverse_form=inverse_form)
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
            A = conditionals.projection(self.prior_cholesky(), self.kernel(
                self.inducing.unsqueeze(-3), X.unsqueeze(-3)))
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
        return self.kernel.weighted_gram(X.unsqueeze(-3), self.inducing.unsqueeze(-3),
                                         weights.unsqueeze(-2), y.unsqueeze(-2))

    def elbo(self, X, y, mask) -> torch.Tensor:
        """The exact ELBO of every partition on full data, in the projected form; [K]."""
        return self.expected_log_lik(X, y, mask.to(X.dtype), inverse_form=False) - self.kl()

    # Pyro model / guide -----------------------------------------------------------------------
    def model(self, X, y, mask, batch_size: int | None = None):
        """Whitened prior v ~ N(0, I) per partition and latent; the data term as a factor.

        With ``batch_size``, each partition contributes B points drawn uniformly from its own
        N_k real points, weighted N_k / B (an unbiased estimate of its data term).
        """
        X, y, weights = minibatch(X, y, mask, batch_size)
        num_partitions, num_latent, num_inducing = self.q_mean.shape
        zeros = self.q_mean.new_zeros(num_inducing)
        eye = torch.eye(num_inducing, dtype=zeros.dtype, device=zeros.device)
        with pyro.plate(f"{self.site_prefix}.partitions", num_partitions, dim=-2):
            with pyro.plate(f"{self.site_prefix}.latents", num_latent, dim=-1):
                pyro.sample(f"{self.site_prefix}.u",
                            dist.MultivariateNormal(zeros, scale_tril=eye))
            pyro.factor(f"{self.site_prefix}.data",
                        self.expected_log_lik(X, y, weights).unsqueeze(-1))

    def guide(self, X, y, mask, batch_size: int | None = None):
        """q(v) = N(m, L Lᵀ) per partition and latent function."""
        num_partitions, num_latent, _ = self.q_mean.shape
        with pyro.plate(f"{self.site_prefix}.partitions", num_partitions, dim=-2):
            with pyro.plate(f"{self.site_prefix}.latents", num_latent, dim=-1):
                pyro.sample(f"{self.site_prefix}.u",
                            dist.MultivariateNormal(self.q_mean, scale_tril=self.q_sqrt))

    # Export -----------------------------------------------------------------------------------
    @torch.no_grad()
    def unwhitened_posterior(self) -> tuple[torch.Tensor, torch.Tensor]:
        """q(u) = N(L m, (L L_w)(L L_w)ᵀ): mean [K, L, M] and lower Cholesky factor [K, L, M, M]."""
        return conditionals.unwhiten(self.prior_cholesky(), self.q_mean, self.q_sqrt)


def latent_layout(values: torch.Tensor) -> torch.Tensor:
    """[..., L, N] → [..., N] for one latent function, [..., N, L] for several."""
    return values.squeeze(-2) if values.shape[-2] == 1 else values.mT


def minibatch(X, y, mask, batch_size: int | None):
    """Per-partition uniform minibatches with weights N_k/B, or the full data with the mask."""
    if batch_size is None:
        return X, y, mask.to(X.dtype)
    counts = mask.sum(-1, keepdim=True).to(X.dtype)
    shape = (X.shape[0], batch_size)
    index = (torch.rand(shape, dtype=X.dtype, device=X.device) * counts).long()
    X_batch = X.gather(1, index.unsqueeze(-1).expand(*shape, X.shape[-1]))
    y_batch = y.gather(1, index)
    return X_batch, y_batch, (counts / batch_size).expand(shape)
