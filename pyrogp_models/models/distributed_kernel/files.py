"""Distributed-kernel files: one fitted :class:`DistributedKernelGP` in one safetensors file.

A signed file (:mod:`pyrogp_models.modules.signed`) like module files. Its record holds
``"format": "pyrogp-distkernel"``, the format version, kernel family and ARD, likelihood name and
options, variational family, region structure, standardisation, N, ELBO, the data columns
(feature and target names, units) and free-form ``info``.
The tensors are the cut values of each active dimension (``cuts.<d>``), Z [J, m, D], the
whitened q(v) (``q_mean`` [J, m], or [J·m] for the joint q, and ``q_sqrt``) and the
hyperparameters (``kernel.*``, ``likelihood.*``), all in standardised units. Loading checks the
digest, every shape and value, and never unpickles; any problem raises
:class:`~pyrogp_models.errors.ModuleFileError` naming the file.

:class:`DistributedKernelPredictor` is the fitted model as a
:class:`~pyrogp_models.modules.predictor.Predictor`: it takes and returns data units. The file
holds no training data (the model's bound data are not written).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.data.columns import Columns
from pyrogp_models.errors import CholeskyError
from pyrogp_models.likelihoods import LIKELIHOODS, Likelihood, make_likelihood
from pyrogp_models.models.distributed_kernel.local_kernels import shared_se_kernel
from pyrogp_models.models.distributed_kernel.model import VARIATIONAL, DistributedKernelGP
from pyrogp_models.models.distributed_kernel.regions import Regions
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.signed import Fail, SignedFormat, atomic_write

#: One fitted distributed-kernel GP per file.
DISTRIBUTED_KERNEL_FILE = SignedFormat("pyrogp-distkernel", 1)


class DistributedKernelPredictor(Predictor):
    """A fitted distributed-kernel GP with its standardisation: a
    :class:`~pyrogp_models.modules.predictor.Predictor` taking and returning data units.

    ``columns`` (feature and target names, units) and ``info`` are as on a
    :class:`~pyrogp_models.modules.record.Module`. The predictor wraps ``model`` itself
    (no copy): a fit's predictor follows its model if training continues. Posterior draws
    (``posterior_draws``, ``to_inference_data``) go through the model's inducing
    variables (:meth:`DistributedKernelGP.predictive_model`): sites ``u`` (the whitened inducing
    values, [J, m], or [J·m] for the joint q), ``f`` and ``y``.
    """

    def __init__(self, model: DistributedKernelGP, standardisation: Standardisation,
                 num_data: int, elbo: float, info: dict | None = None,
                 columns: Columns | None = None):
        self.model = model
        self.standardisation = standardisation
        self.num_data = int(num_data)
        self.elbo = float(elbo)
        self.info = dict(info or {})
        self.columns = columns or Columns()

    @property
    def input_dim(self) -> int:
        return self.model.regions.input_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.model.q_mean.dtype

    @property
    def device(self) -> torch.device:
        return self.model.q_mean.device

    def likelihood(self) -> Likelihood:
        """A frozen copy of the model's likelihood."""
        likelihood = self.model.likelihood
        values = {key: value.detach() for key, value in likelihood.parameter_values().items()}
        return make_likelihood(likelihood.name, (), self.dtype, self.device,
                               **likelihood.options(), **values).requires_grad_(False)

    def latent(self, X: torch.Tensor, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f) at X [N, D] (data units): mean and variance [N] in model units."""
        return self.model.predict_latent(self.standardisation.transform_x(X))

    def predictive_model(self, X: torch.Tensor, labels=None):
        """The model's v, f | v and y | f at X [N, D] (data units), model units."""
        return self.model.predictive_model(self.standardisation.transform_x(X))[1]

    def predictive_guide(self, X: torch.Tensor, labels=None):
        """q(v) of the model."""
        self.model.predictive_guide()

    def describe(self) -> str:
        """A few lines: regions (cuts in data units), m, hyperparameters, likelihood, ELBO."""
        model = self.model
        names = self._feature_names()
        kind = "mean-field" if model.variational == "meanfield" else "joint"
        regions = f"{model.num_regions} region{'s' if model.num_regions > 1 else ''}"
        lines = [f"distributed-kernel GP: {regions} × {model.num_inducing} "
                 f"inducing inputs (M = {model.num_regions * model.num_inducing}), {kind} q",
                 *self._describe_regions(names)]
        ard = " (ARD)" if model.kernel.ard else ""
        lengthscale = ", ".join(f"{v:.4g}" for v in model.kernel.lengthscale.tolist())
        lines.append(f"kernel: rbf{ard}, lengthscale {lengthscale}, "
                     f"signal variance {float(model.kernel.variance.detach()):.4g}")
        settings = [f"{k}={v}" for k, v in model.likelihood.options().items()]
        settings += [f"{k}={float(v.detach()):.4g}"
                     for k, v in model.likelihood.parameter_values().items()]
        lines.append(f"likelihood: {model.likelihood.name}"
                     + (f" ({', '.join(settings)})" if settings else ""))
        lines.append(f"N = {self.num_data}, ELBO = {self.elbo:.6g}")
        if self.columns.describe():
            lines.append(self.columns.describe())
        lines.append("hyperparameters and ELBO refer to the standardised data")
        return "\n".join(lines)

    def summary(self) -> dict[str, Any]:
        """What :meth:`describe` tells, as JSON-able values in data units: the regions' faces
        along the active dimensions (``None`` for an open end), the kernel (ℓ_d s_x,d and σ² s_y²),
        the likelihood (a Gaussian noise variance times s_y²), N and the ELBO (of the
        standardised data)."""
        model, s = self.model, self.standardisation
        names = self._feature_names()
        target_scale = s.y_scale ** 2 if self.likelihood().standardise_targets else 1.0
        lower, upper = self._data_unit_bounds()
        dims = model.regions.active_dims

        def face(value: float) -> float | None:
            return float(value) if math.isfinite(value) else None

        lengthscale = model.kernel.lengthscale.detach().expand(self.input_dim)
        parameters = {key: float(value.detach()) * (target_scale if key == "variance" else 1.0)
                      for key, value in model.likelihood.parameter_values().items()}
        return {"model": "distributed-kernel", "num_regions": model.num_regions,
                "num_inducing_per_region": model.num_inducing,
                "variational": model.variational,
                "regions": [{names[d]: [face(lower[j, d]), face(upper[j, d])] for d in dims}
                            for j in range(model.num_regions)],
                "kernel": {"name": "rbf", "ard": model.kernel.ard,
                           "lengthscale": dict(zip(names, (lengthscale * torch.as_tensor(
                               s.x_scale, dtype=lengthscale.dtype, device=lengthscale.device)
                               ).tolist(), strict=True)),
                           "variance": float(model.kernel.variance.detach()) * target_scale},
                "likelihood": {"name": model.likelihood.name, **model.likelihood.options(),
                               **parameters},
                "num_data": self.num_data, "elbo": self.elbo,
                "features": self.columns.features and list(self.columns.features),
                "target": self.columns.target, "units": dict(self.columns.units)}

    def _feature_names(self) -> list[str]:
        """The feature columns' names, or x0, x1, … when the file records none."""
        return list(self.columns.features or [f"x{d}" for d in range(self.input_dim)])

    def _data_unit_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The regions' faces [J, D] in data units (±∞ beyond the outer cuts)."""
        lower, upper = self.model.regions.full_bounds()
        return (self.standardisation.inverse_x(lower.detach()),
                self.standardisation.inverse_x(upper.detach()))

    def _describe_regions(self, names: list[str]) -> list[str]:
        regions = self.model.regions
        if not regions.active_dims:
            return ["regions: the whole input space"]
        lower, upper = self._data_unit_bounds()
        if len(regions.active_dims) == 1:
            d = regions.active_dims[0]
            cuts = sorted(float(v) for v in lower[:, d] if math.isfinite(v))
            return [f"cuts along {names[d]} (data units): {', '.join(f'{c:.4g}' for c in cuts)}"]
        return [f"region {j}: " + ", ".join(
            f"{names[d]} ∈ [{float(lower[j, d]):.4g}, {float(upper[j, d]):.4g})"
            for d in regions.active_dims) for j in range(regions.num_regions)]


