"""The linear kernel, a Bayesian linear regression: k(x, z) = Σ_d w_d (x_d − c_d)(z_d − c_d).

The weights w (prior variances of the slopes) and the centre c are hyperparameters; with the
centre, the kernel is the same function in any units of x (a shift of the inputs moves c), so a
module with a linear part converts exactly between sites (:mod:`pyrogp_models.modules.units`).
Its diagonal grows as ‖x − c‖²: it is not stationary.
"""

from __future__ import annotations

import torch

from pyrogp_models.kernels.base import Role
from pyrogp_models.kernels.leaf import Hyperparameter, Leaf


class Linear(Leaf):
    """Σ_d w_d (x_d − c_d)(z_d − c_d) (module docstring); ``variance`` (the weights w)
    [*batch, D|1] and ``centre`` [*batch, D] (any real value)."""

    kind = "linear"
    hyperparameters = (Hyperparameter("variance", Role.SLOPE, per_dimension=True),
                       Hyperparameter("centre", Role.INPUT_LOCATION, per_dimension=True,
                                      positive=False, default=0.0))

    def value_shape(self, h: Hyperparameter) -> tuple[int, ...]:
        """The centre always has one value per dimension; the weights one or D (``ard``)."""
        if h.name == "centre":
            return (*self.batch_shape, self.input_dim)
        return super().value_shape(h)

    def covariance(self, X: torch.Tensor, Z: torch.Tensor, same: bool) -> torch.Tensor:
        """(X − c) diag(w) (Z − c)ᵀ [*batch, N, M]."""
        return self._weighted_product(X, Z, None)

    def weighted_cross(self, X: torch.Tensor, Z: torch.Tensor,
                       weights: torch.Tensor | None = None) -> torch.Tensor:
        """√w_n k(x_n, z_m) [*batch, N, M] (point weights w_n, not the slope weights)."""
        return self._weighted_product(self.slice(X), self.slice(Z), weights)

    def _weighted_product(self, X: torch.Tensor, Z: torch.Tensor,
                          weights: torch.Tensor | None) -> torch.Tensor:
        """(√w ∘ (X − c) diag(w_d)) (Z − c)ᵀ on sliced inputs: the point weights applied to the
        thin left factor, not to the N × M result."""
        centre = self.centre.unsqueeze(-2)
        left = (X - centre) * self.variance.unsqueeze(-2)
        if weights is not None:
            left = left * weights.sqrt().unsqueeze(-1)
        return left @ (Z - centre).mT

    def diagonal(self, X: torch.Tensor) -> torch.Tensor:
        """Σ_d w_d (x_d − c_d)² [*batch, N]."""
        return ((X - self.centre.unsqueeze(-2)).square() * self.variance.unsqueeze(-2)).sum(-1)
