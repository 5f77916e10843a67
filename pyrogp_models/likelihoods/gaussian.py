"""Gaussian likelihood p(y|f) = N(y | f, σ²), everything in closed form."""

from __future__ import annotations

import math

import torch
from pyro import distributions as dist
from pyro.distributions import constraints

from pyrogp_models.likelihoods.base import Likelihood

_LOG_2PI = math.log(2.0 * math.pi)


class Gaussian(Likelihood):
    """Homoscedastic Gaussian noise with learned variance σ² [*batch] (per batch member):
    E_q[log p(y | f)] = −½ log 2πσ² − ((y − m)² + v)/2σ² and the predictive N(y | m, v + σ²),
    latent moments [*batch, N]."""

    name = "gaussian"
    PARAMETERS = {"variance": (0.1, constraints.positive)}
    standardise_targets = True

    def expected_log_prob(self, y, mean, var):
        """E_q[log N(y|f,σ²)] = −½log(2πσ²) − ((y−m)² + v)/(2σ²)."""
        noise = self._param("variance")
        return -0.5 * (_LOG_2PI + noise.log() + ((y - mean).square() + var) / noise)

    def log_predictive(self, y, mean, var):
        """log N(y | m, v + σ²)."""
        total = var + self._param("variance")
        return -0.5 * (_LOG_2PI + total.log() + (y - mean).square() / total)

    def predictive_moments(self, mean, var):
        return mean, var + self._param("variance")

    def distribution(self, f):
        return dist.Normal(f, self._param("variance").sqrt())

    def constant_log_likelihood(self, y):
        return gaussian_constant_log_likelihood(y)

    def log_likelihood_ceiling(self, counts):
        """−½N log 2πσ², the log likelihood of N targets met exactly."""
        return -0.5 * counts * (_LOG_2PI + self.variance.log())


def gaussian_constant_log_likelihood(y: torch.Tensor) -> torch.Tensor:
    """max over μ, σ² of Σ_n log N(y_n | μ, σ²) = −N/2 (log 2πσ̂² + 1), σ̂² the mean squared
    deviation from the mean (floored at the dtype's smallest normal number: constant targets)."""
    spread = (y - y.mean()).square().mean().clamp_min(torch.finfo(y.dtype).tiny)
    return -0.5 * y.numel() * (_LOG_2PI + spread.log() + 1.0)