# Writing ----------------------------------------------------------------------------------------
def predictor_to_bytes(predictor: DistributedKernelPredictor) -> bytes:
    """Serialise a fitted distributed-kernel GP to the bytes of a safetensors file."""
    model = predictor.model
    regions = model.regions
    values = regions.cut_values()
    tensors = {f"cuts.{d}": values[a, :int(regions.num_cuts[a])]
               for a, d in enumerate(regions.active_dims)}
    q_mean = model.q_mean.flatten() if model.variational == "joint" else model.q_mean
    tensors.update({"inducing": model.inducing, "q_mean": q_mean, "q_sqrt": model.q_sqrt,
                    "kernel.lengthscale": model.kernel.lengthscale,
                    "kernel.variance": model.kernel.variance})
    tensors.update({f"likelihood.{k}": v
                    for k, v in model.likelihood.parameter_values().items()})
    record = {
        "kernel": {"family": model.kernel.family, "ard": bool(model.kernel.ard),
                   "input_dim": regions.input_dim},
        "likelihood": {"name": model.likelihood.name, "options": model.likelihood.options()},
        "variational": model.variational,
        "regions": {"active_dims": list(regions.active_dims),
                    "lower_index": regions.lower_index.tolist(),
                    "upper_index": regions.upper_index.tolist()},
        "jitter": float(model.jitter),
        "halo_eps": float(model.halo_eps),
        "standardisation": predictor.standardisation.to_dict(),
        "num_data": predictor.num_data,
        "elbo": predictor.elbo,
        "columns": predictor.columns.to_dict(),
        "info": predictor.info,
    }
    return DISTRIBUTED_KERNEL_FILE.to_bytes(record, tensors)


