"""A fit whose start factorises only with more jitter than the first rung: the trainer climbs the
jitter ladder on the device (as the checked factorisations do) instead of stopping with a NaN
loss at step 1."""

from __future__ import annotations

import numpy as np
import pyro
import torch
from pyro.nn import PyroModule
from pyrogp_models.inference.trainer import TrainConfig, train

from helpers import with_smallest_eigenvalue
from pyrogp_models.gaussian.linalg import cholesky, logdet_from_cholesky


class LogdetMembers(PyroModule):
    """Two independent members, f_k(θ_k) = (θ_k − 2)² − ½ log|B_k + θ_k² I|, θ_k = 0 at the start:
    B_0 is positive definite, B_1's smallest eigenvalue is −5e-6 × its mean diagonal, so that
    member's start factorises at the second rung of the jitter ladder only."""

    def __init__(self):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        self.register_buffer("matrices", torch.stack([with_smallest_eigenvalue(0.2, 4),
                                                     with_smallest_eigenvalue(-5e-6, 4)]))

    def objective(self) -> torch.Tensor:
        eye = torch.eye(4, dtype=torch.float64)
        shifted = self.matrices + self.theta[:, None, None] ** 2 * eye
        return (self.theta - 2) ** 2 - 0.5 * logdet_from_cholesky(cholesky(shifted))

    def member_objectives(self, precise: bool = False):
        return [([self.theta], self.objective)]

    def model(self):
        pyro.factor("objective", -self.objective().sum())

    def guide(self):
        pass


def test_a_start_that_needs_a_higher_rung_trains_where_it_stopped_at_step_1():
    model = LogdetMembers()
    result = train(model, config=TrainConfig(optimizer="lbfgs", lr=1.0, steps=200, window=10,
                                             tol=1e-9))
    assert result.converged and np.isfinite(result.losses).all()
    # each member at its own minimum: 2(θ − 2) − θ Σ 1/(λ_i + θ²) = 0 (up to the jitter)
    eigenvalues = torch.linalg.eigvalsh(model.matrices)
    theta = model.theta.detach()
    gradient = 2 * (theta - 2) - theta * (1 / (eigenvalues + theta[:, None] ** 2)).sum(-1)
    np.testing.assert_allclose(gradient.numpy(), 0.0, atol=1e-4)
