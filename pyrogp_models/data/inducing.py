"""Initial inducing inputs for a batch of partitions: k-means centres or a regular grid."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from pyrogp_models.data.kmeans import kmeans
from pyrogp_models.errors import DataError

MAX_GRID_POINTS = 2**16
#: The most inducing inputs a GP takes by default: a local fit's partition
#: (:func:`default_num_inducing`), a meta-GP and a multitask model's process.
MAX_DEFAULT_INDUCING = 100


def default_num_inducing(rows):
    """A partition's default M = min(⌈N/2⌉, :data:`MAX_DEFAULT_INDUCING`) for its ``rows`` N (an
    int or an array of them): at least two points per inducing input on average, so that a
    module's Z summarises its partition's inputs rather than listing them (M = N would store
    Z = X), and never more than the cap. A meta-GP's default M takes the same rule, N being the
    modules' inducing inputs and raw rows it summarises."""
    return np.minimum((np.asarray(rows) + 1) // 2, MAX_DEFAULT_INDUCING)


@torch.no_grad()
def init_inducing(
    X: torch.Tensor,
    num_inducing: int,
    mask: torch.Tensor | None = None,
    method: Literal["kmeans", "grid"] = "kmeans",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Inducing inputs Z [*B, M, D] for the padded partitions ``X`` [*B, N, D].

    ``method="kmeans"`` places Z at k-means centres of each partition's real points;
    ``method="grid"`` places Z on a regular grid over each partition's bounding box
    (see ``grid_inducing``).
    """
    if method == "kmeans":
        return kmeans(X, num_inducing, mask, generator=generator)
    if method == "grid":
        return grid_inducing(X, num_inducing, mask)
    raise ValueError(f"unknown inducing initialisation {method!r}; use 'kmeans' or 'grid'")


@torch.no_grad()
def grid_inducing(
    X: torch.Tensor, num_inducing: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """A regular grid of ``num_inducing`` points over each partition's bounding box.

    Each axis gets n evenly spaced values from the partition's minimum to its maximum (the
    midpoint when n = 1), n being the smallest integer with n**D >= M. When the product grid has
    more than M points, the M kept are those nearest to the partition's mean, distances measured
    in units of the box's side lengths (ties broken by grid order); they are returned in grid
    order. For D = 1 this is M evenly spaced points from the minimum to the maximum.
    """
    if num_inducing < 1:
        raise DataError(f"need at least one inducing point, got {num_inducing}")
    if mask is None:
        mask = torch.ones(X.shape[:-1], dtype=torch.bool, device=X.device)
    counts = mask.sum(dim=-1)
    if (counts == 0).any():
        raise DataError("grid initialisation of inducing inputs found a partition with no points")
    num_dims = X.shape[-1]
    per_axis = _points_per_axis(num_inducing, num_dims)
    if per_axis**num_dims > MAX_GRID_POINTS:
        raise DataError(
            f"a grid of {per_axis}^{num_dims} inducing candidates is too large; "
            "use the 'kmeans' initialisation"
        )
    real = mask.unsqueeze(-1)
    infinity = torch.tensor(float("inf"), dtype=X.dtype, device=X.device)
    lower = torch.where(real, X, infinity).amin(dim=-2)
    upper = torch.where(real, X, -infinity).amax(dim=-2)
    extent = upper - lower
    if per_axis == 1:
        fractions = torch.full((1,), 0.5, dtype=X.dtype, device=X.device)
    else:
        fractions = torch.linspace(0, 1, per_axis, dtype=X.dtype, device=X.device)
    axes = torch.meshgrid(*([fractions] * num_dims), indexing="ij")
    unit_grid = torch.stack(axes, dim=-1).reshape(-1, num_dims)
    grid = lower.unsqueeze(-2) + extent.unsqueeze(-2) * unit_grid
    if grid.shape[-2] == num_inducing:
        return grid
    mean = torch.where(real, X, 0).sum(dim=-2) / counts.unsqueeze(-1).to(X.dtype)
    side = torch.where(extent > 0, extent, torch.ones_like(extent))
    distance = (((grid - mean.unsqueeze(-2)) / side.unsqueeze(-2)) ** 2).sum(dim=-1)
    nearest = distance.argsort(dim=-1, stable=True)[..., :num_inducing]
    kept = nearest.sort(dim=-1).values
    return torch.gather(grid, -2, kept.unsqueeze(-1).expand(*kept.shape, num_dims))


def _points_per_axis(num_points: int, num_dims: int) -> int:
    """The smallest integer n with n**num_dims >= num_points."""
    per_axis = max(1, round(num_points ** (1 / num_dims)))
    while per_axis**num_dims < num_points:
        per_axis += 1
    while per_axis > 1 and (per_axis - 1) ** num_dims >= num_points:
        per_axis -= 1
    return per_axis
