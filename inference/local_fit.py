"""Fit one sparse variational GP per partition of a data set and export them as modules.

``fit_local((X, y, partition), spec, config)`` standardises the data, builds every partition's
SVGP as one batched :class:`~pyrogp_models.models.local.local_gps.LocalGPs`, trains it with the
library's trainer and exports one module per partition. The result's ``predictor`` routes new
points to the module of their partition (:class:`~pyrogp_models.modules.routing.RoutedModules`);
modules of a random partition, which have no region, are combined by rBCM instead
(:class:`~pyrogp_models.models.experts.predictor.ExpertCombination`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import torch
from pyrogp_models.inference.fit_result import Fit
from pyrogp_models.inference.trainer import TrainConfig, TrainResult, parameter_scope, train

from pyrogp_models.data import Standardisation, require_finite
from pyrogp_models.data.identifiability import require_identifiable
from pyrogp_models.data.partitioners import Partition
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.models.experts.predictor import ExpertCombination
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.routing import as_predictor

#: The product-of-experts rule that combines modules of a random partition.
RANDOM_PARTITION_RULE = "rbcm"
#: Gaussian likelihoods: the collapsed bound, fitted by L-BFGS with one memory and one step
#: length per partition (:mod:`pyrogp_models.inference.batched_lbfgs`); it stops when every
#: partition's bound changes by less than 1e-6 (relative) over 10 iterations.
COLLAPSED_CONFIG = TrainConfig(optimizer="lbfgs", lr=1.0, steps=500, window=10, tol=1e-6)
#: Other likelihoods (and the uncollapsed bound): a safeguarded unit natural-gradient step on
#: every q(u) before each Adam step on the other parameters.
UNCOLLAPSED_CONFIG = TrainConfig(optimizer="adam", lr=0.05, steps=1000, window=50, tol=1e-6,
                                 natural_gradient_lr=1.0)
#: The natural-gradient step size with minibatches (a unit step would follow one batch's noise).
MINIBATCH_NATURAL_GRADIENT = 0.2


class PartitionedData(NamedTuple):
    """Inputs X [N, D] and targets y [N] in data units, and which partition each point is in."""

    X: np.ndarray | torch.Tensor
    y: np.ndarray | torch.Tensor
    partition: Partition


@dataclass
class LocalFitSpec:
    """What to fit in every partition (see :class:`~pyrogp_models.models.local.local_gps.
    LocalGPs`); ``names`` and ``info`` label the exported modules. A fit split over workers
    passes the ``standardisation`` and the initial ``inducing`` inputs (model units, one
    [M_k, D] per partition) computed from all the data.

    ``collapsed=None`` (the default) is the collapsed bound for a Gaussian likelihood without
    minibatches and the uncollapsed ELBO otherwise; ``noise=None`` initialises every
    partition's Gaussian noise from its own data (:class:`LocalGPs`)."""

    num_inducing: int | Sequence[int] = 10
    likelihood: str = "gaussian"
    likelihood_options: dict = field(default_factory=dict)
    kernel: str = "rbf"
    ard: bool = False
    inducing_init: str = "kmeans"
    learn_inducing: bool = True
    collapsed: bool | None = None
    batch_size: int | None = None
    noise: float | None = None
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"
    names: Sequence[str] | None = None
    info: dict | None = None
    standardisation: Standardisation | None = None
    inducing: Sequence[torch.Tensor] | None = None


@dataclass
class LocalFit(Fit):
    """The fitted modules (in partition order) and the partition, besides :class:`Fit`'s
    trained :class:`LocalGPs` (``model``), training record and predictor."""

    modules: dict[str, Module]
    partition: Partition


def fit_local(data: PartitionedData | tuple, spec: LocalFitSpec | None = None,
              config: TrainConfig | None = None) -> LocalFit:
    """Fit all partitions as one batched model and export one module per partition.

    ``data`` is (X [N, D], y [N], partition) in data units. Each partition maximises its SVGP
    ELBO (Hensman et al. 2015, eq. 4) or, by default for Gaussian data, Titsias' collapsed bound
    (2009, eq. 9).

    Inputs are standardised with one set of statistics shared by every partition (so modules
    from one fit live in the same space and can be recycled together); Gaussian-type targets are
    standardised too. A partition from which its GP cannot identify its hyperparameters (fewer
    than three distinct inputs; constant Gaussian targets) is refused with a
    :class:`~pyrogp_models.errors.DataError`
    (:func:`~pyrogp_models.data.identifiability.require_identifiable`).
    """
    model, result, modules, standardisation = train_local(data, spec, config)
    partition = data[2]
    return LocalFit(model, result, local_predictor(modules, partition), standardisation,
                    modules, partition)


def train_local(data: PartitionedData | tuple, spec: LocalFitSpec | None = None,
                config: TrainConfig | None = None
                ) -> tuple[LocalGPs, TrainResult, dict[str, Module], Standardisation]:
    """:func:`fit_local` without the predictor: the trained model, its record, the modules and
    the standardisation."""
    X, y, partition = data
    spec = spec or LocalFitSpec()
    config = config or default_config(spec)
    X_model, y_model, standardisation = model_inputs(X, y, spec, spec.standardisation)
    require_identifiable(X, y, partition,
                         constant_targets=LIKELIHOODS[spec.likelihood].standardise_targets)
    with parameter_scope(config):  # nothing is left in Pyro's global parameter store
        model = LocalGPs(X_model, y_model, partition, spec.num_inducing, spec.likelihood,
                         spec.likelihood_options, spec.kernel, spec.ard, spec.inducing_init,
                         spec.learn_inducing, collapsed_bound(spec), spec.batch_size,
                         noise=spec.noise, generator=seeded_generator(config, spec),
                         inducing=spec.inducing, standardisation=standardisation)
        result = train(model, config=config)
        converged = model.partition_values(result.member_converged or [])
        modules = model.to_modules(standardisation, spec.names,
                                   info={"partition_rule": partition.rule.get("kind"),
                                         **(spec.info or {})})
    for k, module in enumerate(modules.values()):
        module.info["converged"] = bool(converged[k]) if converged else result.converged
    return model, result, modules, standardisation


def collapsed_bound(spec: LocalFitSpec) -> bool:
    """Whether the fit uses the collapsed bound: as asked, else for a Gaussian likelihood
    without minibatches."""
    if spec.collapsed is not None:
        return spec.collapsed
    return spec.likelihood == "gaussian" and spec.batch_size is None


def default_config(spec: LocalFitSpec) -> TrainConfig:
    """:data:`COLLAPSED_CONFIG` for the collapsed bound, else :data:`UNCOLLAPSED_CONFIG` (with
    minibatches a natural-gradient step of :data:`MINIBATCH_NATURAL_GRADIENT`)."""
    if collapsed_bound(spec):
        return COLLAPSED_CONFIG
    if spec.batch_size is not None:
        return replace(UNCOLLAPSED_CONFIG, natural_gradient_lr=MINIBATCH_NATURAL_GRADIENT)
    return UNCOLLAPSED_CONFIG


def local_predictor(modules: dict[str, Module], partition: Partition) -> Predictor:
    """Modules routed by their partition's rule, or combined by rBCM for a random partition."""
    if partition.rule.get("kind") == "random" and len(modules) > 1:
        return ExpertCombination(modules, RANDOM_PARTITION_RULE)
    return as_predictor(modules, partition.rule)


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
