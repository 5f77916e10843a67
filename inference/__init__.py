"""How models are trained and judged: the trainer, the fit functions, metrics and the CLI.

Every fit function takes data (or modules), a spec and a :class:`TrainConfig` and returns a
:class:`~pyrogp_models.inference.fit_result.Fit` (``.model``, ``.result``, ``.predictor``)::

    from pyrogp_models.inference import (fit_local, recycle, fit_exact_experts,
                                         fit_distributed_kernel, fit_multitask_dgp)
"""

from pyrogp_models.inference.distributed_kernel_fit import (
    DistributedKernelFit,
    DistributedKernelSpec,
    fit_distributed_kernel,
)
from pyrogp_models.inference.experts_fit import ExactFit, ExpertsSpec, fit_exact_experts
from pyrogp_models.inference.fit_result import Fit
from pyrogp_models.inference.local_fit import LocalFit, LocalFitSpec, PartitionedData, fit_local
from pyrogp_models.inference.multitask_fit import MultitaskFit, MultitaskSpec, fit_multitask_dgp
from pyrogp_models.inference.recycling import (
    RawData,
    Recycled,
    RecycleSpec,
    recycle,
    recycle_multioutput,
)
from pyrogp_models.inference.trainer import TrainConfig, TrainResult, train

__all__ = [
    "DistributedKernelFit", "DistributedKernelSpec", "ExactFit", "ExpertsSpec", "Fit",
    "LocalFit", "LocalFitSpec", "MultitaskFit", "MultitaskSpec", "PartitionedData", "RawData",
    "RecycleSpec", "Recycled",
    "TrainConfig", "TrainResult", "fit_distributed_kernel", "fit_exact_experts", "fit_local",
    "fit_multitask_dgp", "recycle", "recycle_multioutput", "train",
]