def save_distributed_kernel(predictor: DistributedKernelPredictor, path: str | Path) -> Path:
    """Write one distributed-kernel file atomically; returns its path."""
    path = Path(path)
    atomic_write(path, predictor_to_bytes(predictor))
    return path


# Reading ----------------------------------------------------------------------------------------
def load_distributed_kernel(path: str | Path) -> DistributedKernelPredictor:
    """Read and validate a distributed-kernel file; any problem raises
    :class:`~pyrogp_models.errors.ModuleFileError`."""
    return DISTRIBUTED_KERNEL_FILE.load(path, _build)


def predictor_from_bytes(data: bytes, source: str = "<bytes>") -> DistributedKernelPredictor:
    """Parse and validate the bytes of a distributed-kernel file."""
    return DISTRIBUTED_KERNEL_FILE.from_bytes(data, _build, source)


def _build(record: dict[str, Any], tensors: dict[str, torch.Tensor], fail: Fail
           ) -> DistributedKernelPredictor:
    """Check every field of a parsed file and assemble the predictor (its prior covariance
    factorised)."""
    kernel, likelihood_record = record["kernel"], record["likelihood"]
    if kernel["family"] != "rbf":
        raise fail(f"kernel family '{kernel['family']}' cannot be split; only 'rbf' can")
    if record["variational"] not in VARIATIONAL:
        raise fail(f"unknown variational family '{record['variational']}'")
    if likelihood_record["name"] not in LIKELIHOODS:
        raise fail(f"unknown likelihood '{likelihood_record['name']}'")
    input_dim = int(kernel["input_dim"])
    _check_tensors(tensors, record, input_dim, fail)
    inducing = tensors["inducing"]
    regions = _regions(record["regions"], tensors, input_dim, inducing.shape[0], fail)
    standardisation = _standardisation(record["standardisation"], input_dim, fail)
    jitter, halo_eps = float(record["jitter"]), float(record["halo_eps"])
    if not (math.isfinite(jitter) and jitter >= 0 and 0 <= halo_eps < 1):
        raise fail("jitter must be finite and ≥ 0, halo_eps in [0, 1)")
    columns, info = Columns.split_info(record, record["info"])
    columns.check_inputs(input_dim)
    parameters = {k.split(".", 1)[1]: v for k, v in tensors.items()
                  if k.startswith("likelihood.")}
    model = DistributedKernelGP(
        regions, inducing,
        shared_se_kernel(input_dim, bool(kernel["ard"]), tensors["kernel.lengthscale"],
                         tensors["kernel.variance"], dtype=inducing.dtype,
                         device=inducing.device),
        make_likelihood(likelihood_record["name"], (), inducing.dtype, inducing.device,
                        **likelihood_record["options"], **parameters),
        variational=record["variational"], learn_inducing=False, jitter=jitter,
        halo_eps=halo_eps)
    model.set_whitened_posterior(tensors["q_mean"], tensors["q_sqrt"])
    model.requires_grad_(False)
    try:
        model.prior_cholesky()
    except CholeskyError:
        raise fail("the prior covariance k_j(Z_j, Z_j) is not positive definite") from None
    return DistributedKernelPredictor(model, standardisation, int(record["num_data"]),
                                      float(record["elbo"]), info, columns)


