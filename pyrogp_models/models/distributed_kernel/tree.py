"""Greedy tree partition: split the leaf, dimension and cut with the best bound gain.

The slides pick the split dimension "with a criterion like information gain in decision trees";
here the criterion is the collapsed bound itself. Starting from one region (R^D), every step tries,
for every leaf and dimension, cuts at a few quantiles of the leaf's points, builds the candidate
partition (m inducing inputs per region on a grid over its points, hyperparameters fixed) and
keeps the candidate whose collapsed bound (mean-field by default, or joint) is largest. A cut must
leave at least ``min_width``·ℓ_d of data extent and ``num_inducing`` points on both sides.
Candidates are scored on at most ``max_points`` points (dense O(n J²m²) bounds); this is a
structure search run once before training, so its loops are plain Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from pyrogp_models.errors import CholeskyError, DataError
from pyrogp_models.likelihoods import make_likelihood
from pyrogp_models.models.distributed_kernel import collapsed
from pyrogp_models.models.distributed_kernel.construct import init_region_inducing
from pyrogp_models.models.distributed_kernel.local_kernels import shared_se_kernel
from pyrogp_models.models.distributed_kernel.model import DistributedKernelGP
from pyrogp_models.models.distributed_kernel.regions import Regions

BOUNDS = ("meanfield", "joint")


@dataclass
class TreeStep:
    """One accepted split: the leaf, dimension and cut value, and the bound after it."""

    leaf: int
    dim: int
    cut: float
    bound: float


@dataclass
class TreeResult:
    regions: Regions
    initial_bound: float
    steps: list[TreeStep] = field(default_factory=list)


def _score(X, y, lower, upper, num_inducing, lengthscale, variance, noise, bound) -> float:
    regions = Regions.from_boxes(lower, upper)
    Z = init_region_inducing(X, regions, num_inducing)
    kernel = shared_se_kernel(X.shape[1], lengthscale.numel() > 1, lengthscale, variance,
                              dtype=X.dtype, device=X.device)
    likelihood = make_likelihood("gaussian", (), X.dtype, X.device, variance=noise)
    model = DistributedKernelGP(regions, Z, kernel, likelihood, learn_inducing=False)
    with torch.no_grad():
        if bound == "joint":
            return float(collapsed.joint_collapsed_bound(model, X, y))
        return float(collapsed.meanfield_collapsed_bound(model, X, y))


@torch.no_grad()
def greedy_tree(X: torch.Tensor, y: torch.Tensor, num_regions: int, num_inducing: int,
                lengthscale: float | torch.Tensor, variance: float, noise: float,
                min_width: float = 2.0, quantiles: tuple[float, ...] = (0.25, 0.5, 0.75),
                bound: str = "meanfield", max_points: int = 2000,
                generator: torch.Generator | None = None) -> TreeResult:
    """Grow a box partition with up to ``num_regions`` leaves by greedy bound gain.

    Stops early when no admissible cut is left. Returns the regions and the accepted splits.
    """
    if bound not in BOUNDS:
        raise ValueError(f"unknown bound '{bound}'; choose from {BOUNDS}")
    num_points, input_dim = X.shape
    if num_points > max_points:
        keep = torch.randperm(num_points, generator=generator)[:max_points]
        X, y = X[keep], y[keep]
    ell = torch.as_tensor(lengthscale, dtype=X.dtype).reshape(-1).expand(input_dim).clone()
    ell_arg = ell if torch.as_tensor(lengthscale).numel() > 1 else ell[:1]
    lower = X.new_full((1, input_dim), -math.inf)
    upper = X.new_full((1, input_dim), math.inf)
    best = _score(X, y, lower, upper, num_inducing, ell_arg, variance, noise, bound)
    result = TreeResult(Regions.from_boxes(lower, upper), best)
    while lower.shape[0] < num_regions:
        owner = Regions.from_boxes(lower, upper).owner(X)
        candidate = None
        for leaf in range(lower.shape[0]):
            points = X[owner == leaf]
            for d in range(input_dim):
                values = points[:, d]
                for q in quantiles:
                    cut = float(torch.quantile(values, q))
                    left, right = values < cut, values >= cut
                    if (int(left.sum()) < num_inducing or int(right.sum()) < num_inducing
                            or cut - float(values.min()) < min_width * float(ell[d])
                            or float(values.max()) - cut < min_width * float(ell[d])):
                        continue
                    new_lower = torch.cat([lower, lower[leaf:leaf + 1]])
                    new_upper = torch.cat([upper, upper[leaf:leaf + 1]])
                    new_upper[leaf, d] = cut
                    new_lower[-1, d] = cut
                    try:
                        score = _score(X, y, new_lower, new_upper, num_inducing, ell_arg,
                                       variance, noise, bound)
                    except (CholeskyError, DataError):
                        continue
                    if candidate is None or score > candidate[0]:
                        candidate = (score, leaf, d, cut, new_lower, new_upper)
        if candidate is None:
            break
        best, leaf, d, cut, lower, upper = candidate
        result.steps.append(TreeStep(leaf, d, cut, best))
    result.regions = Regions.from_boxes(lower, upper)
    return result
