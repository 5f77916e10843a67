"""Greedy tree partitions: admissible splits, a true partition, and the split that pays most."""

import torch

from pyrogp_models.models.distributed_kernel import collapsed
from pyrogp_models.models.distributed_kernel.construct import build_distributed_kernel_gp
from pyrogp_models.models.distributed_kernel.tree import greedy_tree
from pyrogp_models.models.distributed_kernel.windows import window


def data(n=500, seed=0):
    """A function that wiggles along x1 only; both inputs span 12 lengthscales."""
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=generator) * 12
    y = torch.sin(2.0 * X[:, 1]) + 0.05 * torch.randn(n, generator=generator)
    return X, y


def test_first_split_follows_the_detail_and_bounds_are_reported_faithfully():
    X, y = data()
    ell = torch.tensor([1.0, 1.0])
    result = greedy_tree(X, y, 4, 8, ell, 1.0, 0.01)
    assert result.steps[0].dim == 1
    assert result.steps[0].bound > result.initial_bound
    regions = result.regions
    assert regions.num_regions == len(result.steps) + 1 <= 4
    # the last reported bound is the mean-field collapsed bound of the final partition
    final = build_distributed_kernel_gp(X, regions.num_regions, 8, lengthscale=ell, ard=True,
                                        regions=regions, noise=0.01)
    bound = float(collapsed.meanfield_collapsed_bound(final, X, y))
    assert abs(bound - result.steps[-1].bound) <= 1e-8 * abs(bound)


def test_tree_leaves_partition_space_and_respect_the_minimum_width():
    X, y = data(seed=1)
    ell = torch.tensor([0.8, 1.2])
    result = greedy_tree(X, y, 5, 6, ell, 1.0, 0.05, min_width=2.0, bound="joint")
    assert len(result.steps) >= 2
    lower, upper = result.regions.full_bounds()
    points = torch.randn(300, 2) * 20
    assert (window(points, lower, upper, ell).sum(-1) - 1).abs().max() <= 1e-13
    owner = result.regions.owner(X)
    for j in range(result.regions.num_regions):
        mine = X[owner == j]
        assert len(mine) >= 6
        for d in range(2):
            for face in (float(lower[j, d]), float(upper[j, d])):
                if abs(face) != float("inf"):
                    reach = float((mine[:, d] - face).abs().max())
                    assert reach >= 2.0 * float(ell[d]) - 1e-12
