"""Fit exact GP experts with shared hyperparameters and export them as modules.

The hyperparameters maximise Σ_j log N(y_j | 0, K_j + σ²I), eq. (2) of Cohen et al. (ICML 2020),
the objective of :class:`~pyrogp_models.models.experts.exact.ExactExperts`, with the library's
trainer. The result's predictor combines the experts by a product-of-experts rule (rBCM by
default; :class:`~pyrogp_models.models.experts.predictor.ExpertCombination`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pyrogp_models.inference.fit_result import Fit
from pyrogp_models.inference.local_fit import LocalFitSpec, PartitionedData, model_inputs
from pyrogp_models.inference.trainer import TrainConfig, TrainResult, parameter_scope, train

from pyrogp_models.data.identifiability import require_identifiable
from pyrogp_models.models.experts.exact import ExactExperts
from pyrogp_models.models.experts.predictor import ExpertCombination
from pyrogp_models.modules.record import Module

__all__ = ["DEFAULT_TRAIN_CONFIG", "ExactFit", "ExpertsSpec", "fit_exact_experts"]

#: L-BFGS on the summed log marginal likelihood (the batched L-BFGS with one member, which reads
#: nothing back to the host), at most 500 iterations (the authors' code runs SciPy L-BFGS-B for
#: 200); it stops when the loss changes by less than 1e-6 (relative) over 10 iterations and the
#: hyperparameters are then pinned at the optimum, as the local fits are.
DEFAULT_TRAIN_CONFIG = TrainConfig(optimizer="lbfgs", lr=1.0, steps=500, window=10, tol=1e-6)


@dataclass
class ExpertsSpec:
    """The shared kernel (family, ARD) and initial hyperparameters in standardised units, the
    rule and weighting of the result's predictor, and names/info of the exported modules."""

    kernel: str = "rbf"
    ard: bool = False
    lengthscale: float = 1.0
    variance: float = 1.0
    noise: float = 0.1
    rule: str = "rbcm"
    weights: str | None = None
    temperature: float | None = None
    names: Sequence[str] | None = None
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
    require_identifiable(X, y)  # the experts share their hyperparameters: all rows identify them
    config = config or DEFAULT_TRAIN_CONFIG
    with parameter_scope(config):  # nothing is left in Pyro's global parameter store
        model = ExactExperts(X_model, y_model, partition, spec.kernel, spec.ard,
                             spec.lengthscale, spec.variance, spec.noise)
        result = (train(model, config=config) if config.steps > 0
                  else TrainResult(converged=True))
        modules = model.to_modules(standardisation, spec.names,
                                   info={"partition_rule": partition.rule.get("kind"),
                                         **(spec.info or {})})
    predictor = ExpertCombination(modules, spec.rule, spec.weights, spec.temperature)
    return ExactFit(model, result, predictor, standardisation, modules)
