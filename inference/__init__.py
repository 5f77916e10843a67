"""How models are trained and judged: the trainer, the fit functions, metrics and the CLI.

Every fit function takes data (or modules), a spec and a :class:`TrainConfig` and returns a
:class:`~inference.fit_result.Fit` (``.model``, ``.result``, ``.predictor``)::

    from inference import (fit_local, recycle, fit_exact_experts, fit_distributed_kernel,
                           fit_multitask_dgp)
"""

from inference.distributed_kernel_fit import (
    DistributedKernelFit,
    DistributedKernelSpec,
    fit_distributed_kernel,
)
from inference.experts_fit import ExactFit, ExpertsSpec, fit_exact_experts
from inference.fit_result import Fit
from inference.local_fit import LocalFit, LocalFitSpec, PartitionedData, fit_local
from inference.multitask_fit import MultitaskFit, MultitaskSpec, fit_multitask_dgp
from inference.recycling import RawData, Recycled, RecycleSpec, recycle, recycle_multioutput
from inference.trainer import TrainConfig, TrainResult, train

__all__ = [
    "DistributedKernelFit", "DistributedKernelSpec", "ExactFit", "ExpertsSpec", "Fit",
    "LocalFit", "LocalFitSpec", "MultitaskFit", "MultitaskSpec", "PartitionedData", "RawData",
    "RecycleSpec", "Recycled",
    "TrainConfig", "TrainResult", "fit_distributed_kernel", "fit_exact_experts", "fit_local",
    "fit_multitask_dgp", "recycle", "recycle_multioutput", "train",
]
