"""Distributed-kernel sparse GP: the SE kernel as a sum of local kernels k_j = k·w_j, each with
its own inducing variables (M. K. Titsias, "Distributed kernel representations for variational
sparse Gaussian processes", talk slides; "the slides" below). The slides give the split of the SE
kernel, one inducing set per region and the mean-field bound; the collapsed bounds, the stable
windows, the halo and the sharded evaluation are derived here.

- :mod:`.windows` — window functions w_j (stable normal-CDF differences, analytic gradient)
- :mod:`.regions` — 1-D cuts and axis-aligned box/tree partitions with ordered learnable cuts
- :mod:`.local_kernels` — k_j(x, x') = k(x, x') w_j((x + x')/2), and the one shared SE kernel
- :mod:`.halo` — which (point, region) pairs matter: O(n m²) instead of O(n J m²); planned widths
  for training without host reads
- :mod:`.projections` — pair projections A_ij and the moments of q(f)
- :mod:`.model` — the Pyro model/guide (mean-field and joint q, or the collapsed bound), ELBO,
  predictions
- :mod:`.collapsed` — joint and mean-field collapsed bounds and optimal q (dense references)
- :mod:`.backfitting` — mean-field optimum by backfitting (coordinate ascent) or block-CG
- :mod:`.shards` — the ELBO as a sum over region shards, run by workers (in process or Dask)
- :mod:`.tree` — greedy tree partition by bound gain
- :mod:`.construct` — default regions and inducing inputs for a data set
"""

from pyrogp_models.models.distributed_kernel.backfitting import backfit, solve_meanfield
from pyrogp_models.models.distributed_kernel.collapsed import (
    joint_collapsed_bound,
    meanfield_collapsed_bound,
    meanfield_gap,
    optimal_joint_posterior,
    optimal_meanfield_posterior,
)
from pyrogp_models.models.distributed_kernel.construct import (
    build_distributed_kernel_gp,
    init_region_inducing,
)
from pyrogp_models.models.distributed_kernel.halo import Halo, build_halo, full_halo
from pyrogp_models.models.distributed_kernel.local_kernels import LocalKernels
from pyrogp_models.models.distributed_kernel.model import DistributedKernelGP
from pyrogp_models.models.distributed_kernel.regions import Regions, default_regions, quantile_cuts
from pyrogp_models.models.distributed_kernel.shards import (
    DaskShardRunner,
    InProcessRunner,
    make_shards,
    sharded_elbo,
)
from pyrogp_models.models.distributed_kernel.tree import greedy_tree

__all__ = [
    "DaskShardRunner", "DistributedKernelGP", "Halo", "InProcessRunner", "LocalKernels",
    "Regions", "backfit", "build_distributed_kernel_gp", "build_halo", "default_regions",
    "full_halo", "greedy_tree", "init_region_inducing", "joint_collapsed_bound", "make_shards",
    "meanfield_collapsed_bound", "meanfield_gap", "optimal_joint_posterior",
    "optimal_meanfield_posterior", "quantile_cuts", "sharded_elbo", "solve_meanfield",
]