def _check_tensors(tensors: dict[str, torch.Tensor], record: dict[str, Any], input_dim: int,
                   fail) -> None:
    """One floating dtype, finite values, the shapes the record implies, positive parameters and
    a lower Cholesky factor with a positive diagonal."""
    inducing = tensors["inducing"]
    if input_dim < 1 or inducing.dim() != 3 or inducing.shape[-1] != input_dim:
        raise fail(f"inducing has shape {list(inducing.shape)}, expected [J, m, {input_dim}]")
    if not inducing.is_floating_point():
        raise fail(f"inducing has dtype {inducing.dtype}, expected floating point")
    for name, tensor in tensors.items():
        if tensor.dtype != inducing.dtype:
            raise fail(f"{name} has dtype {tensor.dtype}, expected {inducing.dtype}")
        if not bool(torch.isfinite(tensor).all()):
            raise fail(f"{name} contains NaN or inf")
    likelihood = LIKELIHOODS[record["likelihood"]["name"]]
    parameters = {k.split(".", 1)[1] for k in tensors if k.startswith("likelihood.")}
    if parameters != set(likelihood.PARAMETERS):
        raise fail(f"likelihood parameters {sorted(parameters)} do not match {likelihood.name}")
    J, m, _ = inducing.shape
    meanfield = record["variational"] == "meanfield"
    expected = {"q_mean": (J, m) if meanfield else (J * m,),
                "q_sqrt": (J, m, m) if meanfield else (J * m, J * m),
                "kernel.lengthscale": (input_dim if record["kernel"]["ard"] else 1,),
                "kernel.variance": (), **{f"likelihood.{k}": () for k in parameters}}
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise fail(f"{name} has shape {list(tensors[name].shape)}, expected {list(shape)}")
    if not (bool((tensors["kernel.lengthscale"] > 0).all())
            and float(tensors["kernel.variance"]) > 0):
        raise fail("kernel lengthscale and variance must be positive")
    for key, (_, constraint) in likelihood.PARAMETERS.items():
        value = tensors[f"likelihood.{key}"]
        if not bool(constraint.check(value).all()):
            raise fail(f"likelihood parameter '{key}' = {float(value)} is out of its range")
    q_sqrt = tensors["q_sqrt"]
    if not bool((q_sqrt.diagonal(dim1=-2, dim2=-1) > 0).all()) or bool(q_sqrt.triu(1).any()):
        raise fail("q_sqrt is not a lower Cholesky factor with a positive diagonal")


def _standardisation(record: dict[str, Any], input_dim: int, fail) -> Standardisation:
    standardisation = Standardisation.from_dict(record)
    x_mean, x_scale = standardisation.x_mean, standardisation.x_scale
    values = np.concatenate([x_mean, x_scale, [standardisation.y_mean, standardisation.y_scale]])
    if (x_mean.shape != (input_dim,) or x_scale.shape != (input_dim,)
            or not np.isfinite(values).all() or (x_scale <= 0).any()
            or standardisation.y_scale <= 0):
        raise fail("standardisation does not match the inputs or is not finite and positive")
    return standardisation


def _regions(record: dict[str, Any], tensors: dict[str, torch.Tensor], input_dim: int,
             num_regions: int, fail) -> Regions:
    """The partition of a file: cut values per active dimension, face indices per region."""
    active_dims = [int(d) for d in record["active_dims"]]
    cut_names = {k for k in tensors if k.startswith("cuts.")}
    if cut_names != {f"cuts.{d}" for d in active_dims}:
        raise fail(f"cut tensors {sorted(cut_names)} do not match active dimensions "
                   f"{active_dims}")
    cuts = [tensors[f"cuts.{d}"] for d in active_dims]
    if any(c.dim() != 1 or c.numel() == 0 for c in cuts):
        raise fail("cut values must be non-empty vectors")
    lower = torch.tensor(record["lower_index"], dtype=torch.long)
    upper = torch.tensor(record["upper_index"], dtype=torch.long)
    if lower.shape != (num_regions, len(active_dims)) or upper.shape != lower.shape:
        raise fail(f"face indices have shapes {list(lower.shape)} and {list(upper.shape)}, "
                   f"expected [{num_regions}, {len(active_dims)}]")
    counts = torch.tensor([c.numel() for c in cuts], dtype=torch.long)
    if (bool(((lower < -1) | (lower >= counts) | (upper < -1) | (upper >= counts)).any())
            or bool(((lower >= 0) & (upper >= 0) & (lower >= upper)).any())
            or (not active_dims and num_regions != 1)):
        raise fail("face indices do not describe boxes over the cut values")
    # Regions checks the active dimensions and that cuts increase (ValueError → invalid record)
    return Regions(input_dim, active_dims, cuts, lower, upper)
