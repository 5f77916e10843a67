"""The local GPs as one term of a hierarchical model of your own, trained by plain Pyro SVI."""

import numpy as np
import pyro
import pyro.distributions as dist
import torch

from pyrogp_models import partition_contiguous
from pyrogp_models.data import Standardisation
from pyrogp_models.models.local.local_gps import LocalGPs

rng = np.random.default_rng(0)
X = np.sort(rng.uniform(0, 10, (600, 1)), axis=0)
y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(600)
partition = partition_contiguous(X, 6)

s = Standardisation.fit(X, y)  # model units: standardised inputs and targets
gps = LocalGPs(torch.as_tensor(s.transform_x(X)), torch.as_tensor(s.transform_y(y)),
               partition, 8, learn_inducing=False, standardisation=s, name="gps")
K = partition.num_partitions
block = torch.as_tensor(partition.assignments)  # each point's block, data order


def model():
    with pyro.plate("blocks", K):  # a level per block
        alpha = pyro.sample("alpha", dist.Normal(torch.zeros(K, dtype=torch.float64), 1.0))
    gps.model(offset=alpha[block])  # the local GPs: the residual around it


def guide():
    # initial values made afresh: a tensor given to pyro.param is the parameter itself, which
    # the optimiser updates in place
    loc = pyro.param("alpha_loc", lambda: torch.zeros(K, dtype=torch.float64))
    scale = pyro.param("alpha_scale", lambda: torch.full((K,), 0.1, dtype=torch.float64),
                       constraint=dist.constraints.positive)
    with pyro.plate("blocks", K):
        pyro.sample("alpha", dist.Normal(loc, scale))
    gps.guide()  # q(u) of every block's GP


svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.01}),
                     pyro.infer.TraceMeanField_ELBO())
losses = [svi.step() for _ in range(200)]
draws = pyro.infer.Predictive(gps.predictive_model, guide=gps.predictive_guide,
                              num_samples=50)()  # sites gps.groups.0.u, gps.f, gps.y
X_new = torch.as_tensor(s.transform_x(np.linspace(0, 10, 7)[:, None]))
at_new = pyro.infer.Predictive(gps.predictive_model, guide=gps.predictive_guide,
                               num_samples=50)(X_new)  # each new point in its block
print(f"−ELBO {losses[0]:.0f} → {losses[-1]:.0f}; f {tuple(draws['gps.f'].shape)}, "
      f"at new inputs {tuple(at_new['gps.f'].shape)}")
