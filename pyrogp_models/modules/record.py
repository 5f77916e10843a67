"""The module: one fitted sparse variational GP, frozen, with no data in it.

A module is the library's currency. Local fits produce modules, meta-GPs consume and export them,
expert combinations combine their predictions. It holds

- the kernel (a :class:`~pyrogp_models.kernels.base.Kernel` of batch shape (L,): one set of
  hyperparameters per latent function, frozen) and a constant prior mean per latent function
  (``prior_mean`` [L]; zero for a fitted module, the offset of its units for a module converted
  to others, :mod:`pyrogp_models.modules.units`),
- the likelihood (name, options and parameter values),
- the inducing inputs Z [M, D] and q(u) = N(m, S) **unwhitened**: ``q_mean`` [L, M] and the lower
  Cholesky factor of S, ``q_chol`` [L, M, M], one per latent function,
- the number of points it saw, its final ELBO, the input/output standardisation, the relative
  jitter of its K_zz, the data columns it was fitted on (``columns``: feature names, target
  name, units; :class:`~pyrogp_models.data.columns.Columns`) and free-form JSON ``info`` (name,
  partition, provenance).

Inputs given to :meth:`Module.predict_f` and friends are in data units; the module standardises
them. Latent predictions are in model units (standardised outputs for Gaussian likelihoods);
:meth:`Module.predict_y`, :meth:`Module.log_predictive` and :meth:`Module.to_inference_data` are
in data units (:mod:`pyrogp_models.modules.predictor`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pyro
import pyro.distributions as dist
import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.data.columns import Columns
from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.linalg import cholesky, triangular_solve
from pyrogp_models.kernels import Kernel, moved
from pyrogp_models.likelihoods import Likelihood, latent_layout, make_likelihood
from pyrogp_models.modules.predictor import Predictor

#: 2: a constant prior mean per latent function (``prior_mean``); version-1 files have zero.
#: 3: the kernel as a tree of kinds with named tensors; earlier files hold one stationary family.
FORMAT_VERSION = 3


@dataclass(frozen=True, eq=False)
class Module(Predictor):
    """A frozen record of one fitted sparse variational GP (see the module docstring); a
    :class:`~pyrogp_models.modules.predictor.Predictor` in data units."""

    kernel: Kernel
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
    prior_mean: torch.Tensor | None = None
    columns: Columns = field(default_factory=Columns)

    def __post_init__(self):
        if self.prior_mean is None:  # a zero-mean prior (object.__setattr__: frozen record)
            object.__setattr__(self, "prior_mean", self.q_mean.new_zeros(self.q_mean.shape[0]))

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
    def dtype(self) -> torch.dtype:
        return self.inducing.dtype

    def to(self, dtype: torch.dtype | None = None, device=None) -> Module:
        """A copy with every tensor on ``device`` in ``dtype``."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(dtype=dtype or t.dtype, device=device or t.device)

        return replace(self, kernel=moved(self.kernel, dtype, device),
                       likelihood_params={k: move(v) for k, v in self.likelihood_params.items()},
                       inducing=move(self.inducing), q_mean=move(self.q_mean),
                       q_chol=move(self.q_chol), prior_mean=move(self.prior_mean))

    def hyperparameters(self) -> dict[str, torch.Tensor]:
        """Kernel and likelihood parameters in data units: every kernel value by its place in
        the tree (``lengthscale``, ``variance`` for a single kernel; ``0.lengthscale``,
        ``1.0.period``, … for a composite), and the likelihood's parameters
        (``noise_variance`` for Gaussian noise), output-scaled where targets were standardised;
        values, not part of any autograd graph."""
        output_scale = self.output_scale()
        out = {name.removeprefix("kernel").lstrip("."): value.detach()
               for name, value in self.data_unit_kernel().named_values().items()}
        for key, value in self.likelihood_params.items():
            name = "noise_variance" if self.likelihood_name == "gaussian" else key
            out[name] = value * output_scale**2 if key == "variance" else value
        return out

    def output_scale(self) -> float:
        """s_y for a likelihood whose targets were standardised, else 1."""
        return self.standardisation.y_scale if self.likelihood().standardise_targets else 1.0

    def data_unit_kernel(self) -> Kernel:
        """The kernel for inputs and outputs in data units (x = s_x x̃ + μ_x, y = s_y ỹ)."""
        s = self.standardisation
        scale, mean = _like(s.x_scale, self.inducing), _like(s.x_mean, self.inducing)
        return self.kernel.converted(1.0 / scale, -mean / scale, self.output_scale())

    # Gaussian algebra -------------------------------------------------------------------------
    def prior_cholesky(self) -> torch.Tensor:
        """chol(K_zz + jitter) per latent function, [L, M, M]: the module's prior p_k(u)."""
        return cholesky(self.kernel(self.inducing), self.jitter,
                        what=f"K_zz of module '{self.info.get('name', '?')}'")

    def likelihood(self) -> Likelihood:
        """The module's observation model, unbatched, with frozen parameters."""
        likelihood = make_likelihood(self.likelihood_name, (), self.dtype, self.inducing.device,
                                     **self.likelihood_options, **self.likelihood_params)
        return likelihood.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.inducing.device

    def latent(self, X: torch.Tensor, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginals of q(f) = ∫ p(f | u) q(u) du at inputs X [N, D] (data units): mean and
        variance [N] ([N, L] for several latent functions), model units."""
        X = self.standardisation.transform_x(X)
        prior_chol = self.prior_cholesky()
        prior_mean = self.prior_mean.unsqueeze(-1)
        mean_w, chol_w = conditionals.whiten(prior_chol, self.q_mean - prior_mean, self.q_chol)
        A = conditionals.projection(prior_chol, self.kernel(self.inducing, X))
        mean, var = conditionals.whitened_conditional(A, self.kernel(X, diag=True), mean_w,
                                                      chol_w)
        return latent_layout(mean + prior_mean), latent_layout(var)

    # Pyro: the module's generative story, for pyro.infer.Predictive --------------------------
    def predictive_model(self, X: torch.Tensor, labels=None):
        """u ~ N(0, K_zz) per latent function; f_i | u ~ N(k_iᵀK_zz⁻¹u, k_ii − k_iᵀK_zz⁻¹k_i)
        independently at X [N, D] (data units); y_i | f_i: sites ``u`` [L, M], ``f`` [N(, L)]
        and ``y`` [N] (model units). With :meth:`predictive_guide` (q(u)) Predictive draws the
        posterior."""
        X = self.standardisation.transform_x(X)
        prior_chol = self.prior_cholesky()
        prior_mean = self.prior_mean.unsqueeze(-1)
        u = pyro.sample("u", dist.MultivariateNormal(prior_mean.expand_as(self.q_mean),
                                                     scale_tril=prior_chol).to_event(1))
        A = conditionals.projection(prior_chol, self.kernel(self.inducing, X))  # [L, M, N]
        whitened = triangular_solve(prior_chol, (u - prior_mean).unsqueeze(-1))  # [..., L, M, 1]
        mean = latent_layout((A.mT @ whitened).squeeze(-1) + prior_mean)
        var = latent_layout((self.kernel(X, diag=True) - A.square().sum(-2)).clamp_min(0.0))
        event = 1 if self.num_latent == 1 else 2
        f = pyro.sample("f", dist.Normal(mean, var.sqrt().expand_as(mean)).to_event(event))
        return pyro.sample("y", self.likelihood().distribution(f).to_event(1))

    def predictive_guide(self, X: torch.Tensor, labels=None):
        """q(u) = N(m, S) of the module (unwhitened)."""
        pyro.sample("u", dist.MultivariateNormal(self.q_mean, scale_tril=self.q_chol)
                    .to_event(1))


def _like(values, reference: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(values, dtype=reference.dtype, device=reference.device)
