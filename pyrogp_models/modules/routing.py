"""Predicting with a folder of local modules: each new point goes to the module of its partition.

Every model in the library follows the **predictor protocol** (:class:`Predictor`): predictions
from inputs ``X`` [N, D] in data units and, for modules partitioned by a label column, the labels
of the new points. :class:`ModulePredictor` adapts one :class:`Module`; :class:`RoutedModules`
routes points through the partition rule stored with a folder of modules.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from pyrogp_models.data.partitioners import route
from pyrogp_models.errors import DataError, IncompatibleModulesError, ModuleFileError
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.modules.files import load_modules_from, read_index
from pyrogp_models.modules.record import Module


@runtime_checkable
class Predictor(Protocol):
    """What every predictive model offers; outputs are torch tensors, in data units."""

    likelihood_name: str
    is_classifier: bool
    feature_names: list[str] | None
    target_name: str | None

    def predict_f(self, X, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent mean and variance, [N] (or [N, L] for several latent functions)."""

    def predict_y(self, X, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean (class probabilities for classifiers) and variance of y."""

    def log_predictive(self, X, y, labels=None) -> torch.Tensor:
        """log p(y_i | x_i) per point, [N]."""


class ModulePredictor:
    """One module under the predictor protocol; ``labels`` are accepted and ignored."""

    def __init__(self, module: Module):
        self.module = module
        self.likelihood_name = module.likelihood_name
        self.is_classifier = LIKELIHOODS[module.likelihood_name].is_classifier
        self.feature_names = module.info.get("features")
        self.target_name = module.info.get("target")

    def predict_f(self, X, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.module.predict_f(X)

    def predict_y(self, X, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.module.predict_y(X)

    def log_predictive(self, X, y, labels=None) -> torch.Tensor:
        return self.module.log_predictive(X, y)


class RoutedModules:
    """Local modules behind their partition rule: each point is predicted by its own module.

    Module k (in dictionary order, which is the index order of a module folder) serves
    partition k of ``rule``. Points are grouped by destination and each module predicts its
    group in one batched call, so the Python loop runs over modules that received points, never
    over points.
    """

    def __init__(self, modules: dict[str, Module], rule: dict[str, Any]):
        if not modules:
            raise DataError("no modules to route points to")
        if rule.get("kind") == "random":
            raise DataError("modules fitted on a random partition have no region to route a "
                            "point to; combine them with --rule (products of experts) instead")
        if rule.get("num_partitions") != len(modules):
            raise ModuleFileError(f"the partition rule has {rule.get('num_partitions')} "
                                  f"partitions but there are {len(modules)} modules")
        self.names = list(modules)
        self.modules = list(modules.values())
        self.rule = rule
        first = self.modules[0]
        self.likelihood_name = first.likelihood_name
        self.is_classifier = LIKELIHOODS[first.likelihood_name].is_classifier
        self.feature_names = first.info.get("features")
        self.target_name = first.info.get("target")
        for name, module in modules.items():
            if (module.likelihood_name, module.num_latent) != (first.likelihood_name,
                                                               first.num_latent):
                raise IncompatibleModulesError(
                    f"module '{name}' has likelihood {module.likelihood_name} with "
                    f"{module.num_latent} latent function(s) but '{self.names[0]}' has "
                    f"{first.likelihood_name} with {first.num_latent}; mixed likelihoods "
                    "cannot be routed")
            if module.input_dim != first.input_dim:
                raise IncompatibleModulesError(
                    f"module '{name}' has {module.input_dim} inputs but '{self.names[0]}' has "
                    f"{first.input_dim}")
            if module.info.get("features") != self.feature_names:
                raise IncompatibleModulesError(
                    f"module '{name}' uses features {module.info.get('features')} but "
                    f"'{self.names[0]}' uses {self.feature_names}")

    def route(self, X, labels=None) -> np.ndarray:
        """The index of the module of each point, int64 [N]."""
        return route(self.rule, X, labels)

    def predict_f(self, X, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self._gather(X, labels, lambda module, X_k, rows: module.predict_f(X_k))

    def predict_y(self, X, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self._gather(X, labels, lambda module, X_k, rows: module.predict_y(X_k))

    def log_predictive(self, X, y, labels=None) -> torch.Tensor:
        y = torch.as_tensor(y)
        (log_density,) = self._gather(
            X, labels, lambda module, X_k, rows: (module.log_predictive(X_k, y[rows]),))
        return log_density

    def _gather(self, X, labels, predict: Callable) -> tuple[torch.Tensor, ...]:
        """Run ``predict(module, X[rows], rows)`` per destination module; reassemble the
        outputs in row order."""
        X = torch.as_tensor(X)
        destinations = torch.from_numpy(self.route(X, labels))
        outputs: list[torch.Tensor] = []
        for k in torch.unique(destinations).tolist():
            rows = torch.nonzero(destinations == k).squeeze(-1)
            parts = predict(self.modules[k], X[rows], rows)
            if not outputs:
                outputs = [part.new_empty((len(X), *part.shape[1:])) for part in parts]
            for output, part in zip(outputs, parts, strict=True):
                output[rows] = part
        return tuple(outputs)


def as_predictor(modules: Module | dict[str, Module],
                 rule: dict[str, Any] | None = None) -> ModulePredictor | RoutedModules:
    """A predictor for one module, or for several modules routed by their partition rule."""
    if isinstance(modules, Module):
        return ModulePredictor(modules)
    if len(modules) == 1:
        return ModulePredictor(next(iter(modules.values())))
    if rule is None:
        raise DataError(f"{len(modules)} modules without a partition rule cannot route points; "
                        "combine them with --rule (products of experts) instead")
    return RoutedModules(modules, rule)


def load_predictor(path: str | Path) -> Predictor:
    """The predictor of a module file, of a module folder routed by its stored rule, or of a
    distributed-kernel file (told apart by the format named in the file's header)."""
    from pyrogp_models.models.distributed_kernel.files import (
        is_distributed_kernel_file,
        load_distributed_kernel,
    )

    path = Path(path)
    if is_distributed_kernel_file(path):
        return load_distributed_kernel(path)
    modules = load_modules_from(path)
    rule = read_index(path).get("partition") if path.is_dir() else None
    return as_predictor(modules, rule)
