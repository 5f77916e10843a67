"""The periodic (exp-sine-squared) kernel of MacKay (1998).

    k(x, z) = σ² exp(−2 Σ_d sin²(π (x_d − z_d)/p_d) / ℓ_d²),

with period p and a dimensionless lengthscale ℓ (in units of the period): scikit-learn's
``ExpSineSquared`` for one input dimension and ``pyro.contrib.gp.kernels.Periodic``. Multiplied
by a long RBF it gives a quasi-periodic (seasonal) component whose shape may drift.
"""

from __future__ import annotations

import math

import torch

from pyrogp_models.kernels.base import Role
from pyrogp_models.kernels.leaf import Hyperparameter, Leaf


class Periodic(Leaf):
    """σ² exp(−2 Σ_d sin²(π(x_d − z_d)/p_d)/ℓ_d²) (module docstring); ``period`` and
    ``lengthscale`` [*batch, D|1], ``variance`` [*batch]."""

    kind = "periodic"
    hyperparameters = (Hyperparameter("period", Role.INPUT_SCALE, per_dimension=True),
                       Hyperparameter("lengthscale", Role.SHAPE, per_dimension=True),
                       Hyperparameter("variance", Role.OUTPUT_SCALE))

    def covariance(self, X: torch.Tensor, Z: torch.Tensor, same: bool) -> torch.Tensor:
        """σ² exp(−2 Σ_d sin²(π d/p)/ℓ²) [*batch, N, M]."""
        difference = X.unsqueeze(-2) - Z.unsqueeze(-3)  # [*batch, N, M, D]
        period = self.period[..., None, None, :]
        lengthscale = self.lengthscale[..., None, None, :]
        scaled = torch.sin(math.pi * difference / period) / lengthscale
        return self.variance[..., None, None] * torch.exp(-2.0 * scaled.square().sum(-1))
