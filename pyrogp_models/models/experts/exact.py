"""Exact GP experts with shared hyperparameters (Cohen et al., ICML 2020, §2.1).

The data are split into J disjoint partitions D_j; expert j is an exact GP on D_j, and all experts
share one kernel and one Gaussian noise variance σ². The hyperparameters maximise the sum of the
experts' log marginal likelihoods, eq. (2) (Deisenroth & Ng 2015):

    Σ_j log N(y_j | 0, K_j + σ²I).

The experts form one batched Pyro model: the partitions are padded to a common size m and masked
(padded rows get an identity covariance and zero targets, and their −½ log 2π terms are dropped),
so one batched Cholesky of [J, m, m] evaluates every expert. :meth:`ExactExperts.model` adds the
objective as a ``pyro.factor`` and the guide is empty (point estimates), so an ELBO optimiser
fits the hyperparameters like those of any other model
(``pyrogp_models.inference.experts_fit`` runs the library's trainer, by default its L-BFGS with
the hyperparameters as one member; ``pyro.infer.SVI`` works as well: the model runs in Pyro's
module context and binds its data). :meth:`ExactExperts.predictive_model` draws every expert's
f and y at new inputs from its exact posterior, for ``pyro.infer.Predictive``.

An exact expert is exported as a :class:`~pyrogp_models.modules.record.Module` whose inducing
inputs are its
own inputs and whose q(u) is the exact posterior of f at them,

    q(u) = N(K(K + σ²I)⁻¹y, K − K(K + σ²I)⁻¹K),

so it is saved, loaded and combined like any other module (see :meth:`ExactExperts.to_modules`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, pyro_method

from pyrogp_models.data import Standardisation
from pyrogp_models.data.partitioners import Partition, pad_partitions
from pyrogp_models.gaussian.linalg import (
    DEFAULT_JITTER,
    cholesky,
    cholesky_solve,
    inverse_cholesky,
    triangular_solve,
)
from pyrogp_models.kernels import Kernel, Leaf, frozen, resolve_kernel
from pyrogp_models.layers import unique_name
from pyrogp_models.likelihoods import Gaussian
from pyrogp_models.modules.record import Module

__all__ = ["ExactExperts", "grbcm_rows"]

_LOG_2PI = math.log(2.0 * math.pi)

#: Test points per chunk are chosen so that a chunk's cross-covariance has about this many entries.
_CHUNK_ENTRIES = 1 << 22


class ExactExperts(PyroModule):
    """J exact GP experts on the partitions of (X, y), sharing one kernel and one noise, eq. (2).

    Args:
        X, y: inputs [N, D] and targets [N] in model units (standardised), as tensors.
        partition: which expert each point belongs to.
        kernel: a name or expression, or a kernel (:func:`~pyrogp_models.kernels.choice.
            resolve_kernel`; model units), shared by every expert.
        ard: one lengthscale per input dimension for a kernel given by name.
        lengthscale, variance, noise: initial values of the lengthscales and variances the
            kernel does not give, and of the noise (the authors' code starts at 1, 1 and 1; the
            noise default here is the library's 0.1).
        name: the Pyro name (default: a fresh ``"experts"``).
    """

    def __init__(self, X: torch.Tensor, y: torch.Tensor, partition: Partition,
                 kernel: str | torch.nn.Module = "rbf", ard: bool = False,
                 lengthscale: float = 1.0,
                 variance: float = 1.0, noise: float = 0.1, name: str | None = None):
        super().__init__(name or unique_name("experts"))
        Xp, yp, mask, _ = pad_partitions(X, y, partition)
        self.register_buffer("data_X", Xp, persistent=False)
        self.register_buffer("data_y", yp, persistent=False)
        self.register_buffer("data_mask", mask, persistent=False)
        self.register_buffer("counts", mask.sum(-1), persistent=False)
        self.kernel = _with_defaults(resolve_kernel(kernel, X.shape[-1], ard).batched(()),
                                     {"lengthscale": lengthscale, "variance": variance}).to(X)
        self.likelihood = Gaussian((), X.dtype, X.device, variance=noise)

    @property
    def num_experts(self) -> int:
        return self.data_X.shape[0]

    def _masked_covariance(self, diagonal: torch.Tensor) -> torch.Tensor:
        """K_j with padded rows/columns zeroed, plus diag(``diagonal``); [J, m, m]."""
        weights = self.data_mask.to(self.data_X.dtype)
        K = self.kernel(self.data_X) * weights.unsqueeze(-1) * weights.unsqueeze(-2)
        return K + torch.diag_embed(diagonal)

    def noisy_covariance(self) -> torch.Tensor:
        """K_j + σ²I per expert, identity on padded rows; [J, m, m]."""
        weights = self.data_mask.to(self.data_X.dtype)
        return self._masked_covariance(self.likelihood.variance * weights + 1.0 - weights)

    def noisy_cholesky(self) -> torch.Tensor:
        """chol(K_j + σ²I) per expert, identity on padded rows; [J, m, m]."""
        return cholesky(self.noisy_covariance(), 0.0, what="K + σ²I of an exact expert")

    def log_marginal(self) -> torch.Tensor:
        """log N(y_j | 0, K_j + σ²I) of every expert; [J]."""
        log_density = _GaussianLogDensity.apply(self.noisy_covariance(), self.data_y)
        return log_density - 0.5 * _LOG_2PI * self.counts.to(log_density.dtype)

    def member_objectives(self, precise: bool = False) -> list:
        """The shared hyperparameters as one member of the batched L-BFGS
        (:mod:`pyrogp_models.inference.batched_lbfgs`) with −eq. (2) as its objective [1]: one
        evaluation per iteration and no value read back to the host. The objective is exact, so
        ``precise`` changes nothing."""
        return [([p for p in self.parameters() if p.requires_grad],
                 lambda: -self.log_marginal().sum().reshape(1))]

    @pyro_method
    def model(self):
        """Eq. (2) as a factor: Σ_j log N(y_j | 0, K_j + σ²I)."""
        pyro.factor(self._pyro_get_fullname("log_marginal"), self.log_marginal().sum())

    @pyro_method
    def guide(self, *args, **kwargs):
        """Empty: the hyperparameters are point estimates."""

    @pyro_method
    def predictive_model(self, X: torch.Tensor):
        """Every expert's f_j at X [N, D] (model units) from its exact posterior (marginals,
        :meth:`predict_f`) and y_j | f_j with the shared noise: sites ``f``, ``y`` [J, N]."""
        mean, var = self.predict_f(X)
        f = pyro.sample(self._pyro_get_fullname("f"), dist.Normal(mean, var.sqrt()).to_event(2))
        return f, pyro.sample(self._pyro_get_fullname("y"),
                              self.likelihood.distribution(f).to_event(2))

    @pyro_method
    def predictive_guide(self, *args, **kwargs):
        """Empty: :meth:`predictive_model` draws from the exact posterior itself."""

    @torch.no_grad()
    def predict_f(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert's latent posterior at X [N, D] (model units): mean and variance [J, N].

        m_j = k_jᵀ(K_j + σ²I)⁻¹y_j and σ_j² = k(x, x) − k_jᵀ(K_j + σ²I)⁻¹k_j (Rasmussen & Williams
        2006, eqs. 2.25–2.26), the latent predictive without noise that §2.2 combines.
        """
        chol = self.noisy_cholesky()
        alpha = cholesky_solve(chol, self.data_y.unsqueeze(-1))
        weights = self.data_mask.to(X.dtype).unsqueeze(-1)
        chunk = max(1, _CHUNK_ENTRIES // (self.num_experts * self.data_X.shape[1]))
        means, variances = [], []
        for X_chunk in X.split(chunk):
            cross = self.kernel(self.data_X, X_chunk) * weights  # [J, m, n]
            means.append((cross * alpha).sum(-2))
            projected = triangular_solve(chol, cross)
            prior = self.kernel.diag(X_chunk)
            variances.append((prior - projected.square().sum(-2)).clamp_min(0.0))
        return torch.cat(means, -1), torch.cat(variances, -1)

    @torch.no_grad()
    def to_modules(self, standardisation: Standardisation, names: Sequence[str] | None = None,
                   info: dict | None = None) -> dict[str, Module]:
        """Export every expert as a module with Z = its inputs and the exact q(u).

        A module conditions on chol(K_zz + εI) with ε = jitter·σ_f², so q(u) is computed for
        the jittered prior K̃ = K + εI and the remaining noise σ'² = σ² − ε (the jitter is at most
        σ²/2): the module then reproduces the exact predictive k_*ᵀ(K + σ²I)⁻¹y and
        k_** − k_*ᵀ(K + σ²I)⁻¹k_* exactly. With L̃ = chol K̃ and B = I + L̃ᵀL̃/σ'²,
        m = K̃(K̃ + σ'²I)⁻¹y and chol S = L̃ chol(B⁻¹), where chol(B⁻¹) comes from the Cholesky
        factor of B with reversed rows and columns, without inverting B.
        """
        noise = self.likelihood.variance.detach()
        weights = self.data_mask.to(self.data_X.dtype)
        diagonal = self.kernel(self.data_X, diag=True).detach() * weights
        scale = diagonal.sum(-1) / weights.sum(-1)  # mean diag K_j: what a module's jitter scales
        jitter = min(DEFAULT_JITTER, 0.5 * float(noise / scale.max()))
        epsilon = (jitter * scale).unsqueeze(-1)
        prior_chol = cholesky(self._masked_covariance(epsilon * weights + 1.0 - weights), 0.0,
                              what="jittered K_zz of an exact expert")
        alpha = cholesky_solve(self.noisy_cholesky(), self.data_y.unsqueeze(-1))
        q_mean = (prior_chol @ (prior_chol.mT @ alpha)).squeeze(-1)
        eye = torch.eye(prior_chol.shape[-1], dtype=noise.dtype, device=noise.device)
        precision = eye + prior_chol.mT @ prior_chol / (noise - epsilon).unsqueeze(-1)
        q_chol = (prior_chol @ inverse_cholesky(
            precision, what="I + L̃ᵀL̃/σ² of an exact expert")).tril()
        elbos = self.log_marginal()
        count = self.num_experts
        width = max(3, len(str(count - 1)))
        names = list(names or [f"expert{k:0{width}d}" for k in range(count)])
        if len(names) != count:
            raise ValueError(f"{len(names)} names for {count} experts")
        kernel = frozen(self.kernel.batched((1,)))
        modules = {}
        for k, name in enumerate(names):
            n = int(self.counts[k])
            modules[name] = Module(
                kernel=kernel, likelihood_name="gaussian",
                likelihood_options={}, likelihood_params={"variance": noise.clone()},
                inducing=self.data_X[k, :n].clone(), q_mean=q_mean[k, :n].unsqueeze(0).clone(),
                q_chol=q_chol[k, :n, :n].unsqueeze(0).clone(), num_data=n,
                elbo=float(elbos[k]), standardisation=standardisation, jitter=jitter,
                info={"name": name, "partition": k, "expert": "exact", **(info or {})})
        return modules


def _with_defaults(kernel: Kernel, values: dict[str, float]) -> Kernel:
    """``kernel`` with every value of ``values`` that a leaf has but was not given set."""
    for _, leaf in kernel.parts():
        if isinstance(leaf, Leaf):
            for name, value in values.items():
                if name not in leaf.given and any(h.name == name for h in leaf.hyperparameters):
                    leaf.assign(name, torch.as_tensor(value))
    return kernel


class _GaussianLogDensity(torch.autograd.Function):
    """log N(y | 0, C) up to −½n log 2π, batched, with the closed-form gradient
    ∂/∂C = ½(ααᵀ − C⁻¹), α = C⁻¹y (Rasmussen & Williams 2006, eq. 5.9): one batched Cholesky
    forward and one batched inverse backward, cheaper than differentiating the factorisation."""

    @staticmethod
    def forward(ctx, covariance: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        chol = cholesky(covariance, 0.0, what="K + σ²I of an exact expert")
        alpha = cholesky_solve(chol, y.unsqueeze(-1))
        ctx.save_for_backward(chol, alpha)
        return (-0.5 * (y.unsqueeze(-1) * alpha).sum((-2, -1))
                - chol.diagonal(dim1=-2, dim2=-1).log().sum(-1))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        chol, alpha = ctx.saved_tensors
        grad = grad[..., None, None]
        grad_cov = 0.5 * grad * (alpha @ alpha.mT - torch.cholesky_inverse(chol))
        grad_y = -(grad * alpha).squeeze(-1) if ctx.needs_input_grad[1] else None
        return grad_cov, grad_y


def grbcm_rows(partition: Partition, size: int, seed: int) -> tuple[np.ndarray, Partition]:
    """Rows and partition of the grBCM experts of Liu et al. (2018), eq. (5), on a partition.

    A random communication set D_c of ``size`` points is expert 0 and expert j ≥ 1 is
    D_c ∪ D_j (D_j without the points of D_c). Fit ``X[rows], y[rows]`` on the returned
    partition and mark module 0 with ``info["role"] = "communication"`` for
    :class:`~pyrogp_models.models.experts.predictor.ExpertCombination`.
    """
    num_points, count = partition.assignments.size, partition.num_partitions
    if not 1 <= size < num_points:
        raise ValueError(f"communication set of {size} points out of {num_points}")
    chosen = np.zeros(num_points, dtype=bool)
    chosen[np.random.default_rng(seed).choice(num_points, size, replace=False)] = True
    rest = np.flatnonzero(~chosen)
    rows = np.concatenate([np.tile(np.flatnonzero(chosen), count + 1), rest])
    labels = np.concatenate([np.repeat(np.arange(count + 1), size),
                             partition.assignments[rest] + 1])
    return rows, Partition(labels, {"kind": "random", "num_partitions": count + 1})
