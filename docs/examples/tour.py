"""A ten-line tour: local fits → module files → a meta-GP and a product of experts."""

import tempfile

import numpy as np
from pyrogp_models.inference import LocalFitSpec, RecycleSpec, fit_local, recycle

from pyrogp_models import ExpertCombination, load_modules, save_modules
from pyrogp_models.data.partitioners import partition_contiguous

rng = np.random.default_rng(0)
x = np.sort(rng.uniform(0, 10, (5000, 1)), axis=0)
y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(5000)

# One sparse GP per partition, all fitted as ONE batched Pyro model.
partition = partition_contiguous(x, 10)
fit = fit_local((x, y, partition), LocalFitSpec(num_inducing=12))
folder = save_modules(fit.modules, f"{tempfile.mkdtemp()}/modules", partition)

modules = load_modules(folder)                  # validated; never unpickles
meta = recycle(modules, RecycleSpec(num_inducing=60)).module  # a module again
mean, var = meta.predict_y(np.linspace(0, 10, 200)[:, None])  # data units

gpoe = ExpertCombination(modules, rule="gpoe", weights="softmax-var",
                         temperature=10.0)
log_density = gpoe.log_predictive(x[:100], y[:100])  # per point, [100]
print(f"meta-GP M={meta.num_inducing}; gPoE NLPD {-log_density.mean().item():.3f}")
