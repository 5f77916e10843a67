"""The sparse-GP layer: inducing inputs Z and a whitened q(u), batched, with its KL and marginals.

Every model of the library is built from this block. A layer holds a batch B = (b₁, …) of sparse
variational GPs (Hensman et al. 2015; whitened as in GPflow): member b has M inducing inputs
Z_b [M, D] and a variational distribution q(v_b) = N(m_b, L_b L_bᵀ) over whitened inducing
variables, u_b = chol(K_zz) v_b, so that

    KL[q(u_b) ‖ p(u_b)] = KL[q(v_b) ‖ N(0, I)],                                   (1)
    q(f_b(x)) = N(A_bᵀm_b, k_xx − A_bᵀA_b + A_bᵀL_bL_bᵀA_b),  A_b = chol(K_zz)⁻¹k(Z_b, x).  (2)

Shapes: ``q_mean`` [*B, M], ``q_sqrt`` [*B, M, M] (``covariance="meanfield"``: independent
members) or one [T, T] factor over all T = |B|·M whitened variables (``"joint"``); Z [*B_z, M, D]
with B_z broadcastable to B (e.g. (K, 1) for K partitions whose L latent functions share Z). The
kernel is any module with ``kernel(X, Z)`` → [*B, N, M] and ``kernel.diag(X)`` → [*B, N].

Z may be optimised in per-member coordinates (``inducing_scale``): Z = c + s·Z̃ with c the initial
mean of Z_b and s a scale per member and input (e.g. the spread of its partition's inputs), so one
optimiser step moves every member's Z in proportion to its own extent.

The layer holds parameters and Gaussian algebra only; a model decides what the layer's functions
explain (a likelihood, the contrastive terms of a meta-GP, another layer). A natural-gradient step
(:mod:`pyrogp_models.inference.natural_gradient`) updates (``q_mean``, ``q_sqrt``) of any layer in
place.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam
from torch.distributions.kl import register_kl

from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.kullback_leiblers import kl_to_standard_normal
from pyrogp_models.gaussian.linalg import DEFAULT_JITTER, cholesky

COVARIANCES = ("meanfield", "joint")


class SparseGPLayer(PyroModule):
    """A batch of sparse variational GPs sharing M (see the module docstring).

    Args:
        kernel: the batched kernel (batch shape B, or broadcastable to it).
        inducing: initial Z [*B_z, M, D].
        batch_shape: B.
        learn_inducing: optimise Z (else a fixed buffer).
        inducing_scale: [*B_z, D] per-member coordinate scale for Z (see the module docstring).
        jitter: relative jitter on K_zz.
        covariance: ``"meanfield"`` (one q_sqrt per member) or ``"joint"`` (one over all).
        learn_q: q(v) is a parameter; ``False`` keeps it as a buffer (set by a collapsed optimum).
        q_scale: initial q_sqrt = q_scale·I (e.g. small for inner layers of a deep GP).
    """

    def __init__(self, kernel: torch.nn.Module, inducing: torch.Tensor,
                 batch_shape: tuple[int, ...] | torch.Size = (), *, learn_inducing: bool = True,
                 inducing_scale: torch.Tensor | None = None, jitter: float = DEFAULT_JITTER,
                 covariance: str = "meanfield", learn_q: bool = True, q_scale: float = 1.0):
        super().__init__()
        if covariance not in COVARIANCES:
            raise ValueError(f"unknown covariance '{covariance}'; use one of {COVARIANCES}")
        self.kernel = kernel
        self.batch_shape = torch.Size(batch_shape)
        self.jitter = jitter
        self.covariance = covariance
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
        size = inducing.shape[-2]
        mean = inducing.new_zeros(*self.batch_shape, size)
        total = math.prod(self.batch_shape) * size
        eye = torch.eye(size if covariance == "meanfield" else total, dtype=inducing.dtype,
                        device=inducing.device)
        chol = q_scale * (eye.expand(*self.batch_shape, size, size) if covariance == "meanfield"
                          else eye)
        if learn_q:
            self.q_mean = PyroParam(mean)
            self.q_sqrt = PyroParam(chol.clone(), constraint=constraints.lower_cholesky)
        else:
            self.register_buffer("q_mean", mean)
            self.register_buffer("q_sqrt", chol.clone())

    # Shapes -------------------------------------------------------------------------------------
    @property
    def inducing(self) -> torch.Tensor:
        """Z = c + s·Z̃ [*B_z, M, D]."""
        return self.inducing_centre + self.inducing_scale * self.inducing_unit

    @property
    def num_inducing(self) -> int:
        return self.inducing_unit.shape[-2]

    @property
    def learns_q(self) -> bool:
        """Whether q(v) is a parameter (not a buffer set by a collapsed optimum)."""
        return "q_mean" in self._pyro_params

    def inducing_parameters(self) -> list[torch.nn.Parameter]:
        """The unconstrained parameter of Z (empty when Z is a buffer)."""
        if "inducing_unit" not in self._pyro_params:
            return []
        return [self.inducing_unit_unconstrained]

    def variational_parameters(self) -> list[torch.nn.Parameter]:
        """The unconstrained parameters of q(v) (empty when q is a buffer)."""
        if not self.learns_q:
            return []
        return [self.q_mean_unconstrained, self.q_sqrt_unconstrained]

    # Gaussian algebra -------------------------------------------------------------------------
    def prior_cholesky(self, check: bool | None = None) -> torch.Tensor:
        """chol(K_zz + jitter) [*B, M, M]."""
        Z = self.inducing
        return cholesky(self.kernel(Z, Z), self.jitter, what="inducing covariance K_zz",
                        check=check)

    def kl(self) -> torch.Tensor:
        """KL[q(v) ‖ N(0, I)], eq. (1): [*B] (mean-field) or a scalar (joint)."""
        if self.covariance == "joint":
            return kl_to_standard_normal(self.q_mean.reshape(-1), self.q_sqrt)
        return kl_to_standard_normal(self.q_mean, self.q_sqrt)

    def projection(self, X: torch.Tensor, prior_chol: torch.Tensor | None = None
                   ) -> torch.Tensor:
        """A = chol(K_zz)⁻¹ k(Z, X) [*B, M, N] for X [*B_x, N, D]."""
        prior_chol = self.prior_cholesky() if prior_chol is None else prior_chol
        return conditionals.projection(prior_chol, self.kernel(self.inducing, X))

    def marginals(self, X: torch.Tensor, full_cov: bool = False,
                  prior_chol: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f) at X [*B_x, N, D], eq. (2): mean [*B, N] and variance [*B, N] (or, with
        ``full_cov``, covariance [*B, N, N])."""
        self._require_meanfield("marginals")
        A = self.projection(X, prior_chol)
        if full_cov:
            return conditionals.whitened_conditional_full(A, self.kernel(X, X), self.q_mean,
                                                          self.q_sqrt)
        return conditionals.whitened_conditional(A, self.kernel.diag(X), self.q_mean,
                                                 self.q_sqrt)

    def conditional_on(self, whitened: torch.Tensor, X: torch.Tensor,
                       prior_chol: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """p(f(X) | v): mean [..., *B, N] and variance [*B, N] given whitened draws v
        [..., *B, M] (any leading sample shape): Aᵀv and k_xx − ‖A‖²."""
        A = self.projection(X, prior_chol)
        mean = (A.mT @ whitened.unsqueeze(-1)).squeeze(-1)
        return mean, (self.kernel.diag(X) - A.square().sum(-2)).clamp_min(0.0)

    # Pyro sites -------------------------------------------------------------------------------
    def prior_distribution(self) -> dist.TorchDistribution:
        """N(0, I) over the whitened v, one event of shape [*B, M] (or [T] joint): a
        :class:`WhitenedPrior`, whose KL from q is in closed form."""
        size, shape = self.num_inducing, self.batch_shape
        if self.covariance == "joint":
            size, shape = math.prod(self.batch_shape) * size, torch.Size()
        zeros = self.q_mean.new_zeros(*shape, size)
        eye = torch.eye(size, dtype=zeros.dtype, device=zeros.device)
        return WhitenedPrior(zeros, scale_tril=eye.expand(*shape, size, size)).to_event(len(shape))

    def posterior_distribution(self) -> dist.TorchDistribution:
        """q(v) with the event shape of :meth:`prior_distribution`."""
        if self.covariance == "joint":
            return dist.MultivariateNormal(self.q_mean.reshape(-1), scale_tril=self.q_sqrt)
        return (dist.MultivariateNormal(self.q_mean, scale_tril=self.q_sqrt)
                .to_event(len(self.batch_shape)))

    def sample(self, name: str, posterior: bool) -> torch.Tensor:
        """A ``pyro.sample`` of the whitened v from the prior (model) or q (guide): [*B, M]."""
        fn = self.posterior_distribution() if posterior else self.prior_distribution()
        value = pyro.sample(name, fn)
        return value.reshape(*value.shape[:-1], *self.batch_shape, self.num_inducing) \
            if self.covariance == "joint" else value

    # Unwhitened q(u) --------------------------------------------------------------------------
    @torch.no_grad()
    def unwhitened_posterior(self) -> tuple[torch.Tensor, torch.Tensor]:
        """q(u) = N(L m, (L L_w)(L L_w)ᵀ): mean [*B, M] and lower Cholesky factor [*B, M, M]."""
        self._require_meanfield("the unwhitened posterior")
        return conditionals.unwhiten(self.prior_cholesky(), self.q_mean, self.q_sqrt)

    @torch.no_grad()
    def set_whitened_posterior(self, mean: torch.Tensor, chol: torch.Tensor) -> None:
        """Overwrite q(v) (shapes as ``q_mean`` and ``q_sqrt``)."""
        self.q_mean = mean.reshape(self.q_mean.shape).clone()
        self.q_sqrt = chol.reshape(self.q_sqrt.shape).clone()

    def set_posterior_to_prior(self) -> None:
        """Overwrite q(v) with the whitened prior N(0, I): zero KL."""
        eye = torch.eye(self.q_sqrt.shape[-1], dtype=self.q_sqrt.dtype,
                        device=self.q_sqrt.device)
        self.set_whitened_posterior(torch.zeros_like(self.q_mean), eye.expand_as(self.q_sqrt))

    def _require_meanfield(self, what: str) -> None:
        if self.covariance != "meanfield":
            raise NotImplementedError(f"{what} of a joint q over all members is not "
                                      "available; use the model's own algebra")


class WhitenedPrior(dist.MultivariateNormal):
    """N(0, I) over whitened inducing values (a ``MultivariateNormal`` with zero mean and identity
    scale): KL[q ‖ N(0, I)] of a multivariate-normal q is eq. (1) in closed form, also under
    ``torch.jit`` tracing (Pyro's ``JitTraceMeanField_ELBO``), where torch's general KL between
    two batched multivariate normals cannot infer its batch shape."""


@register_kl(dist.MultivariateNormal, WhitenedPrior)
def _kl_to_whitened_prior(q: dist.MultivariateNormal, p: WhitenedPrior) -> torch.Tensor:
    """Eq. (1) for every batch member: [*batch]."""
    shape = torch.broadcast_shapes(q.batch_shape, p.batch_shape)
    return kl_to_standard_normal(q.loc.expand(*shape, q.event_shape[0]),
                                 q.scale_tril.expand(*shape, *q.scale_tril.shape[-2:]))


class OneLayer:
    """Shorthands of a model built on one :class:`SparseGPLayer` held as ``self.layer``: its
    whitened q(v) (``q_mean``, ``q_sqrt``; assignable), ``jitter`` and ``num_inducing``."""

    layer: SparseGPLayer

    @property
    def q_mean(self) -> torch.Tensor:
        return self.layer.q_mean

    @q_mean.setter
    def q_mean(self, value: torch.Tensor) -> None:
        self.layer.q_mean = value

    @property
    def q_sqrt(self) -> torch.Tensor:
        return self.layer.q_sqrt

    @q_sqrt.setter
    def q_sqrt(self, value: torch.Tensor) -> None:
        self.layer.q_sqrt = value

    @property
    def jitter(self) -> float:
        return self.layer.jitter

    @property
    def num_inducing(self) -> int:
        return self.layer.num_inducing


def variational_layers(module: torch.nn.Module) -> list[SparseGPLayer]:
    """Every :class:`SparseGPLayer` of ``module`` whose q(v) is a parameter."""
    return [m for m in module.modules() if isinstance(m, SparseGPLayer) and m.learns_q]
