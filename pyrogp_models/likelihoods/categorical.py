"""Categorical likelihood over C latent functions, with a softmax or a robust-max link.

Latent moments have shape [..., N, C]; labels are integers 0..C−1.

- softmax: p(y=c|f) = exp f_c / Σ_j exp f_j. Expectations by Monte Carlo (reparameterised draws).
- robust-max (Hernández-Lobato et al. 2011): p(y=c|f) = 1−ε if c = argmax f, else ε/(C−1).
  E_q[log p(y|f)] = log(1−ε)·P_y + log(ε/(C−1))·(1−P_y), with
  P_y = ∫ N(x|m_y, v_y) Π_{j≠y} Φ((x − m_j)/√v_j) dx by 1-D Gauss–Hermite — deterministic.
"""

from __future__ import annotations

import math

import torch
from pyro import distributions as dist

from pyrogp_models.errors import DataError
from pyrogp_models.likelihoods import quadrature
from pyrogp_models.likelihoods.base import Likelihood

LINKS = ("softmax", "robustmax")
#: Gauss–Hermite nodes for P(f_c is the max): the integrand has steps as sharp as the narrowest
#: class, so 20 nodes leave Σ_c P_c off 1 by up to 5% when class variances differ 100-fold.
ROBUSTMAX_NODES = 60


class Categorical(Likelihood):
    """C-class classification.

    Args:
        num_classes: C ≥ 2.
        link: ``"softmax"`` or ``"robustmax"``.
        num_samples: Monte Carlo draws per point for the softmax link.
        epsilon: robust-max error rate ε.
    """

    name = "categorical"
    is_classifier = True

    def __init__(self, batch_shape=(), dtype=None, device=None, num_classes: int = 2,
                 link: str = "softmax", num_samples: int = 64, epsilon: float = 1e-3, **values):
        if link not in LINKS:
            raise ValueError(f"unknown link '{link}'; choose from {LINKS}")
        if num_classes < 2:
            raise ValueError("a categorical likelihood needs at least 2 classes")
        super().__init__(batch_shape, dtype, device, **values)
        self.num_classes = num_classes
        self.link = link
        self.num_samples = num_samples
        self.epsilon = epsilon

    @property
    def num_latent(self) -> int:
        return self.num_classes

    def options(self):
        return {"num_classes": self.num_classes, "link": self.link,
                "num_samples": self.num_samples, "epsilon": self.epsilon}

    def validate_targets(self, y):
        super().validate_targets(y)
        bad = (y < 0) | (y >= self.num_classes) | (y != y.round())
        if bool(bad.any()):
            raise DataError(f"labels must be integers in 0..{self.num_classes - 1} "
                            f"for a {self.num_classes}-class likelihood")

    # softmax ----------------------------------------------------------------------------------
    def _draws(self, mean, var):
        noise = torch.randn((self.num_samples, *mean.shape), dtype=mean.dtype, device=mean.device)
        return mean + var.sqrt() * noise

    def _softmax_log_probs(self, y, mean, var):
        """log softmax_y(f_s) for draws f_s ~ q; shape [S, ..., N]."""
        log_probs = torch.log_softmax(self._draws(mean, var), dim=-1)
        index = y.long().expand(log_probs.shape[:-1]).unsqueeze(-1)
        return log_probs.gather(-1, index).squeeze(-1)

    # robust-max -------------------------------------------------------------------------------
    def _prob_is_max(self, mean, var):
        """P(f_c = max_j f_j) for every class c; shape [..., N, C]."""
        nodes, log_weights = quadrature.nodes_and_log_weights(mean, ROBUSTMAX_NODES)
        std = var.sqrt()
        # x_{s,c} = m_c + s_c·node_s: [..., N, C, S]
        x = mean.unsqueeze(-1) + std.unsqueeze(-1) * nodes
        # Φ((x_{s,c} − m_j)/s_j) for every j: [..., N, C, J, S]
        z = (x.unsqueeze(-2) - mean.unsqueeze(-2).unsqueeze(-1)) / std.unsqueeze(-2).unsqueeze(-1)
        log_cdf = torch.special.log_ndtr(z)
        eye = torch.eye(self.num_classes, dtype=torch.bool, device=mean.device).unsqueeze(-1)
        log_cdf = log_cdf.masked_fill(eye, 0.0)
        return torch.logsumexp(log_cdf.sum(-2) + log_weights, dim=-1).exp().clamp(0.0, 1.0)

    def _robustmax_probs(self, prob_max):
        off = self.epsilon / (self.num_classes - 1)
        return (1.0 - self.epsilon) * prob_max + off * (1.0 - prob_max)

    # interface --------------------------------------------------------------------------------
    def expected_log_prob(self, y, mean, var):
        if self.link == "softmax":
            return self._softmax_log_probs(y, mean, var).mean(0)
        p_y = self._prob_is_max(mean, var).gather(-1, y.long().unsqueeze(-1)).squeeze(-1)
        off = self.epsilon / (self.num_classes - 1)
        return math.log(1.0 - self.epsilon) * p_y + math.log(off) * (1.0 - p_y)

    def log_predictive(self, y, mean, var):
        if self.link == "softmax":
            log_probs = self._softmax_log_probs(y, mean, var)
            return torch.logsumexp(log_probs, dim=0) - math.log(self.num_samples)
        probs = self._robustmax_probs(self._prob_is_max(mean, var))
        return probs.gather(-1, y.long().unsqueeze(-1)).squeeze(-1).log()

    def predictive_moments(self, mean, var):
        """Class probabilities [..., N, C] and their variances p(1 − p)."""
        if self.link == "softmax":
            probs = torch.softmax(self._draws(mean, var), dim=-1).mean(0)
        else:
            probs = self._robustmax_probs(self._prob_is_max(mean, var))
        return probs, probs * (1.0 - probs)

    def distribution(self, f):
        if self.link == "softmax":
            return dist.Categorical(logits=f)
        winner = torch.nn.functional.one_hot(f.argmax(-1), self.num_classes).to(f.dtype)
        off = self.epsilon / (self.num_classes - 1)
        return dist.Categorical(probs=(1.0 - self.epsilon) * winner + off * (1.0 - winner))
