"""Multitask files: one fitted multitask GP with its predictor settings in one safetensors file.

A signed file (:mod:`pyrogp_models.modules.signed`) like module files. Its record holds
``"format": "pyrogp-multitask"`` (what tells this file from a module or a distributed-kernel
file), the format version, the model's config from :meth:`MultitaskPredictor.to_state` (its
kind, T, D and options, likelihood included), the standardisation, the predictive samples S and
their seed, and ``info`` (features, target column(s), task column, task names, fit summary). The
tensors are the model's state (parameters unconstrained, the fixed inner means); no data.
Loading checks the digest, the version, the kind, every tensor's presence, shape and finiteness,
and never unpickles; any problem raises :class:`~pyrogp_models.errors.ModuleFileError` with one
line naming the file.
:func:`~pyrogp_models.models.multitask.description.describe_multitask` is the summary of a
fitted model (what ``pyrogp info`` prints).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from pyrogp_models.errors import CholeskyError
from pyrogp_models.layers import variational_layers
from pyrogp_models.models.multitask.families import MODELS
from pyrogp_models.models.multitask.prediction import MultitaskPredictor
from pyrogp_models.modules.signed import Fail, SignedFormat

#: One fitted multitask GP per file.
MULTITASK_FILE = SignedFormat("pyrogp-multitask", 1)


# Writing ----------------------------------------------------------------------------------------
def multitask_to_bytes(predictor: MultitaskPredictor) -> bytes:
    """Serialise a predictor (its model's state and settings) to the bytes of a safetensors
    file."""
    return MULTITASK_FILE.to_bytes(*predictor.to_state())


def save_multitask(predictor: MultitaskPredictor, path: str | Path) -> Path:
    """Write one multitask file atomically; returns its path."""
    return MULTITASK_FILE.save(path, *predictor.to_state())


# Reading ----------------------------------------------------------------------------------------
def load_multitask(path: str | Path) -> MultitaskPredictor:
    """Read and validate a multitask file; any problem raises
    :class:`~pyrogp_models.errors.ModuleFileError`."""
    return MULTITASK_FILE.load(path, _build)


def multitask_from_bytes(data: bytes, source: str = "<bytes>") -> MultitaskPredictor:
    """Parse and validate the bytes of a multitask file."""
    return MULTITASK_FILE.from_bytes(data, _build, source)


def _build(record: dict[str, Any], tensors: dict[str, torch.Tensor], fail: Fail
           ) -> MultitaskPredictor:
    """The predictor of a checked record, its prior covariances factorised."""
    _check_record(record, tensors, fail)
    try:
        predictor = MultitaskPredictor.from_state(record, tensors)
    except RuntimeError as error:  # load_state_dict: missing, unexpected or misshapen tensors
        raise fail(f"the tensors do not fit its {record['model']['model']} model ({error})"
                   ) from None
    try:
        for layer in variational_layers(predictor.model):
            layer.prior_cholesky(check=True)
    except CholeskyError:
        raise fail("a prior covariance K_zz is not positive definite") from None
    return predictor


def _check_record(record: dict[str, Any], tensors: dict[str, torch.Tensor], fail) -> None:
    """What :meth:`MultitaskPredictor.from_state` would not catch: the kind, one floating dtype,
    finite tensors, a standardisation and names that fit T tasks and D inputs, S ≥ 1."""
    model = record["model"]
    if model["model"] not in MODELS:
        raise fail(f"unknown multitask model kind '{model['model']}'; "
                   f"known: {', '.join(sorted(MODELS))}")
    num_tasks, input_dim = model["num_tasks"], model["input_dim"]
    if not (isinstance(num_tasks, int) and isinstance(input_dim, int)
            and num_tasks >= 1 and input_dim >= 1):
        raise fail(f"num_tasks {num_tasks!r} and input_dim {input_dim!r} must be positive")
    dtypes = {tensor.dtype for tensor in tensors.values()}
    if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
        raise fail(f"tensors must share one floating dtype, found {sorted(map(str, dtypes))}")
    for name, tensor in tensors.items():
        if not bool(torch.isfinite(tensor).all()):
            raise fail(f"{name} contains NaN or inf")
    _check_standardisation(record["standardisation"], num_tasks, input_dim, fail)
    if not (isinstance(record["num_samples"], int) and record["num_samples"] >= 1
            and isinstance(record["seed"], int)):
        raise fail("num_samples must be a positive whole number and seed a whole number")
    info = record["info"]
    for key, count in (("features", input_dim), ("tasks", num_tasks)):
        names = info.get(key)
        if names is not None and (len(names) != count or len(set(names)) != count
                                  or not all(isinstance(name, str) for name in names)):
            raise fail(f"{key} {names} are not {count} distinct names")


def _check_standardisation(record: dict[str, Any], num_tasks: int, input_dim: int,
                           fail) -> None:
    shapes = {"x_mean": input_dim, "x_scale": input_dim, "task_y_mean": num_tasks,
              "task_y_scale": num_tasks}
    values = {key: np.asarray(record[key], dtype=np.float64) for key in shapes}
    for key, size in shapes.items():
        if values[key].shape != (size,) or not np.isfinite(values[key]).all():
            raise fail(f"standardisation {key} is not {size} finite numbers")
    if (values["x_scale"] <= 0).any() or (values["task_y_scale"] <= 0).any():
        raise fail("standardisation scales must be positive")
