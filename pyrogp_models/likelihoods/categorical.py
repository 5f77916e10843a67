"""Categorical likelihood over C latent functions, with a softmax or a robust-max link.

Latent moments have shape [..., N, C]; labels are integers 0..C−1.

- softmax: p(y=c|f) = exp f_c / Σ_j exp f_j. Expectations by Monte Carlo (reparameterised draws).
- robust-max (Hernández-Lobato et al. 2011): p(y=c|f) = 1−ε if c = argmax f, else ε/(C−1).
  E_q[log p(y|f)] = log(1−ε)·P_y + log(ε/(C−1))·(1−P_y), with
  P_y = ∫ N(x|m_y, v_y) Π_{j≠y} Φ((x − m_j)/√v_j) dx by 1-D Gauss–Legendre on pieces cut at the
  scale of every class (accurate however much the class variances differ) — deterministic.
"""

from __future__ import annotations

import math

import torch
from pyro import distributions as dist

from pyrogp_models.errors import DataError
from pyrogp_models.likelihoods import quadrature
from pyrogp_models.likelihoods.base import Likelihood

LINKS = ("softmax", "robustmax")
#: Standardised cut points t of the robust-max grid: every class k cuts the x axis at m_k + √v_k·t
#: (pieces of ≤ 2.83 standard deviations; with 10 nodes each, P_c is within 1e-9 of adaptive
#: quadrature at class variance ratios 1e-4..1e4).
#: Beyond ±8.5 standard deviations a Gaussian holds < 1e-17 of its mass.
ROBUSTMAX_BREAKS = tuple(-8.5 + 17.0 * i / 6 for i in range(7))
#: Gauss–Legendre nodes per piece of the robust-max grid.
ROBUSTMAX_LEGENDRE_NODES = 10


