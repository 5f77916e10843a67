"""Building a distributed-kernel GP for a data set: default regions and per-region Z.

- Regions: a 1-D split of one dimension (by default the one with the largest range/ℓ) at data
  quantiles, every region at least ``min_width``·ℓ wide
  (:func:`~pyrogp_models.models.distributed_kernel.regions.default_regions`),
  or any :class:`Regions` (e.g. from the greedy tree of
  :mod:`~pyrogp_models.models.distributed_kernel.tree`).
- Z_j: a regular grid over the bounding box of the points that region j owns (1-D: m evenly spaced
  points, so the unbounded end regions keep their Z within the data range), or
  k-means centres of those points.
"""

from __future__ import annotations

import torch

from pyrogp_models.data.inducing import init_inducing
from pyrogp_models.errors import DataError
from pyrogp_models.gaussian.linalg import DEFAULT_JITTER
from pyrogp_models.likelihoods import make_likelihood
from pyrogp_models.models.distributed_kernel.halo import DEFAULT_EPS
from pyrogp_models.models.distributed_kernel.local_kernels import shared_se_kernel
from pyrogp_models.models.distributed_kernel.model import DistributedKernelGP
from pyrogp_models.models.distributed_kernel.regions import Regions, default_regions


def owned_points(X: torch.Tensor, regions: Regions) -> tuple[torch.Tensor, torch.Tensor]:
    """Each region's own points, padded: [J, N_max, D] and the mask [J, N_max]."""
    owner = regions.owner(X)
    counts = torch.bincount(owner, minlength=regions.num_regions)
    if bool((counts == 0).any()):
        empty = torch.nonzero(counts == 0).flatten().tolist()
        raise DataError(f"regions {empty} contain no data point; use fewer regions")
    order = torch.argsort(owner, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(X.shape[0], device=X.device) - starts[owner[order]]
    width = int(counts.max())
    padded = X.new_zeros(regions.num_regions, width, X.shape[1])
    mask = torch.zeros(regions.num_regions, width, dtype=torch.bool, device=X.device)
    padded[owner[order], slot] = X[order]
    mask[owner[order], slot] = True
    return padded, mask


@torch.no_grad()
def init_region_inducing(X: torch.Tensor, regions: Regions, num_inducing: int,
                         method: str = "grid", generator: torch.Generator | None = None
                         ) -> torch.Tensor:
    """Z [J, m, D]: a grid over (or k-means of) the points each region owns."""
    padded, mask = owned_points(X, regions)
    return init_inducing(padded, num_inducing, mask, method=method, generator=generator)


def build_distributed_kernel_gp(
    X: torch.Tensor,
    num_regions: int,
    num_inducing: int,
    y: torch.Tensor | None = None,
    lengthscale: float | torch.Tensor = 1.0,
    variance: float = 1.0,
    likelihood: str = "gaussian",
    noise: float | None = None,
    variational: str = "meanfield",
    ard: bool = False,
    regions: Regions | None = None,
    dim: int | None = None,
    learn_cuts: bool = False,
    learn_inducing: bool = True,
    min_width: float = 2.0,
    inducing_method: str = "grid",
    jitter: float = DEFAULT_JITTER,
    halo_eps: float = DEFAULT_EPS,
    batch_size: int | None = None,
    name: str | None = None,
    likelihood_options: dict | None = None,
) -> DistributedKernelGP:
    """A :class:`DistributedKernelGP` with default regions (cut along ``dim``, by default the
    dimension with the largest range/ℓ) and Z for the inputs X [N, D], with (X, y) bound as its
    training data when the targets y [N] are given.

    ``likelihood_options`` are the likelihood's options and initial parameter values; ``noise``
    is short for the Gaussian likelihood's variance."""
    if X.dim() != 2:
        raise DataError(f"inputs must be a matrix [N, D], got shape {tuple(X.shape)}")
    input_dim = X.shape[1]
    kernel = shared_se_kernel(input_dim, ard, lengthscale, variance, dtype=X.dtype,
                              device=X.device)
    if regions is None:
        regions = default_regions(X, num_regions, kernel.lengthscale.detach(), min_width,
                                  learn_cuts, dim)
    Z = init_region_inducing(X, regions, num_inducing, inducing_method)
    options = dict(likelihood_options or {})
    if noise is not None:
        options["variance"] = noise
    lik = make_likelihood(likelihood, (), X.dtype, X.device, **options)
    return DistributedKernelGP(regions, Z, kernel, lik, None if y is None else X, y,
                               variational=variational, learn_inducing=learn_inducing,
                               jitter=jitter, halo_eps=halo_eps, batch_size=batch_size,
                               name=name)
