"""Every model of the library, small and built fresh by its own fit function: shared by the
device, host-read and float32 tests.

A :class:`Case` fits its model with a given dtype and training config and returns the
:class:`Fitted` model, its record and a prediction in data units; ``predict_sites`` runs the
model's own Pyro prediction (``predictive_guide`` + ``predictive_model``) at new inputs in model
units. :func:`move_to` moves a built model — parameters, buffers and every tensor it keeps
outside them (module stacks, group indices, cached sites) — to another device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pyro
import torch
from pyro.nn import PyroModule
from pyrogp_models.inference import recycling, train_config
from pyrogp_models.inference.distributed_kernel_fit import (
    DistributedKernelSpec,
    fit_distributed_kernel,
)
from pyrogp_models.inference.experts_fit import DEFAULT_TRAIN_CONFIG, ExpertsSpec, fit_exact_experts
from pyrogp_models.inference.local_fit import LocalFitSpec, default_config, fit_local
from pyrogp_models.inference.multitask_fit import MultitaskSpec, fit_multitask_dgp
from pyrogp_models.inference.multitask_fit import default_config as multitask_config
from pyrogp_models.inference.trainer import TrainConfig, TrainResult

from pyrogp_models.data.partitioners import (
    partition_by_label,
    partition_contiguous,
    partition_random,
)
from pyrogp_models.models.multitask import toy_tasks

#: Why a prediction cannot run on the meta device: its shapes depend on the data's values.
HALO_SIZES = ("distributed kernel: a prediction sizes each region's halo from the new inputs "
              "(one read per prediction, by design), which the meta device cannot run")
MULTITASK_LAYOUT = ("multitask: the task layout of new rows has data-dependent shapes, which the "
                    "meta device cannot run")
#: Why the float32 and float64 fits of a case take different paths, beyond rounding.
MONTE_CARLO = "its objective and predictive draw from torch's generator, whose streams differ"
STATIONARY_START = ("Adam from a start where the lengthscale's gradient is exactly zero (q(v) at "
                    "the whitened prior: var f = k(x, x) whatever ℓ) steps by ±lr on the sign "
                    "of rounding noise")


def series(n: int = 120, seed: int = 0, likelihood: str = "gaussian"):
    """Sorted inputs on [0, 6] and a smooth signal: Gaussian noise around 2 + ½ sin 1.5x, or
    Bernoulli labels / Poisson counts driven by it."""
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0, 6, size=(n, 1)), axis=0)
    f = np.sin(1.5 * X[:, 0])
    if likelihood == "bernoulli":
        return X, (rng.uniform(size=n) < 1 / (1 + np.exp(-3 * f))).astype(float)
    if likelihood == "poisson":
        return X, rng.poisson(np.exp(1.0 + f)).astype(float)
    return X, 2.0 + 0.5 * f + 0.1 * rng.standard_normal(n)


X_NEW = np.array([[0.4], [2.2], [3.1], [5.7]])


@dataclass
class Fitted:
    model: PyroModule
    result: TrainResult
    predict: Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor]]  # data units → mean, var
    to_model_units: Callable[[np.ndarray], np.ndarray]


@dataclass
class Case:
    fit: Callable[[torch.dtype, Callable[[TrainConfig], TrainConfig]], Fitted]
    predict_sites: Callable[[PyroModule, torch.Tensor], object]
    meta_prediction_fails: str | None = None  # why its prediction cannot run on meta
    paths_differ: str | None = None  # why float32 and float64 fits differ beyond rounding


def _config(default: TrainConfig, adjust) -> TrainConfig:
    return adjust(default) if adjust is not None else default


def local_case(likelihood="gaussian", collapsed=None, batch_size=None, whole=False) -> Case:
    """``whole``: the first partition has as many inducing inputs as points (Z = X_k, fixed)."""
    def fit(dtype, adjust=None):
        X, y = series(likelihood=likelihood)
        partition = partition_contiguous(X, 3)
        num_inducing = [int(partition.sizes[0]), 5, 5] if whole else 5
        spec = LocalFitSpec(num_inducing=num_inducing, likelihood=likelihood,
                            collapsed=collapsed, batch_size=batch_size, restarts=1,
                            dtype=dtype)  # one training run
        result = fit_local((X, y, partition), spec, _config(default_config(spec), adjust))
        return Fitted(result.model, result.result, result.predictor.predict_y,
                      result.standardisation.transform_x)

    def predict_sites(model, X):
        assignments = np.arange(len(X)) % model.num_partitions  # routing reads X on the host
        return _predictive_trace(model, X, assignments)

    return Case(fit, predict_sites)


def _modules(dtype, collapsed=True):
    X, y = series()
    return fit_local((X, y, partition_contiguous(X, 3)),
                     LocalFitSpec(num_inducing=6, collapsed=collapsed, dtype=dtype)).modules


def meta_case(collapsed: bool) -> Case:
    def fit(dtype, adjust=None):
        spec = recycling.RecycleSpec(num_inducing=8, collapsed=collapsed, dtype=dtype)
        default = train_config.COLLAPSED_CONFIG if collapsed else train_config.UNCOLLAPSED_CONFIG
        result = recycling.recycle(_modules(dtype), spec, _config(default, adjust))
        return Fitted(result.model, result.result, result.module.predict_y,
                      result.standardisation.transform_x)

    return Case(fit, _predictive_trace)


def multioutput_case() -> Case:
    def fit(dtype, adjust=None):
        X, y = series(90)
        labels = np.repeat(np.arange(3), 30)
        modules = fit_local((X, y, partition_by_label(labels, "output")),
                            LocalFitSpec(num_inducing=5, dtype=dtype)).modules
        spec = recycling.RecycleSpec(num_inducing=6, dtype=dtype)
        result = recycling.recycle_multioutput(modules, 2, spec,
                                               _config(train_config.UNCOLLAPSED_CONFIG, adjust))
        predictor = result.predictor("part001")
        return Fitted(result.model, result.result, predictor.predict_y,
                      predictor.standardisation.transform_x)

    return Case(fit, _predictive_trace)


def experts_case() -> Case:
    def fit(dtype, adjust=None):
        X, y = series(60)
        result = fit_exact_experts((X, y, partition_random(60, 3, 0)),
                                   ExpertsSpec(restarts=1, dtype=dtype),  # one training run
                                   _config(DEFAULT_TRAIN_CONFIG, adjust))
        return Fitted(result.model, result.result, result.predictor.predict_y,
                      result.standardisation.transform_x)

    return Case(fit, _predictive_trace)


def distributed_kernel_case(likelihood="gaussian", variational="meanfield",
                            paths_differ: str | None = None) -> Case:
    def fit(dtype, adjust=None):
        X, y = series(likelihood=likelihood)
        spec = DistributedKernelSpec(3, 5, likelihood=likelihood, variational=variational,
                                     dtype=dtype)
        default = TrainConfig(steps=1000, lr=0.05, window=50, tol=1e-6)
        result = fit_distributed_kernel((X, y), spec, _config(default, adjust))
        return Fitted(result.model, result.result, result.predictor.predict_y,
                      result.standardisation.transform_x)

    return Case(fit, _predictive_trace, meta_prediction_fails=HALO_SIZES,
                paths_differ=paths_differ)


def co_located_tasks(num_points: int = 20) -> list[tuple[np.ndarray, np.ndarray]]:
    """The toy's two tasks observed at the same inputs (task 1's), so that cGP's noise
    correlation has sites with both outputs."""
    pairs = toy_tasks(num_points, seed=0)
    X, y = pairs[0]
    return [(X, y), (X, y + pairs[1][1] - pairs[0][1].mean())]


def multitask_case(kind: str, data: Callable[[], list] = lambda: toy_tasks(20, seed=0),
                   **options) -> Case:
    def fit(dtype, adjust=None):
        spec = MultitaskSpec(model=kind, num_inducing=5, dtype=dtype, **options)
        result = fit_multitask_dgp(data(), spec, _config(multitask_config(spec), adjust))
        predictor = result.predictor

        def predict(X):  # task 0
            return predictor.predict_y(X, np.zeros(len(X), dtype=np.int64))

        return Fitted(result.model, result.result, predict, result.standardisation.transform_x)

    def predict_sites(model, X):
        tasks = torch.zeros(len(X), dtype=torch.long, device=X.device)
        return _predictive_trace(model, X, tasks)

    return Case(fit, predict_sites, meta_prediction_fails=MULTITASK_LAYOUT,
                paths_differ=MONTE_CARLO if kind not in ("igp", "cgp") else None)


def _predictive_trace(model, X, *args):
    """One draw of the model's predictive sites at X, as ``pyro.infer.Predictive`` makes it."""
    guide = pyro.poutine.trace(model.predictive_guide).get_trace(X, *args)
    return pyro.poutine.trace(pyro.poutine.replay(model.predictive_model, trace=guide)
                              ).get_trace(X, *args)


