"""The periodic (exp-sine-squared) kernel of MacKay (1998).

    k(x, z) = σ² exp(−2 Σ_d sin²(π (x_d − z_d)/p_d) / ℓ_d²),

with period p and a dimensionless lengthscale ℓ (in units of the period): scikit-learn's
``ExpSineSquared`` for one input dimension and ``pyro.contrib.gp.kernels.Periodic``. Multiplied
by a long RBF it gives a quasi-periodic (seasonal) component whose shape may drift.

With 2 sin²(θ/2) = 1 − cos θ and θ = a_x − a_z, a = 2π x/p, the exponent is a product of thin
factors, as the RBF's is (:mod:`pyrogp_models.kernels.fused_rbf`):

    log k(x, z) = log σ² + Σ_d [cos a_xd cos a_zd + sin a_xd sin a_zd − 1]/ℓ_d²,

so √w_n k(x_n, z_m) = exp(P Qᵀ) with P_n = [cos a_xn/ℓ², sin a_xn/ℓ², ½ log w_n, 1] and
Q_m = [cos a_zm, sin a_zm, 1, log σ² − Σ_d 1/ℓ_d²]: one product and one exponential, and a
backward that keeps only the result (inputs shifted by the inducing inputs' mean first, which
changes no difference and keeps the angles small).
"""

from __future__ import annotations

import math

import torch

from pyrogp_models.kernels.base import Role
from pyrogp_models.kernels.fused_rbf import exp_cross_covariance, half_log_weights, stacked_factors
from pyrogp_models.kernels.leaf import Hyperparameter, Leaf
from pyrogp_models.kernels.profiles import scaled_inputs


class Periodic(Leaf):
    """σ² exp(−2 Σ_d sin²(π(x_d − z_d)/p_d)/ℓ_d²) (module docstring); ``period`` and
    ``lengthscale`` [*batch, D|1], ``variance`` [*batch]."""

    kind = "periodic"
    hyperparameters = (Hyperparameter("period", Role.INPUT_SCALE, per_dimension=True),
                       Hyperparameter("lengthscale", Role.SHAPE, per_dimension=True),
                       Hyperparameter("variance", Role.OUTPUT_SCALE))

    def covariance(self, X: torch.Tensor, Z: torch.Tensor, same: bool) -> torch.Tensor:
        """σ² exp(−2 Σ_d sin²(π d/p)/ℓ²) [*batch, N, M]."""
        return exp_cross_covariance(*self._factors(X, Z, None))

    def weighted_cross(self, X: torch.Tensor, Z: torch.Tensor,
                       weights: torch.Tensor | None = None) -> torch.Tensor:
        """√w_n k(x_n, z_m) [*batch, N, M] (the weights inside the exponent)."""
        return exp_cross_covariance(*self._factors(self.slice(X), self.slice(Z), weights))

    def exponent_factors(self, X: torch.Tensor, Z: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(P [N, 2D+2], Q [M, 2D+2]) with k(X, Z) = exp(P Qᵀ) (module docstring); None for a
        batched kernel."""
        if self.batch_shape != ():
            return None
        left, right, _ = self._factors(self.slice(X), self.slice(Z), None)
        return left.squeeze(0), right.squeeze(0)

    def _factors(self, X: torch.Tensor, Z: torch.Tensor, weights: torch.Tensor | None):
        """P [B, N, 2D+2], Q [B, M, 2D+2] and the batch shape (module docstring)."""
        angle_x, angle_z = scaled_inputs(X, Z, self.period / (2.0 * math.pi))
        inverse = self.lengthscale.square().reciprocal()
        inverse = inverse.expand(*inverse.shape[:-1], X.shape[-1])  # one −1/ℓ² per dimension
        row = torch.zeros_like(angle_x[..., :1]) if weights is None else \
            half_log_weights(weights).unsqueeze(-1)
        column = (self.variance.log() - inverse.sum(-1))[..., None, None]
        inverse = inverse.unsqueeze(-2)
        return stacked_factors(
            [angle_x.cos() * inverse, angle_x.sin() * inverse, row, torch.ones_like(row)],
            [angle_z.cos(), angle_z.sin(), torch.ones_like(angle_z[..., :1]),
             column.expand(*column.shape[:-2], angle_z.shape[-2], 1)])
