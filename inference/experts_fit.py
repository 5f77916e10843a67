"""Fit exact GP experts with shared hyperparameters and export them as modules.

The hyperparameters maximise Σ_j log N(y_j | 0, K_j + σ²I), eq. (2) of Cohen et al. (ICML 2020),
the objective of :class:`~pyrogp_models.models.experts.exact.ExactExperts`, with the library's
trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference.local_fit import LocalFitSpec, model_inputs
from inference.trainer import TrainConfig, TrainResult, train
from pyrogp_models.data import Standardisation
from pyrogp_models.data.partitioners import Partition
from pyrogp_models.models.experts.exact import ExactExperts
from pyrogp_models.modules.record import Module

__all__ = ["DEFAULT_TRAIN_CONFIG", "ExactFit", "fit_exact_experts"]

#: L-BFGS on the summed log marginal likelihood, at most 10 × 20 iterations (the authors' code
#: runs SciPy L-BFGS-B for 200 iterations); stops when a step no longer changes the loss.
DEFAULT_TRAIN_CONFIG = TrainConfig(optimizer="lbfgs", lr=1.0, steps=10, window=1, tol=1e-9)


@dataclass
class ExactFit:
    """Fitted exact experts: the modules (in partition order), the batched model, its training
    record and the standardisation shared by every expert."""

    modules: dict[str, Module]
    model: ExactExperts
    result: TrainResult
    standardisation: Standardisation


def fit_exact_experts(X, y, partition: Partition, *, kernel: str = "rbf", ard: bool = False,
                      lengthscale: float = 1.0, variance: float = 1.0, noise: float = 0.1,
                      config: TrainConfig | None = None, names: Sequence[str] | None = None,
                      info: dict | None = None, dtype: torch.dtype = torch.float64,
                      device: str | torch.device = "cpu") -> ExactFit:
    """Standardise (X, y), fit shared hyperparameters by eq. (2) and export one module per expert.

    Initial hyperparameters are in standardised units. ``config`` defaults to
    :data:`DEFAULT_TRAIN_CONFIG`; ``TrainConfig(steps=0)`` keeps the initial values.
    """
    # Validated and standardised as for local Gaussian fits (targets standardised too).
    X_model, y_model, standardisation = model_inputs(X, y, LocalFitSpec(dtype=dtype,
                                                                        device=device))
    model = ExactExperts(X_model, y_model, partition, kernel, ard, lengthscale, variance, noise)
    config = config or DEFAULT_TRAIN_CONFIG
    result = train(model, config=config) if config.steps > 0 else TrainResult(converged=True)
    modules = model.to_modules(standardisation, names,
                               info={"partition_rule": partition.rule.get("kind"),
                                     **(info or {})})
    return ExactFit(modules, model, result, standardisation)
