"""The sharded objective: Σ_j E_j over region shards equals the in-process ELBO and gradients,
evaluated in process and on a real Dask LocalCluster."""

import math

import pytest
import torch

from pyrogp_models.models.distributed_kernel.construct import build_distributed_kernel_gp
from pyrogp_models.models.distributed_kernel.regions import Regions
from pyrogp_models.models.distributed_kernel.shards import (
    DaskShardRunner,
    InProcessRunner,
    ghost_regions,
    make_shards,
    sharded_elbo,
)


def series_model(seed=0, n=500, num_regions=5):
    generator = torch.Generator().manual_seed(seed)
    X = (torch.rand(n, 1, generator=generator) * 40).sort(0).values
    y = torch.sin(X[:, 0]) + 0.1 * torch.randn(n, generator=generator)
    model = build_distributed_kernel_gp(X, num_regions, 6, lengthscale=0.8, learn_cuts=True)
    randomise(model, generator)
    return model, X, y


def tree_model(seed=1, n=400):
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=generator) * torch.tensor([12.0, 8.0])
    y = torch.sin(X[:, 0]) * torch.cos(0.5 * X[:, 1]) + 0.1 * torch.randn(n, generator=generator)
    inf = math.inf
    lower = torch.tensor([[-inf, -inf], [6.0, -inf], [6.0, 4.0]])
    upper = torch.tensor([[6.0, inf], [inf, 4.0], [inf, inf]])
    regions = Regions.from_boxes(lower, upper, learn_cuts=True)
    model = build_distributed_kernel_gp(X, 3, 9, lengthscale=torch.tensor([1.0, 1.5]), ard=True,
                                        regions=regions, inducing_method="kmeans")
    randomise(model, generator)
    return model, X, y


def randomise(model, generator):
    with torch.no_grad():
        mean = torch.randn(model.q_mean.shape, generator=generator)
        chol = 0.5 * torch.eye(model.num_inducing) + torch.tril(
            0.1 * torch.randn(model.q_sqrt.shape, generator=generator), -1)
        model.set_whitened_posterior(mean, chol)


def in_process_value_and_grads(model, X, y):
    model.zero_grad()
    value = model.elbo(X, y)
    value.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    return float(value.detach()), grads


def assert_sharded_matches(model, X, y, runner):
    value, grads = in_process_value_and_grads(model, X, y)
    sharded = sharded_elbo(model, runner)
    sharded.backward()
    assert abs(float(sharded) - value) <= 1e-10 * abs(value)
    for name, parameter in model.named_parameters():
        if parameter.numel() == 0:
            continue
        scale = max(float(grads[name].abs().max()), 1.0)
        assert float((parameter.grad - grads[name]).abs().max()) <= 1e-8 * scale, name
    model.zero_grad()


@pytest.mark.parametrize("build", [series_model, tree_model])
def test_sharded_objective_equals_in_process_objective(build):
    model, X, y = build()
    shards = make_shards(model, X, y)
    assert sum(len(s.y) for s in shards) == len(y)
    assert_sharded_matches(model, X, y, InProcessRunner(shards))


def test_workers_need_only_their_neighbours():
    model, X, y = series_model(n=2000, num_regions=10)
    for shard in make_shards(model, X, y):
        ghosts = ghost_regions(model, shard).tolist()
        assert shard.region in ghosts
        assert all(abs(g - shard.region) <= 1 for g in ghosts)


def test_sharded_objective_on_a_dask_local_cluster():
    distributed = pytest.importorskip("distributed")
    model, X, y = series_model(seed=2, n=600, num_regions=4)
    shards = make_shards(model, X, y)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  env={"OMP_NUM_THREADS": "1"},
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        runner = DaskShardRunner(client, shards)
        assert_sharded_matches(model, X, y, runner)
        # two optimiser steps driven by the cluster follow the in-process ones exactly
        twin, _, _ = series_model(seed=2, n=600, num_regions=4)
        optimisers = [torch.optim.Adam(m.parameters(), lr=0.01) for m in (model, twin)]
        for _ in range(2):
            for optimiser in optimisers:
                optimiser.zero_grad()
            (-sharded_elbo(model, runner)).backward()
            (-twin.elbo(X, y)).backward()
            for optimiser in optimisers:
                optimiser.step()
        for (name, a), (_, b) in zip(model.named_parameters(), twin.named_parameters(),
                                     strict=True):
            assert float((a - b).abs().max()) <= 1e-9, name
