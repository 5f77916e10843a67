"""Fit one sparse variational GP per partition of a data set and export them as modules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from inference.trainer import TrainConfig, TrainResult, train
from pyrogp_models.data import Standardisation, require_finite
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.local import LocalGPs
from pyrogp_models.module import Module
from pyrogp_models.partition import Partition


@dataclass
class LocalFitSpec:
    """What to fit in every partition (see :class:`pyrogp_models.local.LocalGPs`)."""

    num_inducing: int | Sequence[int] = 10
    likelihood: str = "gaussian"
    likelihood_options: dict = field(default_factory=dict)
    kernel: str = "rbf"
    ard: bool = False
    inducing_init: str = "kmeans"
    learn_inducing: bool = True
    collapsed: bool = False
    batch_size: int | None = None
    noise: float = 0.1
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"


@dataclass
class LocalFit:
    """The fitted modules (in partition order), the partition, the batched model and its
    training record."""

    modules: dict[str, Module]
    partition: Partition
    model: LocalGPs
    result: TrainResult
    standardisation: Standardisation


def fit_local(X, y, partition: Partition, spec: LocalFitSpec | None = None,
              config: TrainConfig | None = None, names: Sequence[str] | None = None
              ) -> LocalFit:
    """Fit all partitions as one batched model and export one module per partition.

    Inputs are standardised with one set of statistics shared by every partition (so modules
    from one fit live in the same space and can be recycled together); Gaussian-type targets are
    standardised too.
    """
    spec = spec or LocalFitSpec()
    config = config or TrainConfig()
    if spec.likelihood not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood '{spec.likelihood}'; "
                         f"choose from {sorted(LIKELIHOODS)}")
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    require_finite(X, "inputs")
    require_finite(y, "targets")
    standardise_y = LIKELIHOODS[spec.likelihood].standardise_targets
    standardisation = Standardisation.fit(X, y, standardise_y=standardise_y)
    as_tensor = lambda a: torch.as_tensor(a, dtype=spec.dtype, device=spec.device)  # noqa: E731
    X_model = as_tensor(standardisation.transform_x(X))
    y_model = as_tensor(standardisation.transform_y(y))
    generator = torch.Generator(device=spec.device)
    generator.manual_seed(0 if config.seed is None else config.seed)
    model = LocalGPs(X_model, y_model, partition, spec.num_inducing, spec.likelihood,
                     spec.likelihood_options, spec.kernel, spec.ard, spec.inducing_init,
                     spec.learn_inducing, spec.collapsed, noise=spec.noise, generator=generator)
    result = train(model, spec.batch_size, config=config)
    modules = model.to_modules(standardisation, names,
                               info={"partition_rule": partition.rule.get("kind")})
    return LocalFit(modules, partition, model, result, standardisation)