CASES: dict[str, Case] = {
    "local-collapsed": local_case(),
    "local-whole-partition": local_case(whole=True),
    "local-gaussian": local_case(collapsed=False),
    "local-minibatch": local_case(batch_size=16),
    "local-bernoulli": local_case("bernoulli"),
    "local-poisson": local_case("poisson"),
    "meta-collapsed": meta_case(True),
    "meta": meta_case(False),
    "multioutput": multioutput_case(),
    "experts": experts_case(),
    "distkernel-solve": distributed_kernel_case(),
    # trained by Adam (the collapsed bound is for a Gaussian likelihood and mean-field q)
    "distkernel-joint": distributed_kernel_case(variational="joint",
                                                paths_differ=STATIONARY_START),
    "distkernel-bernoulli": distributed_kernel_case("bernoulli", paths_differ=STATIONARY_START),
    "multitask-smdgp": multitask_case("smdgp"),
    "multitask-igp": multitask_case("igp"),
    # one fit (a default cGP compares candidates, each by fits of held-out folds)
    "multitask-cgp": multitask_case("cgp", co_located_tasks, noise="correlated"),
}


def no_steps(config: TrainConfig) -> TrainConfig:
    return replace(config, steps=0)


def built(name: str, dtype=torch.float64) -> PyroModule:
    """The model of case ``name`` as its fit function builds it, untrained."""
    return CASES[name].fit(dtype, no_steps).model


