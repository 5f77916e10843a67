"""The module: one fitted sparse variational GP, frozen, with no data in it.

A module is the library's currency. Local fits produce modules, meta-GPs consume and export them,
expert combinations combine their predictions. It holds

- the kernel family and hyperparameters (``lengthscale`` [L, D or 1], ``variance`` [L]),
- the likelihood (name, options and parameter values),
- the inducing inputs Z [M, D] and q(u) = N(m, S) **unwhitened**: ``q_mean`` [L, M] and the lower
  Cholesky factor of S, ``q_chol`` [L, M, M], one per latent function,
- the number of points it saw, its final ELBO, the input/output standardisation, the relative
  jitter of its K_zz, and free-form JSON ``info`` (name, partition, provenance).

Inputs given to :meth:`Module.predict_f` and friends are in data units; the module standardises
them. Latent predictions are in model units (standardised outputs for Gaussian likelihoods);
:meth:`Module.predict_y` and :meth:`Module.log_predictive` are in data units.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.linalg import cholesky
from pyrogp_models.kernels import stationary_covariance, stationary_diagonal
from pyrogp_models.likelihoods import Likelihood, make_likelihood

FORMAT_VERSION = 1


@dataclass(frozen=True, eq=False)
class Module:
    """A frozen record of one fitted sparse variational GP (see the module docstring)."""

    kernel_family: str
    lengthscale: torch.Tensor
    variance: torch.Tensor
    likelihood_name: str
    likelihood_options: dict
    likelihood_params: dict[str, torch.Tensor]
    inducing: torch.Tensor
    q_mean: torch.Tensor
    q_chol: torch.Tensor
    num_data: int
    elbo: float
    standardisation: Standardisation
    jitter: float
    info: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    # Shapes -------------------------------------------------------------------------------------
    @property
    def num_inducing(self) -> int:
        return self.inducing.shape[-2]

    @property
    def input_dim(self) -> int:
        return self.inducing.shape[-1]

    @property
    def num_latent(self) -> int:
        return self.q_mean.shape[0]

    @property
    def ard(self) -> bool:
        return self.lengthscale.shape[-1] > 1

    @property
    def dtype(self) -> torch.dtype:
        return self.inducing.dtype

    def to(self, dtype: torch.dtype | None = None, device=None) -> Module:
        """A copy with every tensor on ``device`` in ``dtype``."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(dtype=dtype or t.dtype, device=device or t.device)

        return replace(self, lengthscale=move(self.lengthscale), variance=move(self.variance),
                       likelihood_params={k: move(v) for k, v in self.likelihood_params.items()},
                       inducing=move(self.inducing), q_mean=move(self.q_mean),
                       q_chol=move(self.q_chol))

    def inducing_inputs(self) -> torch.Tensor:
        """Z in data units, [M, D]."""
        s = self.standardisation
        return self.inducing * _like(s.x_scale, self.inducing) + _like(s.x_mean, self.inducing)

    def hyperparameters(self) -> dict[str, torch.Tensor]:
        """Kernel and likelihood parameters in data units: ``lengthscale`` [L, D|1] (× the input
        scale; its mean for an isotropic kernel), ``signal_variance`` [L] and the likelihood's
        parameters (``noise_variance`` for Gaussian noise), output-scaled where targets were
        standardised."""
        s = self.standardisation
        x_scale = _like(s.x_scale, self.lengthscale)
        output_scale = s.y_scale**2 if self.likelihood().standardise_targets else 1.0
        out = {"lengthscale": self.lengthscale * (x_scale if self.ard else x_scale.mean()),
               "signal_variance": self.variance * output_scale}
        for key, value in self.likelihood_params.items():
            name = "noise_variance" if self.likelihood_name == "gaussian" else key
            out[name] = value * output_scale if key == "variance" else value
        return out

    # Gaussian algebra -------------------------------------------------------------------------
    def kernel(self, X: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        """k(X, Z) for every latent function: [L, N, M] (inputs in model units)."""
        return stationary_covariance(self.kernel_family, X, Z, self.lengthscale, self.variance)

    def prior_cholesky(self) -> torch.Tensor:
        """chol(K_zz + jitter) per latent function, [L, M, M]: the module's prior p_k(u)."""
        return cholesky(self.kernel(self.inducing, self.inducing), self.jitter,
                        what=f"K_zz of module '{self.info.get('name', '?')}'")

    def likelihood(self) -> Likelihood:
        """The module's observation model, unbatched, with frozen parameters."""
        likelihood = make_likelihood(self.likelihood_name, (), self.dtype, self.inducing.device,
                                     **self.likelihood_options, **self.likelihood_params)
        return likelihood.requires_grad_(False)

    def _inputs(self, X) -> torch.Tensor:
        X = torch.as_tensor(X, dtype=self.dtype, device=self.inducing.device)
        return self.standardisation.transform_x(X)

    def predict_f(self, X, full_cov: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent q(f) at inputs X [N, D] in data units: mean and variance [N] ([N, L] for
        several latent functions), or with ``full_cov`` the covariance [L, N, N]."""
        X = self._inputs(X)
        prior_chol = self.prior_cholesky()
        mean_w, chol_w = conditionals.whiten(prior_chol, self.q_mean, self.q_chol)
        A = conditionals.projection(prior_chol, self.kernel(self.inducing, X))
        if full_cov:
            mean, cov = conditionals.whitened_conditional_full(A, self.kernel(X, X), mean_w,
                                                               chol_w)
            return _layout(mean), cov
        mean, var = conditionals.whitened_conditional(
            A, stationary_diagonal(X, self.variance), mean_w, chol_w)
        return _layout(mean), _layout(var)

    def predict_y(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance of y in data units (class probabilities and p(1−p) for
        classifiers)."""
        likelihood = self.likelihood()
        mean, var = likelihood.predictive_moments(*self.predict_f(X))
        if likelihood.standardise_targets:
            return (self.standardisation.inverse_y_mean(mean),
                    self.standardisation.inverse_y_var(var))
        return mean, var

    def log_predictive(self, X, y) -> torch.Tensor:
        """log p(y_i | x_i) per point, in data units (includes −log of the output scale)."""
        likelihood = self.likelihood()
        y = torch.as_tensor(y, dtype=self.dtype, device=self.inducing.device)
        likelihood.validate_targets(y)
        mean, var = self.predict_f(X)
        if likelihood.standardise_targets:
            scale = self.standardisation.y_scale
            return likelihood.log_predictive(self.standardisation.transform_y(y), mean,
                                             var) - torch.log(torch.as_tensor(scale))
        return likelihood.log_predictive(y, mean, var)


def _like(values, reference: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(values, dtype=reference.dtype, device=reference.device)


def _layout(values: torch.Tensor) -> torch.Tensor:
    """[L, N] → [N] for one latent function, [N, L] for several."""
    return values[0] if values.shape[0] == 1 else values.mT
