"""Fitting a distributed-kernel GP: Pyro SVI, or a closed-form inner solve for q (Gaussian).

Two schemes, both maximising the mean-field (or joint) ELBO of
:class:`~pyrogp_models.models.distributed_kernel.model.DistributedKernelGP`:

- ``method="svi"``: Pyro's ``TraceMeanField_ELBO`` of ``model``/``guide`` over all parameters
  (q, Z, ℓ, σ_f², likelihood, cuts), with Adam; any likelihood; minibatches via ``batch_size``.
- ``method="solve"`` (Gaussian, mean-field): every step first sets q to its optimum for the
  current (θ, Z, cuts) by preconditioned CG (warm-started, O(n m) per iteration after one
  O(n m²) projection), then takes an Adam step on (θ, Z, cuts) along the gradient of the ELBO at
  that fixed q. At the optimum ∂ELBO/∂q = 0, so this is the gradient of the collapsed mean-field
  bound (envelope theorem): the optimiser never has to chase q.

Both loops can stop on a wall-clock budget, for equal-time comparisons.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import pyro
import torch
from pyro.infer import TraceMeanField_ELBO

from pyrogp_models.models.distributed_kernel.backfitting import solve_meanfield
from pyrogp_models.models.distributed_kernel.model import DistributedKernelGP

pyro.settings.set(module_local_params=True)

METHODS = ("svi", "solve")


@dataclass
class DistributedKernelFitConfig:
    """How to fit. ``steps`` bounds the outer steps, ``time_budget`` (seconds) the wall time."""

    method: str = "solve"
    steps: int = 300
    lr: float = 0.02
    batch_size: int | None = None
    time_budget: float | None = None
    inner_iters: int = 100
    inner_tol: float = 1e-7
    seed: int | None = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown fitting method '{self.method}'; choose from {METHODS}")


@dataclass
class DistributedKernelFitResult:
    """Negative ELBO after each step, the elapsed seconds then, and CG iterations per step."""

    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    inner_iterations: list[int] = field(default_factory=list)
    steps: int = 0

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan


def _outer_parameters(model: DistributedKernelGP) -> list[torch.nn.Parameter]:
    """Everything but q: kernel, likelihood, Z and (if learned) the cuts."""
    return [p for name, p in model.named_parameters()
            if not name.startswith(("q_mean", "q_sqrt"))]


def fit_distributed_kernel(model: DistributedKernelGP, X: torch.Tensor, y: torch.Tensor,
                           config: DistributedKernelFitConfig | None = None
                           ) -> DistributedKernelFitResult:
    """Train ``model`` on (X [N, D], y [N]) in place; see the module docstring for the schemes."""
    config = config or DistributedKernelFitConfig()
    if config.seed is not None:
        pyro.set_rng_seed(config.seed)
    if config.method == "solve":
        if model.variational != "meanfield" or model.likelihood.name != "gaussian":
            raise ValueError("method='solve' needs the mean-field variant and a Gaussian "
                             "likelihood; use method='svi'")
        if config.batch_size is not None:
            raise ValueError("method='solve' uses all data; minibatches need method='svi'")
        params = _outer_parameters(model)
    else:
        params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=config.lr)
    elbo = TraceMeanField_ELBO()
    result = DistributedKernelFitResult()
    start = time.perf_counter()
    for _ in range(config.steps):
        optimizer.zero_grad()
        if config.method == "solve":
            projections = model.projections(X)
            solve = solve_meanfield(model, X, y, max_iters=config.inner_iters,
                                    tol=config.inner_tol, projections=projections)
            result.inner_iterations.append(solve.iterations)
            loss = -model.elbo(X, y, projections=projections)
        else:
            loss = elbo.differentiable_loss(model.model, model.guide, X, y,
                                            batch_size=config.batch_size)
        loss.backward()
        optimizer.step()
        result.losses.append(float(loss.detach()))
        result.times.append(time.perf_counter() - start)
        result.steps += 1
        if not math.isfinite(result.losses[-1]):
            raise FloatingPointError(f"the loss became {result.losses[-1]} at step "
                                     f"{result.steps}; try a smaller learning rate")
        if config.time_budget is not None and result.times[-1] >= config.time_budget:
            break
    if config.method == "solve":
        solve_meanfield(model, X, y, max_iters=config.inner_iters, tol=config.inner_tol)
    return result