# Moving a built model ----------------------------------------------------------------------------
_MODULE_INTERNALS = frozenset(vars(PyroModule()))


def move_to(obj, device):
    """``obj`` with every tensor it holds on ``device`` (nn.Modules and the library's own objects
    are changed in place, frozen dataclasses included)."""
    return _move(obj, torch.device(device), set())


def _move(obj, device, seen):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, list | tuple | dict) or _is_library_object(obj):
        if id(obj) in seen:
            return obj
        seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        obj.to(device)
        for module in obj.modules():
            for key, value in list(vars(module).items()):
                if key not in _MODULE_INTERNALS:
                    object.__setattr__(module, key, _move(value, device, seen))
        return obj
    if isinstance(obj, dict):
        return {key: _move(value, device, seen) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_move(value, device, seen) for value in obj]
    if isinstance(obj, tuple):
        values = [_move(value, device, seen) for value in obj]
        return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
    if _is_library_object(obj):
        for key, value in list(vars(obj).items()):
            object.__setattr__(obj, key, _move(value, device, seen))
    return obj


def _is_library_object(obj) -> bool:
    return (not isinstance(obj, type) and hasattr(obj, "__dict__")
            and (dataclasses.is_dataclass(obj)
                 or type(obj).__module__.startswith("pyrogp_models")))