class Categorical(Likelihood):
    """C-class classification over C latent functions (latent moments [..., N, C], labels
    [..., N]): softmax by Monte Carlo, robust-max (Hernández-Lobato et al. 2011) by deterministic
    quadrature.

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
        """C, one latent function per class."""
        return self.num_classes

    @property
    def stochastic(self) -> bool:
        """The softmax link's expectation is a Monte Carlo estimate."""
        return self.link == "softmax"

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
    def _prob_is_max(self, mean, var, labels=None):
        """P(f_c = max_j f_j) for every class c, shape [..., N, C]; with ``labels`` (shape
        [..., N]) only for c = label, shape [..., N] (C times fewer exponentials).

        P_c = ∫ φ_c(x) Π_{j≠c} Φ_j(x) dx with φ_k, Φ_k the density and CDF of N(m_k, v_k), by
        Gauss–Legendre on one grid of x shared by all classes: the pieces are cut at
        m_k + √v_k·t for every class k and every t in :data:`ROBUSTMAX_BREAKS`, so every piece
        spans at most ~3 standard deviations of each class whose mass it meets, however different
        the class scales are. (A Gauss–Hermite rule scaled to class c cannot resolve the step of
        Φ_j when √v_j ≪ √v_c, nor φ_c when √v_c ≪ √v_j leaves its nodes where Φ_j ≈ 0: with
        60 nodes Σ_c P_c was off 1 by 5–10% at variance ratios of 10⁴.) The integrands of all
        classes sum to d/dx Π_k Φ_k, so Σ_c P_c = 1 up to the quadrature error (< 1e-9 in
        float64).
        """
        std = self._robustmax_std(mean, var)
        u, w = quadrature.legendre_nodes_and_weights(mean, ROBUSTMAX_LEGENDRE_NODES)
        breaks = torch.as_tensor(ROBUSTMAX_BREAKS, dtype=mean.dtype, device=mean.device)
        with torch.no_grad():
            # The grid does not change the integral it approximates: no gradient through it.
            edges = (mean.unsqueeze(-1) + std.unsqueeze(-1) * breaks).flatten(-2).sort(-1).values
            half = 0.5 * (edges[..., 1:] - edges[..., :-1])
            centre = 0.5 * (edges[..., 1:] + edges[..., :-1])
            x = (centre.unsqueeze(-1) + half.unsqueeze(-1) * u).flatten(-2)     # [..., N, X]
            weights = (half.unsqueeze(-1) * w).flatten(-2)                       # [..., N, X]
        z = (x.unsqueeze(-2) - mean.unsqueeze(-1)) / std.unsqueeze(-1)           # [..., N, C, X]
        # Beyond |z| = √(−2 log tiny) both φ(z) and Φ(−z) underflow anyway; clamping keeps the
        # gradient of log Φ finite (torch's is inf or NaN for very negative z).
        z_max = math.sqrt(-2.0 * math.log(torch.finfo(mean.dtype).tiny)) + 1.0
        z = z.clamp(-z_max, z_max)
        log_cdf = torch.special.log_ndtr(z)
        log_pdf = -0.5 * z.square() - (std.log() + 0.5 * math.log(2 * math.pi)).unsqueeze(-1)
        log_integrand = log_pdf + _exclusive_sum(log_cdf, dim=-2)               # [..., N, C, X]
        if labels is None:
            return (log_integrand.exp() * weights.unsqueeze(-2)).sum(-1).clamp(0.0, 1.0)
        index = labels.long().expand(mean.shape[:-1])[..., None, None]          # [..., N, 1, 1]
        own = log_integrand.gather(-2, index.expand(*index.shape[:-1], x.shape[-1])).squeeze(-2)
        return (own.exp() * weights).sum(-1).clamp(0.0, 1.0)

    @staticmethod
    def _robustmax_std(mean, var):
        """√v, floored at √(machine ε)·|m| (+ a tiny absolute floor) so that x − m_k keeps
        relative precision on the scale of class k (a zero variance gives a step)."""
        finfo = torch.finfo(mean.dtype)
        floor = math.sqrt(finfo.eps) * mean.detach().abs() + math.sqrt(finfo.tiny)
        return torch.maximum(var, floor.square()).sqrt()

    def _robustmax_probs(self, prob_max):
        off = self.epsilon / (self.num_classes - 1)
        return (1.0 - self.epsilon) * prob_max + off * (1.0 - prob_max)

    # interface --------------------------------------------------------------------------------
    def expected_log_prob(self, y, mean, var):
        if self.link == "softmax":
            return self._softmax_log_probs(y, mean, var).mean(0)
        p_y = self._prob_is_max(mean, var, labels=y)
        off = self.epsilon / (self.num_classes - 1)
        return math.log(1.0 - self.epsilon) * p_y + math.log(off) * (1.0 - p_y)

    def log_predictive(self, y, mean, var):
        if self.link == "softmax":
            log_probs = self._softmax_log_probs(y, mean, var)
            return torch.logsumexp(log_probs, dim=0) - math.log(self.num_samples)
        return self._robustmax_probs(self._prob_is_max(mean, var, labels=y)).log()

    def predictive_moments(self, mean, var):
        """Class probabilities [..., N, C] and their variances p(1 − p)."""
        if self.link == "softmax":
            probs = torch.softmax(self._draws(mean, var), dim=-1).mean(0)
        else:
            probs = self._robustmax_probs(self._prob_is_max(mean, var))
        return probs, probs * (1.0 - probs)

    def log_likelihood_ceiling(self, counts):
        """0: a probability of a label is at most 1."""
        return torch.zeros_like(counts)

    def constant_log_likelihood(self, y):
        """Softmax: Σ_c n_c log(n_c / N) with n_c labels of class c among N. Robust-max, whose
        distributions put 1 − ε on one class and ε/(C − 1) on each other: the most frequent
        class, n_max log(1 − ε) + (N − n_max) log(ε/(C − 1))."""
        counts = torch.bincount(y.long(), minlength=self.num_classes).to(y.dtype)
        if self.link == "softmax":
            return torch.special.xlogy(counts, counts / y.numel()).sum()
        most = counts.max()
        return (torch.special.xlogy(most, y.new_tensor(1.0 - self.epsilon))
                + torch.special.xlogy(y.numel() - most,
                                      y.new_tensor(self.epsilon / (self.num_classes - 1))))

    def distribution(self, f):
        if self.link == "softmax":
            return dist.Categorical(logits=f)
        winner = torch.nn.functional.one_hot(f.argmax(-1), self.num_classes).to(f.dtype)
        off = self.epsilon / (self.num_classes - 1)
        return dist.Categorical(probs=(1.0 - self.epsilon) * winner + off * (1.0 - winner))


def _exclusive_sum(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Σ_{j≠c} values_j for every c along ``dim``, from shifted prefix and suffix sums: no
    subtraction, so −inf entries and large magnitudes cannot cancel into NaN or round-off."""
    size = values.shape[dim]
    zero = torch.zeros_like(values.narrow(dim, 0, 1))
    prefix = torch.cat([zero, values.narrow(dim, 0, size - 1).cumsum(dim)], dim)
    suffix = values.narrow(dim, 1, size - 1).flip(dim).cumsum(dim).flip(dim)
    return prefix + torch.cat([suffix, zero], dim)
