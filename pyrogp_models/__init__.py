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

from __future__ import annotations

from pyrogp_models.lazy_exports import lazy_exports

__version__ = "0.1.0"

#: Where each public name is defined: ``from pyrogp_models import X`` imports that module on
#: first use, so importing the package (as the command line does) loads neither torch nor Pyro.
_EXPORTS = {
    # models
    "BatchedSVGP": "pyrogp_models.models.local.svgp",
    "DistributedKernelGP": "pyrogp_models.models.distributed_kernel",
    "ExactExperts": "pyrogp_models.models.experts",
    "ExpertCombination": "pyrogp_models.models.experts",
    "LocalGPs": "pyrogp_models.models.local.local_gps",
    "MetaGP": "pyrogp_models.models.meta.meta_gp",
    "ModuleExperts": "pyrogp_models.models.experts",
    "MultiOutputMetaGP": "pyrogp_models.models.meta.multioutput",
    **dict.fromkeys(["CGP", "CMDGP", "IDGP", "IGP", "MMDGP", "SMDGP", "MultitaskGP",
                     "MultitaskOptions", "MultitaskPredictor", "TaskData"],
                    "pyrogp_models.models.multitask"),
    # the layer, kernels, likelihoods
    "SparseGPLayer": "pyrogp_models.layers",
    **dict.fromkeys(["RBF", "Matern12", "Matern32", "Matern52", "Stationary"],
                    "pyrogp_models.kernels"),
    **dict.fromkeys(["Bernoulli", "Categorical", "Gaussian", "HeteroscedasticGaussian",
                     "Likelihood", "Poisson", "make_likelihood"], "pyrogp_models.likelihoods"),
    # modules: the record, files, stacks, predictors
    "Module": "pyrogp_models.modules.record",
    "ModuleStack": "pyrogp_models.modules.stack",
    "Predictor": "pyrogp_models.modules.predictor",
    "RoutedModules": "pyrogp_models.modules.routing",
    **dict.fromkeys(["load_module", "load_modules", "save_module", "save_modules"],
                    "pyrogp_models.modules.files"),
    **dict.fromkeys(["load_predictor", "describe"], "pyrogp_models.io"),
    # data and partitioners
    **dict.fromkeys(["Standardisation", "Table", "load_banana", "load_sunspots", "load_table"],
                    "pyrogp_models.data"),
    "Columns": "pyrogp_models.data.columns",
    **dict.fromkeys(["Partition", "partition_by_label", "partition_contiguous",
                     "partition_kmeans", "partition_random"], "pyrogp_models.data.partitioners"),
    # errors
    **dict.fromkeys(["CholeskyError", "DataError", "IncompatibleModulesError",
                     "MixedLikelihoodsError", "ModuleFileError", "PyrogpError",
                     "UnboundedBoundError"], "pyrogp_models.errors"),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
