"""Fit one sparse variational GP per partition of a data set and export them as modules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from inference.trainer import TrainConfig, TrainResult, train
from pyrogp_models.data import Standardisation, require_finite
from pyrogp_models.data.partitioners import Partition
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.modules.record import Module


@dataclass
class LocalFitSpec:
    """What to fit in every partition (see
    :class:`pyrogp_models.models.local.local_gps.LocalGPs`)."""

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
              config: TrainConfig | None = None, names: Sequence[str] | None = None,
              standardisation: Standardisation | None = None,
              inducing: Sequence[torch.Tensor] | None = None, info: dict | None = None
              ) -> LocalFit:
    """Fit all partitions as one batched model and export one module per partition.

    Inputs are standardised with one set of statistics shared by every partition (so modules
    from one fit live in the same space and can be recycled together); Gaussian-type targets are
    standardised too. A fit split over workers passes the ``standardisation`` and the initial
    ``inducing`` inputs (model units, one [M_k, D] per partition) computed from all the data.
    """
    spec = spec or LocalFitSpec()
    config = config or TrainConfig()
    X_model, y_model, standardisation = model_inputs(X, y, spec, standardisation)
    model = LocalGPs(X_model, y_model, partition, spec.num_inducing, spec.likelihood,
                     spec.likelihood_options, spec.kernel, spec.ard, spec.inducing_init,
                     spec.learn_inducing, spec.collapsed, noise=spec.noise,
                     generator=seeded_generator(config, spec), inducing=inducing)
    result = train(model, spec.batch_size, config=config)
    modules = model.to_modules(standardisation, names,
                               info={"partition_rule": partition.rule.get("kind"), **(info or {})})
    return LocalFit(modules, partition, model, result, standardisation)


def model_inputs(X, y, spec: LocalFitSpec, standardisation: Standardisation | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, Standardisation]:
    """Validated, standardised inputs and targets as tensors of the spec's dtype and device,
    and the standardisation (fitted on X, y unless given)."""
    if spec.likelihood not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood '{spec.likelihood}'; "
                         f"choose from {sorted(LIKELIHOODS)}")
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    require_finite(X, "inputs")
    require_finite(y, "targets")
    if standardisation is None:
        standardise_y = LIKELIHOODS[spec.likelihood].standardise_targets
        standardisation = Standardisation.fit(X, y, standardise_y=standardise_y)

    def as_tensor(values) -> torch.Tensor:
        return torch.as_tensor(values, dtype=spec.dtype, device=spec.device)

    return (as_tensor(standardisation.transform_x(X)), as_tensor(standardisation.transform_y(y)),
            standardisation)


def seeded_generator(config: TrainConfig, spec: LocalFitSpec) -> torch.Generator:
    """The random source of the inducing-input initialisation, seeded by the training seed."""
    generator = torch.Generator(device=spec.device)
    generator.manual_seed(0 if config.seed is None else config.seed)
    return generator
