"""The likelihood interface shared by local SVGPs, modules, meta-GPs and expert combinations.

A likelihood p(y | f) with parameters batched like the GPs that use it (shape ``[*batch]``).
For ``num_latent == 1`` latent moments have shape ``[*batch, N]``; for several latent functions
they have shape ``[*batch, N, L]``.

Every likelihood provides, for q(f) = N(m, v):
- ``expected_log_prob(y, m, v)`` = E_q[log p(y|f)], the SVGP data term (Hensman et al. 2015);
- ``log_predictive(y, m, v)`` = log ∫ p(y|f) q(f) df, used for NLPD;
- ``predictive_moments(m, v)``: mean and variance of y (class probabilities for classifiers);
- ``distribution(f)``: p(y|f) for sampled f (posterior-predictive draws, pointwise log-lik);
- ``constant_log_likelihood(y)``: the log likelihood of the best fit that ignores the inputs;
- ``log_likelihood_ceiling(counts)``: what no ELBO exceeds (a check on rounding).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam

from pyrogp_models.errors import DataError


class Likelihood(PyroModule):
    """Base class. Subclasses declare ``name``, ``num_latent`` and their ``PARAMETERS``.

    ``PARAMETERS`` maps a parameter name to (default value, constraint); each becomes a
    :class:`PyroParam` of shape ``batch_shape``.
    """

    name: ClassVar[str]
    PARAMETERS: ClassVar[dict[str, tuple[float, constraints.Constraint]]] = {}
    #: Whether targets are standardised (location–scale likelihoods) before fitting.
    standardise_targets: ClassVar[bool] = False
    #: Whether the observation is a class label (classification metrics apply).
    is_classifier: ClassVar[bool] = False

    def __init__(self, batch_shape: tuple[int, ...] = (), dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, **values):
        super().__init__()
        self.batch_shape = torch.Size(batch_shape)
        dtype = dtype or torch.get_default_dtype()
        unknown = set(values) - set(self.PARAMETERS)
        if unknown:
            raise ValueError(f"{self.name} likelihood has no parameter {sorted(unknown)}")
        for key, (default, constraint) in self.PARAMETERS.items():
            value = torch.as_tensor(values.get(key, default), dtype=dtype, device=device)
            setattr(self, key, PyroParam(value.expand(batch_shape).clone(), constraint=constraint))

    @property
    def num_latent(self) -> int:
        """Latent functions per observation (1; C for C classes)."""
        return 1

    @property
    def stochastic(self) -> bool:
        """Whether the expected log-likelihood is a Monte Carlo estimate (False: in closed form
        or by deterministic quadrature)."""
        return False

    def options(self) -> dict:
        """Structural, non-learned settings (saved in module files)."""
        return {}

    def parameter_values(self) -> dict[str, torch.Tensor]:
        """Constrained parameter values, shape ``batch_shape`` each."""
        return {key: getattr(self, key) for key in self.PARAMETERS}

    def validate_targets(self, y: torch.Tensor) -> None:
        """Raise :class:`DataError` if ``y`` lies outside the likelihood's support."""
        if not bool(torch.isfinite(y).all()):
            raise DataError("targets contain NaN or inf")

    def _param(self, key: str) -> torch.Tensor:
        """Parameter broadcast against per-point tensors of shape [*batch, N]."""
        return getattr(self, key).unsqueeze(-1)

    # The probabilistic interface -------------------------------------------------------------
    def expected_log_prob(self, y, mean, var) -> torch.Tensor:
        """E_{N(f|mean, var)}[log p(y | f)] per point [*batch, N]: the data term of the SVGP
        ELBO (Hensman et al. 2015, eq. 4), in closed form or by quadrature."""
        raise NotImplementedError

    def log_predictive(self, y, mean, var) -> torch.Tensor:
        """log ∫ p(y | f) N(f | mean, var) df per point [*batch, N]: the predictive log
        density that NLPD averages."""
        raise NotImplementedError

    def predictive_moments(self, mean, var) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of y under q(f) = N(mean, var), each [*batch, N] (for classifiers:
        the class probabilities and p(1 − p))."""
        raise NotImplementedError

    def distribution(self, f: torch.Tensor):
        """p(y | f) for sampled latent values f [..., N] (or [..., N, L]) as a Pyro
        distribution with batch shape [..., N]: posterior-predictive draws and pointwise
        log-likelihoods."""
        raise NotImplementedError

    def log_likelihood_ceiling(self, counts: torch.Tensor) -> torch.Tensor:
        """sup_f Σ_n log p(y_n | f_n) over ``counts`` [*batch] points of each batch member, at
        the current parameters: no ELBO reaches above it (its KL is ≥ 0), so a bound evaluated
        above it is rounding error. +∞ (no ceiling) unless a likelihood knows its own."""
        return torch.full_like(counts, math.inf)

    def constant_log_likelihood(self, y: torch.Tensor) -> torch.Tensor:
        """max_θ Σ_n log p(y_n | θ) over the family's distributions with one θ for all of
        ``y`` [N] (maximum likelihood, in closed form): what a model that has learnt nothing from
        its inputs scores, so the least a fit's ELBO should exceed."""
        raise NotImplementedError


def check_binary(y: torch.Tensor) -> None:
    """Labels must be exactly 0 or 1."""
    bad = ~((y == 0) | (y == 1))
    if bool(bad.any()):
        values = sorted({float(v) for v in y[bad].flatten()[:5].tolist()})
        raise DataError(f"labels must be 0 or 1 for a Bernoulli likelihood; found {values}")


def latent_layout(values: torch.Tensor) -> torch.Tensor:
    """Latent moments [..., L, N] in the likelihoods' layout: [..., N] for one latent function,
    [..., N, L] for several."""
    return values.squeeze(-2) if values.shape[-2] == 1 else values.transpose(-1, -2)
