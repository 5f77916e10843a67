"""How models are trained and judged: the trainer, the fit functions, metrics and the CLI.

Every fit function takes data (or modules), a spec and a :class:`TrainConfig` and returns a
:class:`~pyrogp_models.inference.fit_result.Fit` (``.model``, ``.result``, ``.predictor``)::

    from pyrogp_models.inference import (fit_local, recycle, fit_exact_experts,
                                         fit_distributed_kernel, fit_multitask_dgp)

Each name is imported from its module when first used, so the command line (a submodule) starts
without importing torch.
"""

from __future__ import annotations

from pyrogp_models.lazy_exports import lazy_exports

#: Where each public name is defined.
_EXPORTS = {
    **dict.fromkeys(["DistributedKernelFit", "DistributedKernelSpec", "fit_distributed_kernel"],
                    "pyrogp_models.inference.distributed_kernel_fit"),
    **dict.fromkeys(["ExactFit", "ExpertsSpec", "fit_exact_experts"],
                    "pyrogp_models.inference.experts_fit"),
    "Fit": "pyrogp_models.inference.fit_result",
    **dict.fromkeys(["LocalFit", "LocalFitSpec", "PartitionedData", "fit_local"],
                    "pyrogp_models.inference.local_fit"),
    **dict.fromkeys(["MultitaskFit", "MultitaskSpec", "fit_multitask_dgp"],
                    "pyrogp_models.inference.multitask_fit"),
    **dict.fromkeys(["RawData", "Recycled", "RecycleSpec", "recycle", "recycle_multioutput"],
                    "pyrogp_models.inference.recycling"),
    "TrainConfig": "pyrogp_models.inference.train_config",
    **dict.fromkeys(["TrainResult", "train"], "pyrogp_models.inference.trainer"),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
