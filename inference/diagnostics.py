"""ArviZ diagnostics for a module: guide draws and posterior-predictive draws as InferenceData.

The Pyro model behind the draws is the module's generative story at inputs X:

    u ~ N(0, K_zz)  (q(u) = N(m, S) as the guide),
    f_i | u ~ N(k_iᵀK_zz⁻¹u, k_ii − k_iᵀK_zz⁻¹k_i)  independently per point,
    y_i | f_i ~ p(y | f_i).

``pyro.infer.Predictive`` draws u from the guide, then f and y from the model, so the pointwise
log-likelihood log p(y_i | f_i^{(s)}) is evaluated at *sampled* f and carries the posterior
uncertainty (PSIS-LOO and PIT are meaningful). Draws of f and y are in data units for Gaussian-type
likelihoods; one chain, since SVI has none.
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.infer import Predictive

from inference.arviz_bridge import to_inference_data
from pyrogp_models.gaussian import conditionals
from pyrogp_models.kernels import stationary_diagonal
from pyrogp_models.modules.record import Module


def module_model(module: Module, X: torch.Tensor, y: torch.Tensor | None = None):
    """The generative model of a module at standardised inputs X (see the module docstring)."""
    likelihood = module.likelihood()
    prior_chol = module.prior_cholesky()
    with pyro.plate("latents", module.num_latent, dim=-1):
        u = pyro.sample("u", dist.MultivariateNormal(
            torch.zeros_like(module.q_mean), scale_tril=prior_chol))
    A = conditionals.projection(prior_chol, module.kernel(module.inducing, X))  # [L, M, N]
    u_w = conditionals.triangular_solve(prior_chol, u.unsqueeze(-1))  # [..., L, M, 1]
    mean = (A.mT @ u_w).squeeze(-1)  # [..., L, N]
    var = (stationary_diagonal(X, module.variance) - A.square().sum(-2)).clamp_min(1e-12)
    if module.num_latent == 1:
        mean, var = mean.squeeze(-2), var.squeeze(-2)
    else:
        mean, var = mean.mT, var.mT
    event_dims = 0 if module.num_latent == 1 else 1
    with pyro.plate("points", X.shape[0], dim=-1):
        f = pyro.sample("f", dist.Normal(mean, var.sqrt()).to_event(event_dims))
        pyro.sample("y", likelihood.distribution(f), obs=y)


def module_guide(module: Module, X: torch.Tensor, y: torch.Tensor | None = None):
    """q(u) = N(m, S) of the module."""
    with pyro.plate("latents", module.num_latent, dim=-1):
        pyro.sample("u", dist.MultivariateNormal(module.q_mean, scale_tril=module.q_chol))


@torch.no_grad()
def module_inference_data(module: Module, X, y, num_samples: int = 500, seed: int = 0):
    """InferenceData (a DataTree on ArviZ ≥ 1) with groups posterior (u, f),
    posterior_predictive (y), log_likelihood (y, pointwise at sampled f) and observed_data (y)."""
    X_model = module._inputs(X)
    likelihood = module.likelihood()
    y_data = torch.as_tensor(y, dtype=module.dtype)
    likelihood.validate_targets(y_data)
    standardised = likelihood.standardise_targets
    s = module.standardisation
    y_model = s.transform_y(y_data) if standardised else y_data
    pyro.set_rng_seed(seed)
    draws = Predictive(module_model, guide=module_guide, num_samples=num_samples,
                       return_sites=["u", "f", "y"], parallel=True)(module, X_model, None)
    f, y_draws = draws["f"], draws["y"]
    log_lik = likelihood.distribution(f).log_prob(y_model)
    if standardised:
        log_lik = log_lik - math.log(s.y_scale)
        f = s.inverse_y_mean(f) if module.num_latent == 1 else f
        y_draws = s.inverse_y_mean(y_draws)
    latent_dims = ["point"] if module.num_latent == 1 else ["point", "latent"]
    return to_inference_data(
        posterior={"u": draws["u"].reshape(num_samples, module.num_latent, -1), "f": f},
        posterior_predictive={"y": y_draws},
        log_likelihood={"y": log_lik},
        observed_data={"y": np.asarray(y_data)},
        dims={"u": ["latent", "inducing"], "f": latent_dims, "y": ["point"]})
