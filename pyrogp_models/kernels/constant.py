"""Kernels that do not depend on where the inputs are: a constant offset and white noise.

- ``Constant``: k(x, z) = σ², a random level shared by every input (a bias).
- ``White``: k(x, z) = σ² δ(x, z), independent noise at every input. As in GPflow, it counts
  only within one set of inputs: k(X) = σ²I, while a cross-covariance k(X, Z) between two sets
  (data and inducing inputs) is zero, so a sparse GP predicts the white part as variance it
  cannot explain.
"""

from __future__ import annotations

import torch

from pyrogp_models.kernels.base import Role
from pyrogp_models.kernels.leaf import Hyperparameter, Leaf


class Constant(Leaf):
    """k(x, z) = σ² (module docstring); ``variance`` [*batch]."""

    kind = "constant"
    hyperparameters = (Hyperparameter("variance", Role.OUTPUT_SCALE),)

    def covariance(self, X: torch.Tensor, Z: torch.Tensor, same: bool) -> torch.Tensor:
        """σ² everywhere, [*batch, N, M]."""
        shape = torch.broadcast_shapes(X.shape[:-2], Z.shape[:-2], self.batch_shape)
        return self.variance[..., None, None].expand(*shape, X.shape[-2], Z.shape[-2])


class White(Leaf):
    """k(X) = σ²I, k(X, Z) = 0 for two sets of inputs (module docstring); ``variance``
    [*batch]."""

    kind = "white"
    hyperparameters = (Hyperparameter("variance", Role.OUTPUT_SCALE),)

    def covariance(self, X: torch.Tensor, Z: torch.Tensor, same: bool) -> torch.Tensor:
        """σ²I when ``same`` (k(X)), else zeros; [*batch, N, M]."""
        shape = torch.broadcast_shapes(X.shape[:-2], Z.shape[:-2], self.batch_shape)
        if not same:
            return X.new_zeros(*shape, X.shape[-2], Z.shape[-2])
        eye = torch.eye(X.shape[-2], dtype=X.dtype, device=X.device)
        return (self.variance[..., None, None] * eye).expand(*shape, X.shape[-2], Z.shape[-2])
