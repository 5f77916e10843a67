"""The rational-quadratic kernel: a scale mixture of RBF kernels.

    k(x, z) = σ² (1 + r²/(2α))^(−α),   r² = Σ_d (x_d − z_d)²/ℓ_d²,

an RBF of lengthscale ℓ as α → ∞ (Rasmussen & Williams 2006, eq. 4.19; scikit-learn's
``RationalQuadratic`` and ``pyro.contrib.gp.kernels.RationalQuadratic`` compute the same).
Computed as σ² exp(−α log1p(r²/(2α))): the power of 1 + r²/(2α) loses r²/(2α) to rounding once α
is large, and fits that prefer the RBF limit drive α to 10¹¹–10¹³ (Mauna Loa CO2 in blocks),
where the power's Gram matrices were not positive semi-definite.
"""

from __future__ import annotations

import torch

from pyrogp_models.kernels.base import Role
from pyrogp_models.kernels.leaf import Hyperparameter, Leaf
from pyrogp_models.kernels.stationary import stationary_covariance


class RationalQuadratic(Leaf):
    """σ² (1 + r²/(2α))^(−α) (module docstring); hyperparameters ``lengthscale`` [*batch, D|1],
    ``variance`` and ``alpha`` [*batch]."""

    kind = "rq"
    hyperparameters = (Hyperparameter("lengthscale", Role.INPUT_SCALE, per_dimension=True),
                       Hyperparameter("variance", Role.OUTPUT_SCALE),
                       Hyperparameter("alpha", Role.SHAPE))

    def covariance(self, X: torch.Tensor, Z: torch.Tensor, same: bool) -> torch.Tensor:
        """σ² (1 + r²/(2α))^(−α) [*batch, N, M], in one autograd step
        (:func:`pyrogp_models.kernels.stationary.stationary_covariance`)."""
        return stationary_covariance("rq", X, Z, self.lengthscale, self.variance,
                                     shape=self.alpha)

    def weighted_cross(self, X: torch.Tensor, Z: torch.Tensor,
                       weights: torch.Tensor | None = None) -> torch.Tensor:
        """√w_n k(x_n, z_m) [*batch, N, M] (the weights in the same step)."""
        return stationary_covariance("rq", self.slice(X), self.slice(Z), self.lengthscale,
                                     self.variance, weights, self.alpha)
