"""Batched k-means (k-means++ start, Lloyd iterations) over padded batches of point sets."""

from __future__ import annotations

import torch

from pyrogp_models.errors import DataError


@torch.no_grad()
def kmeans(
    X: torch.Tensor,
    num_centres: int,
    mask: torch.Tensor | None = None,
    num_iters: int = 25,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Cluster every batch element of ``X`` [*B, N, D] into ``num_centres`` groups.

    ``mask`` [*B, N] marks the real points (None: all are real); padded points are ignored.
    Returns the centres [*B, num_centres, D].
    """
    centres = kmeans_init(X, num_centres, mask, generator)
    return lloyd(X, centres, mask, num_iters)


@torch.no_grad()
def kmeans_init(
    X: torch.Tensor,
    num_centres: int,
    mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Starting centres [*B, num_centres, D], chosen among the real points by k-means++.

    The first centre is a uniformly random real point, each next one a real point drawn with
    probability proportional to its squared distance from the nearest centre so far; so the
    centres are distinct points whenever there are enough distinct points.
    """
    mask = _full_mask(X, mask)
    if num_centres < 1:
        raise DataError(f"k-means needs at least one centre, got {num_centres}")
    counts = mask.sum(dim=-1)
    if (counts < num_centres).any():
        raise DataError(
            f"k-means with {num_centres} centres needs at least {num_centres} real points in "
            f"every batch element; the smallest has {int(counts.min())}"
        )
    work_dtype = torch.promote_types(X.dtype, torch.float32)
    points = X.to(work_dtype)
    uniform = mask.to(work_dtype)
    weights = uniform
    nearest_squared = torch.full(mask.shape, float("inf"), dtype=work_dtype, device=X.device)
    chosen = []
    for _ in range(num_centres):
        index = _draw_index(weights, generator)
        chosen.append(index)
        centre = torch.gather(points, -2, index.unsqueeze(-1).expand(*index.shape, X.shape[-1]))
        nearest_squared = torch.minimum(nearest_squared, ((points - centre) ** 2).sum(dim=-1))
        weights = nearest_squared * uniform
        # Once every real point coincides with a centre, fall back to uniform draws.
        weights = torch.where(weights.sum(dim=-1, keepdim=True) > 0, weights, uniform)
    indices = torch.cat(chosen, dim=-1)
    return torch.gather(X, -2, indices.unsqueeze(-1).expand(*indices.shape, X.shape[-1]))


def _draw_index(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index [*B, 1] per row of ``weights`` [*B, N], with probability proportional to weight.

    Exponential race: the smallest of E_i / w_i with E_i ~ Exp(1) falls on i with probability
    w_i / sum(w); zero weights give infinite keys and are never drawn.
    """
    noise_device = weights.device if generator is None else generator.device
    # One stream whatever the default dtype and the points' dtype: the same centres then.
    uniform = torch.rand(weights.shape, generator=generator, device=noise_device,
                         dtype=torch.float64)
    exponential = -torch.log1p(-uniform.to(device=weights.device, dtype=weights.dtype))
    keys = torch.where(weights > 0, exponential / weights, torch.inf)
    return keys.argmin(dim=-1, keepdim=True)


@torch.no_grad()
def lloyd(
    X: torch.Tensor,
    centres: torch.Tensor,
    mask: torch.Tensor | None = None,
    num_iters: int = 25,
) -> torch.Tensor:
    """Refine ``centres`` [*B, K, D] by at most ``num_iters`` Lloyd iterations on ``X`` [*B, N, D].

    Stops early once no assignment changes. A centre that loses all its points stays where it is.
    """
    mask = _full_mask(X, mask)
    work_dtype = torch.promote_types(X.dtype, torch.float32)
    points = X.to(work_dtype)
    real_points = torch.where(mask.unsqueeze(-1), points, 0)
    is_real = mask.to(work_dtype)
    current = centres.to(work_dtype)
    assignments = None
    for _ in range(num_iters):
        new_assignments = kmeans_assign(points, current)
        if assignments is not None and torch.equal(new_assignments, assignments):
            break
        assignments = new_assignments
        sums = torch.zeros_like(current).scatter_add_(
            -2, assignments.unsqueeze(-1).expand_as(points), real_points
        )
        counts = torch.zeros(current.shape[:-1], dtype=work_dtype, device=X.device)
        counts.scatter_add_(-1, assignments, is_real)
        has_points = counts.unsqueeze(-1) > 0
        current = torch.where(has_points, sums / counts.clamp_min(1).unsqueeze(-1), current)
    return current.to(centres.dtype)


@torch.no_grad()
def kmeans_assign(X: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Index [*B, N] of the nearest centre (first one on ties) for each point of ``X``."""
    # Exact differences (no |x|^2 - 2 x.c + |c|^2 expansion) so large offsets do not cancel.
    work_dtype = torch.promote_types(X.dtype, torch.float32)
    distances = torch.cdist(
        X.to(work_dtype), centres.to(work_dtype), compute_mode="donot_use_mm_for_euclid_dist"
    )
    return distances.argmin(dim=-1)


def _full_mask(X: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return torch.ones(X.shape[:-1], dtype=torch.bool, device=X.device)
    if mask.shape != X.shape[:-1]:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not match X {tuple(X.shape)}")
    return mask.to(device=X.device, dtype=torch.bool)
