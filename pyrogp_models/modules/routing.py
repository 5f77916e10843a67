"""Predicting with a folder of local modules: each new point goes to the module of its partition.

:class:`RoutedModules` routes points through the partition rule stored with a folder of modules
(:mod:`pyrogp_models.data.partitioners`) and is, like a single :class:`Module`, a
:class:`~pyrogp_models.modules.predictor.Predictor` in data units. (Any file or folder the library
writes opens as a predictor with :func:`pyrogp_models.io.load_predictor`.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pyrogp_models.data.partitioners import route
from pyrogp_models.errors import DataError, ModuleFileError, UnroutableModulesError
from pyrogp_models.likelihoods import Likelihood
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.stack import check_compatible
from pyrogp_models.modules.units import convert_all


class RoutedModules(Predictor):
    """Local modules behind their partition rule: each point is predicted by its own module.

    Module k (in dictionary order, which is the index order of a module folder) serves
    partition k of ``rule``. Modules with their own standardisations are converted to their
    common one (:mod:`pyrogp_models.modules.units`), so latent moments share units. Points are
    grouped by destination and each module predicts its group in one batched call, so the Python
    loop runs over modules that received points, never over points.
    """

    def __init__(self, modules: dict[str, Module], rule: dict[str, Any]):
        if not modules:
            raise DataError("no modules to route points to")
        if rule.get("kind") == "random":
            raise UnroutableModulesError("modules fitted on a random partition have no region to "
                                         "route a point to")
        if rule.get("num_partitions") != len(modules):
            raise ModuleFileError(f"the partition rule has {rule.get('num_partitions')} "
                                  f"partitions but there are {len(modules)} modules")
        check_compatible(modules, "route")
        converted, self.standardisation = convert_all(modules)  # one system: exact
        self.names = list(converted)
        self.modules = list(converted.values())
        self.rule = rule
        first = self.modules[0]
        self.likelihood_name = first.likelihood_name
        self.columns = first.columns
        self.info = {}

    @property
    def input_dim(self) -> int:
        return self.modules[0].input_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.modules[0].dtype

    @property
    def device(self) -> torch.device:
        return self.modules[0].device

    def likelihood(self) -> Likelihood:
        """The first module's likelihood (all share its family)."""
        return self.modules[0].likelihood()

    def route(self, X, labels=None) -> np.ndarray:
        """The index of the module of each point, int64 [N]."""
        return route(self.rule, X, labels)

    def latent(self, X: torch.Tensor, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each point's latent moments from its own module (model units)."""
        return self._gather(X, labels, lambda module, X_k, rows: module.latent(X_k))

    def log_predictive(self, X, y, labels=None) -> torch.Tensor:
        """log p(y_i | x_i) from each point's own module and likelihood parameters."""
        y = torch.as_tensor(y)
        (log_density,) = self._gather(
            self.inputs(X), labels,
            lambda module, X_k, rows: (module.log_predictive(X_k, y[rows]),))
        return log_density

    def y_moments(self, mean, var):
        raise NotImplementedError("routed modules apply each module's own likelihood; "
                                  "predict_y does that")

    def predict_y(self, X, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each point's predictive mean and variance from its own module, in data units."""
        return self._gather(self.inputs(X), labels,
                            lambda module, X_k, rows: module.predict_y(X_k))

    def pointwise_draws(self, X, y, num_samples: int = 500, labels=None, seed: int = 0):
        """Each point's draws from its own module (:meth:`Predictor.pointwise_draws`); the
        posterior holds ``f`` only (the inducing variables are per module)."""
        X, y = self.inputs(X), torch.as_tensor(y)

        def draws(module, X_k, rows):
            posterior, y_draws, log_lik = module.pointwise_draws(X_k, y[rows], num_samples,
                                                                 seed=seed)
            return posterior["f"].movedim(0, -1), y_draws.mT, log_lik.mT

        f, y_draws, log_lik = self._gather(X, labels, draws)
        return {"f": f.movedim(-1, 0)}, y_draws.mT, log_lik.mT

    def _gather(self, X: torch.Tensor, labels, predict: Callable) -> tuple[torch.Tensor, ...]:
        """Run ``predict(module, X[rows], rows)`` per destination module; reassemble the
        outputs in row order."""
        destinations = torch.from_numpy(self.route(X.cpu(), labels))
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
                 rule: dict[str, Any] | None = None) -> Module | RoutedModules:
    """A predictor for one module, or for several modules routed by their partition rule."""
    if isinstance(modules, Module):
        return modules
    if len(modules) == 1:
        return next(iter(modules.values()))
    if rule is None:
        raise UnroutableModulesError(f"{len(modules)} modules without a partition rule cannot "
                                     "route points")
    return RoutedModules(modules, rule)

