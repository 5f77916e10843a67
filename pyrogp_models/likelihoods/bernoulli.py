"""Bernoulli likelihood for labels y ∈ {0, 1} with a logit or probit link."""

from __future__ import annotations

import torch
from pyro import distributions as dist

from pyrogp_models.likelihoods import quadrature
from pyrogp_models.likelihoods.base import Likelihood, check_binary

LINKS = ("logit", "probit")


class Bernoulli(Likelihood):
    """p(y=1|f) = σ(f) (logit) or Φ(f) (probit).

    The variational expectation uses 20-node Gauss–Hermite quadrature for both links; the
    probit predictive is exact: p(y=1) = Φ(m/√(1+v)).
    """

    name = "bernoulli"
    is_classifier = True

    def __init__(self, batch_shape=(), dtype=None, device=None, link: str = "logit", **values):
        if link not in LINKS:
            raise ValueError(f"unknown link '{link}'; choose from {LINKS}")
        super().__init__(batch_shape, dtype, device, **values)
        self.link = link

    def options(self):
        return {"link": self.link}

    def log_prob_signed(self, signed_f: torch.Tensor) -> torch.Tensor:
        """log p(y|f) written as a function of s·f with s = 2y − 1."""
        if self.link == "logit":
            return torch.nn.functional.logsigmoid(signed_f)
        return torch.special.log_ndtr(signed_f)

    def validate_targets(self, y):
        """Raise :class:`~pyrogp_models.errors.DataError` unless every label is 0 or 1."""
        super().validate_targets(y)
        check_binary(y)

    def expected_log_prob(self, y, mean, var):
        sign = (2.0 * y - 1.0).unsqueeze(-1)
        return quadrature.expectation(lambda f: self.log_prob_signed(sign * f), mean, var)

    def log_predictive(self, y, mean, var):
        sign = 2.0 * y - 1.0
        if self.link == "probit":
            return torch.special.log_ndtr(sign * mean / (1.0 + var).sqrt())
        return quadrature.log_expectation(lambda f: self.log_prob_signed(sign.unsqueeze(-1) * f),
                                          mean, var)

    def log_likelihood_ceiling(self, counts):
        """0: a probability of a label is at most 1."""
        return torch.zeros_like(counts)

    def constant_log_likelihood(self, y):
        """k log p̂ + (N − k) log(1 − p̂) with k ones among N labels, p̂ = k/N."""
        ones = y.sum()
        rest = y.numel() - ones
        return (torch.special.xlogy(ones, ones / y.numel())
                + torch.special.xlogy(rest, rest / y.numel()))

    def predictive_moments(self, mean, var):
        """p(y=1) and its Bernoulli variance p(1−p)."""
        log_p = self.log_predictive(torch.ones_like(mean), mean, var)
        prob = log_p.exp()
        return prob, prob * (1.0 - prob)

    def distribution(self, f):
        if self.link == "logit":
            return dist.Bernoulli(logits=f)
        return dist.Bernoulli(probs=torch.special.ndtr(f))
