"""pyrogp_models: Gaussian processes fitted in pieces and combined later, in Pyro.

Local sparse variational GPs are fitted per data partition (many at once, as one batched Pyro
model) and kept as *modules*: small, safe files with no data in them. Modules are combined later
without touching the data again — by products of experts or by recycling them into a meta-GP.
"""

from pyrogp_models.data import Standardisation, Table, load_banana, load_sunspots, load_table
from pyrogp_models.data.partitioners import (
    Partition,
    partition_by_label,
    partition_contiguous,
    partition_kmeans,
    partition_random,
)
from pyrogp_models.errors import (
    CholeskyError,
    DataError,
    IncompatibleModulesError,
    ModuleFileError,
    PyrogpError,
)
from pyrogp_models.kernels import RBF, Matern12, Matern32, Matern52, Stationary
from pyrogp_models.likelihoods import (
    Bernoulli,
    Categorical,
    Gaussian,
    HeteroscedasticGaussian,
    Poisson,
    make_likelihood,
)
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.models.local.svgp import BatchedSVGP
from pyrogp_models.modules.files import load_module, load_modules, save_module, save_modules
from pyrogp_models.modules.record import Module

__version__ = "0.1.0"

__all__ = [
    "RBF", "BatchedSVGP", "Bernoulli", "Categorical", "CholeskyError", "DataError", "Gaussian",
    "HeteroscedasticGaussian", "IncompatibleModulesError", "LocalGPs", "Matern12", "Matern32",
    "Matern52", "Module", "ModuleFileError", "Partition", "Poisson", "PyrogpError",
    "Standardisation", "Stationary", "Table", "load_banana", "load_module", "load_modules",
    "load_sunspots", "load_table", "make_likelihood", "partition_by_label",
    "partition_contiguous", "partition_kmeans", "partition_random", "save_module",
    "save_modules",
]
