"""Heteroscedastic Gaussian with two latent functions: y ~ N(f, e^g) (chained GP, Saul et al. 2016).

Latent moments have shape [..., N, 2] with f in channel 0 and the log-variance g in channel 1.
"""

from __future__ import annotations

import math

import torch
from pyro import distributions as dist

from pyrogp_models.likelihoods import quadrature
from pyrogp_models.likelihoods.base import Likelihood
from pyrogp_models.likelihoods.gaussian import gaussian_constant_log_likelihood

_LOG_2PI = math.log(2.0 * math.pi)


class HeteroscedasticGaussian(Likelihood):
    """Noise variance e^{g(x)} from a second GP (chained GP, Saul et al. 2016). Variance, not
    standard deviation, is e^g. Latent moments [..., N, 2] (f, g); E_q[log p(y | f, g)] =
    −½ log 2π − ½ m_g − ½ exp(−m_g + v_g/2)((y − m_f)² + v_f), in closed form."""

    name = "heteroscedastic"
    standardise_targets = True

    @property
    def num_latent(self) -> int:
        return 2

    def expected_log_prob(self, y, mean, var):
        """E = −½log 2π − ½m_g − ½exp(−m_g + v_g/2)((y − m_f)² + v_f)."""
        m_f, m_g = mean.unbind(-1)
        v_f, v_g = var.unbind(-1)
        return -0.5 * (_LOG_2PI + m_g + torch.exp(v_g / 2.0 - m_g) * ((y - m_f).square() + v_f))

    def log_predictive(self, y, mean, var):
        """log ∫ N(y | m_f, v_f + e^g) N(g | m_g, v_g) dg by Gauss–Hermite over g."""
        m_f, m_g = mean.unbind(-1)
        v_f, v_g = var.unbind(-1)
        residual = (y - m_f).square().unsqueeze(-1)
        v_f = v_f.unsqueeze(-1)

        def log_density(g):
            total = v_f + g.exp()
            return -0.5 * (_LOG_2PI + total.log() + residual / total)

        return quadrature.log_expectation(log_density, m_g, v_g)

    def predictive_moments(self, mean, var):
        """E[y] = m_f; Var[y] = v_f + E[e^g] = v_f + exp(m_g + v_g/2)."""
        m_f, m_g = mean.unbind(-1)
        v_f, v_g = var.unbind(-1)
        return m_f, v_f + torch.exp(m_g + 0.5 * v_g)

    def distribution(self, f):
        return dist.Normal(f[..., 0], torch.exp(0.5 * f[..., 1]))

    def constant_log_likelihood(self, y):
        """The Gaussian's: constant f and g."""
        return gaussian_constant_log_likelihood(y)
