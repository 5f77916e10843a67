"""Poisson likelihood for counts with an exponential link, p(y|f) = Poisson(y | e^f)."""

from __future__ import annotations

import torch
from pyro import distributions as dist

from pyrogp_models.errors import DataError
from pyrogp_models.likelihoods import quadrature
from pyrogp_models.likelihoods.base import Likelihood


class Poisson(Likelihood):
    """Counts y ∈ {0, 1, 2, ...} with rate e^f; the variational expectation
    y m − e^{m + v/2} − log Γ(y + 1) is closed form (latent moments [*batch, N])."""

    name = "poisson"

    def validate_targets(self, y):
        super().validate_targets(y)
        if bool(((y < 0) | (y != y.round())).any()):
            raise DataError("targets must be non-negative integer counts for a Poisson likelihood")

    def expected_log_prob(self, y, mean, var):
        """E_q[y f − e^f − log y!] = y m − exp(m + v/2) − log Γ(y+1)."""
        return y * mean - torch.exp(mean + 0.5 * var) - torch.lgamma(y + 1.0)

    def log_predictive(self, y, mean, var):
        y_ = y.unsqueeze(-1)
        return quadrature.log_expectation(
            lambda f: y_ * f - f.exp() - torch.lgamma(y_ + 1.0), mean, var)

    def predictive_moments(self, mean, var):
        """E[y] = e^{m+v/2}; Var[y] = E[y] + (e^v − 1) e^{2m+v}."""
        rate = torch.exp(mean + 0.5 * var)
        return rate, rate + torch.expm1(var) * rate.square()

    def distribution(self, f):
        return dist.Poisson(f.exp())

    def constant_log_likelihood(self, y):
        """Σ_n y_n log λ̂ − λ̂ − log y_n! at the mean count λ̂."""
        rate = y.mean()
        return (torch.special.xlogy(y, rate) - rate - torch.lgamma(y + 1.0)).sum()
