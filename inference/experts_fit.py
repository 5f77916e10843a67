"""Fit exact GP experts with shared hyperparameters and export them as modules.

The hyperparameters maximise Σ_j log N(y_j | 0, K_j + σ²I), eq. (2) of Cohen et al. (ICML 2020),
the objective of :class:`~pyrogp_models.models.experts.exact.ExactExperts`, with the library's
trainer. The result's predictor combines the experts by a product-of-experts rule (rBCM by
default; :class:`~pyrogp_models.models.experts.predictor.ExpertCombination`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from pyrogp_models.inference.fit_result import Fit
from pyrogp_models.inference.local_fit import (
    LocalFitSpec,
    PartitionedData,
    model_inputs,
)
from pyrogp_models.inference.restarts import (
    best_start,
    exact_restart_scales,
    number_of_starts,
)
from pyrogp_models.inference.train_config import DEFAULT_RESTARTS, EXPERTS_CONFIG, TrainConfig
from pyrogp_models.inference.trainer import TrainResult, parameter_scope, train

from pyrogp_models.data.columns import Columns
from pyrogp_models.data.identifiability import require_identifiable
from pyrogp_models.errors import NotConvergedWarning
from pyrogp_models.kernels import resolve_kernel
from pyrogp_models.models.experts.exact import ExactExperts
from pyrogp_models.models.experts.predictor import ExpertCombination
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.units import kernel_in_model_units

__all__ = ["DEFAULT_TRAIN_CONFIG", "ExactFit", "ExpertsSpec", "fit_exact_experts"]

#: The default training (:data:`~pyrogp_models.inference.train_config.EXPERTS_CONFIG`).
DEFAULT_TRAIN_CONFIG = EXPERTS_CONFIG


@dataclass
class ExpertsSpec:
    """The shared kernel (a name or expression, or a kernel whose given values are in data
    units; ARD for a name), initial lengthscales, variances and noise in standardised units for
    what the kernel does not give, the starts to fit from (default
    :data:`~pyrogp_models.inference.train_config.DEFAULT_RESTARTS`; the best log marginal
    likelihood is kept; :func:`~pyrogp_models.inference.restarts.exact_restart_scales`), the
    rule and weighting of the result's predictor, and the data columns (feature and target
    names, units), names and info of the exported modules."""

    kernel: str | torch.nn.Module = "rbf"
    ard: bool = False
    restarts: int | None = None
    lengthscale: float = 1.0
    variance: float = 1.0
    noise: float = 0.1
    rule: str = "rbcm"
    weights: str | None = None
    temperature: float | None = None
    names: Sequence[str] | None = None
    columns: Columns = field(default_factory=Columns)
    info: dict | None = None
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"


@dataclass
class ExactFit(Fit):
    """The trained :class:`ExactExperts` (``model``), its record, the expert combination
    (``predictor``) and the experts as modules, in partition order."""

    modules: dict[str, Module]


def fit_exact_experts(data: PartitionedData | tuple, spec: ExpertsSpec | None = None,
                      config: TrainConfig | None = None) -> ExactFit:
    """Standardise (X, y), fit shared hyperparameters by eq. (2) and export one module per
    expert. ``config`` defaults to :data:`DEFAULT_TRAIN_CONFIG`; ``TrainConfig(steps=0)`` keeps
    the initial values."""
    X, y, partition = data
    spec = spec or ExpertsSpec()
    # Validated and standardised as for local Gaussian fits (targets standardised too).
    X_model, y_model, standardisation = model_inputs(
        X, y, LocalFitSpec(dtype=spec.dtype, device=spec.device))
    kernel = kernel_in_model_units(resolve_kernel(spec.kernel, X_model.shape[-1], spec.ard),
                                   standardisation)
    require_identifiable(X, y)  # the experts share their hyperparameters: all rows identify them
    config = config or DEFAULT_TRAIN_CONFIG
    with parameter_scope(config):  # nothing is left in Pyro's global parameter store
        runs = []
        starts = number_of_starts(spec.restarts, DEFAULT_RESTARTS)
        scales = exact_restart_scales(starts if config.steps > 0 else 1, X_model, spec.lengthscale)
        for lengthscale, noise in scales.tolist():
            model = ExactExperts(X_model, y_model, partition, kernel, spec.ard,
                                 spec.lengthscale * lengthscale, spec.variance,
                                 spec.noise * noise)
            with warnings.catch_warnings(record=True) as caught:  # the kept start's are reissued
                warnings.simplefilter("always", NotConvergedWarning)
                result = (train(model, config=config) if config.steps > 0
                          else TrainResult(converged=True))
            runs.append((model.log_marginal().sum().detach(), model, result, caught))
        _, model, result, caught = runs[int(best_start(torch.stack([run[0] for run in runs])))]
        for warning in caught:
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
        modules = model.to_modules(standardisation, spec.names,
                                   info={"partition_rule": partition.rule.get("kind"),
                                         **(spec.info or {})})
    modules = {name: replace(module, columns=spec.columns) for name, module in modules.items()}
    predictor = ExpertCombination(modules, spec.rule, spec.weights, spec.temperature)
    return ExactFit(model, result, predictor, standardisation, modules)
