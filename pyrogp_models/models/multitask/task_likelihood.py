"""Observations of rows of different tasks: p(y_n | f_n) with the likelihood parameters of the
row's own task t_n (per-task Gaussian noise, Boustati et al. Sec. 4.2).

The likelihood is batched over tasks, so its distribution at f spread over all T tasks has batch
[..., T, N]; :class:`TaskSelected` reads it at every row's own task. Sampling draws all T and
keeps one (prediction only); ``log_prob`` scores y under every task's parameters and keeps one.
"""

from __future__ import annotations

import torch
from pyro.distributions import TorchDistribution

from pyrogp_models.likelihoods import Likelihood


class TaskSelected(TorchDistribution):
    """p(y_n | f_n) for rows f [..., N(, L)] of tasks ``tasks`` [N]: batch shape [..., N]."""

    arg_constraints: dict = {}

    def __init__(self, likelihood: Likelihood, f: torch.Tensor, tasks: torch.Tensor):
        self.likelihood, self.f, self.tasks = likelihood, f, tasks
        latent_dims = 0 if likelihood.num_latent == 1 else 1
        rows = f.dim() - latent_dims - 1
        spread = f.unsqueeze(rows).expand(*f.shape[:rows], likelihood.batch_shape[0],
                                          *f.shape[rows:])
        self.base = likelihood.distribution(spread)
        batch_shape = self.base.batch_shape
        super().__init__(batch_shape[:-2] + batch_shape[-1:], self.base.event_shape,
                         validate_args=False)

    @property
    def support(self):
        return self.base.support

    def expand(self, batch_shape, _instance=None):
        """The same selection with f broadcast to ``batch_shape`` (Pyro's plates expand)."""
        latent = self.f.shape[len(self.batch_shape):]
        return TaskSelected(self.likelihood, self.f.expand(*batch_shape, *latent), self.tasks)

    def sample(self, sample_shape=()):
        return self._own_task(self.base.sample(torch.Size(sample_shape)))

    def log_prob(self, value):
        return self._own_task(self.base.log_prob(value.unsqueeze(-2)))

    def _own_task(self, values: torch.Tensor) -> torch.Tensor:
        """values [..., T, N] → [..., N] at every row's own task."""
        index = self.tasks.expand(*values.shape[:-2], 1, values.shape[-1])
        return values.gather(-2, index).squeeze(-2)
