"""pyrogp_models: Gaussian processes fitted in pieces and combined later, in Pyro.

Local sparse variational GPs are fitted per data partition (many at once, as one batched Pyro
model) and kept as *modules*: small, safe files with no data in them. Modules are combined later
without touching the data again — by products of experts or by recycling them into a meta-GP.
Every model is a ``PyroModule`` built from one sparse-GP layer (:class:`SparseGPLayer`), which a
user's own ``pyro.infer.SVI`` trains and ``pyro.infer.Predictive`` draws from; every predictor
(:class:`Predictor`) predicts in data units and turns into an ArviZ ``InferenceData``.

Layout: ``gaussian/`` (linear algebra, conditionals, KL, expectations) · ``kernels/`` ·
``likelihoods/`` · ``layers/`` · ``data/`` · ``modules/`` (the record, its files, stacks,
routing, the predictor base) · ``models/`` (``local/``, ``meta/``, ``experts/``,
``distributed_kernel/``, ``multitask/``). Training, fitting, evaluation and the command line
live in ``pyrogp_models.inference`` (kept in ``inference/`` at the top of the repository).
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
    MixedLikelihoodsError,
    ModuleFileError,
    PyrogpError,
    UnboundedBoundError,
)
from pyrogp_models.kernels import RBF, Matern12, Matern32, Matern52, Stationary
from pyrogp_models.layers import SparseGPLayer
from pyrogp_models.likelihoods import (
    Bernoulli,
    Categorical,
    Gaussian,
    HeteroscedasticGaussian,
    Likelihood,
    Poisson,
    make_likelihood,
)
from pyrogp_models.models.distributed_kernel import DistributedKernelGP
from pyrogp_models.models.experts import ExactExperts, ExpertCombination, ModuleExperts
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.models.local.svgp import BatchedSVGP
from pyrogp_models.models.meta.meta_gp import MetaGP
from pyrogp_models.models.meta.multioutput import MultiOutputMetaGP
from pyrogp_models.models.multitask import (
    CGP,
    CMDGP,
    IDGP,
    IGP,
    MMDGP,
    SMDGP,
    MultitaskGP,
    MultitaskOptions,
    MultitaskPredictor,
    TaskData,
)
from pyrogp_models.modules.files import load_module, load_modules, save_module, save_modules
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.routing import RoutedModules, load_predictor
from pyrogp_models.modules.stack import ModuleStack

__version__ = "0.1.0"

__all__ = [
    # models
    "BatchedSVGP", "DistributedKernelGP", "ExactExperts", "ExpertCombination", "LocalGPs",
    "MetaGP", "ModuleExperts", "MultiOutputMetaGP", "CGP", "CMDGP", "IDGP", "IGP", "MMDGP",
    "SMDGP", "MultitaskGP", "MultitaskOptions", "MultitaskPredictor", "TaskData",
    # the layer, kernels, likelihoods
    "SparseGPLayer", "RBF", "Matern12", "Matern32", "Matern52", "Stationary", "Bernoulli",
    "Categorical", "Gaussian", "HeteroscedasticGaussian", "Likelihood", "Poisson",
    "make_likelihood",
    # modules: the record, files, stacks, predictors
    "Module", "ModuleStack", "Predictor", "RoutedModules", "load_module", "load_modules",
    "load_predictor", "save_module", "save_modules",
    # data and partitioners
    "Partition", "Standardisation", "Table", "load_banana", "load_sunspots", "load_table",
    "partition_by_label", "partition_contiguous", "partition_kmeans", "partition_random",
    # errors
    "CholeskyError", "DataError", "IncompatibleModulesError", "MixedLikelihoodsError",
    "ModuleFileError", "PyrogpError", "UnboundedBoundError",
]
