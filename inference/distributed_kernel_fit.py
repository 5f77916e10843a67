"""Fitting a distributed-kernel GP with the library's trainer: Pyro SVI, or SVI on everything but q
with q solved in closed form (Gaussian likelihood, mean-field q).

``fit_distributed_kernel((X, y), spec, config)`` standardises the data (inputs, and the targets of
location–scale likelihoods), cuts one input into J regions at data quantiles (unless the spec
gives its own regions), builds a :class:`~pyrogp_models.models.distributed_kernel.model.
DistributedKernelGP` with the standardised data bound and trains it with
:func:`pyrogp_models.inference.trainer.train`. Two schemes, both maximising the mean-field (or
joint) ELBO:

- ``method="svi"``: Pyro's ``TraceMeanField_ELBO`` of ``model``/``guide`` over all parameters
  (q, Z, ℓ, σ_f², likelihood, cuts); any likelihood; minibatches via ``batch_size``.
- ``method="solve"`` (Gaussian, mean-field, full batch; the default there): before every
  optimiser step the pre-step hook :class:`ConjugateGradientSolve` moves q towards its optimum for
  the current (θ, Z, cuts) by warm-started preconditioned conjugate gradients (O(n m) per
  iteration after one O(n m²) projection), and the optimiser steps on (θ, Z, cuts) along the
  gradient of the ELBO at that q. At the optimum ∂ELBO/∂q = 0, so this is the gradient of the
  collapsed mean-field bound (envelope theorem): the optimiser never has to chase q. After
  training one more solve, checked and run to tolerance, sets q to the optimum.

The initial lengthscale (standardised units) is min(1, range/(2·MIN_WIDTH·J)) along the cut
dimension, so that every region starts at least MIN_WIDTH = 2 lengthscales wide (narrower regions
are not local: the window at the centre of a region of width W is 2Φ(W/ℓ) − 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from pyrogp_models.inference.fit_result import Fit
from pyrogp_models.inference.train_config import DISTRIBUTED_KERNEL_CONFIG, TrainConfig
from pyrogp_models.inference.trainer import TrainResult, train

from pyrogp_models.data import Standardisation, require_finite
from pyrogp_models.data.columns import Columns
from pyrogp_models.errors import DataError
from pyrogp_models.gaussian.linalg import DEFAULT_JITTER
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.models.distributed_kernel.backfitting import solve_meanfield
from pyrogp_models.models.distributed_kernel.construct import build_distributed_kernel_gp
from pyrogp_models.models.distributed_kernel.files import DistributedKernelPredictor
from pyrogp_models.models.distributed_kernel.halo import DEFAULT_EPS
from pyrogp_models.models.distributed_kernel.model import VARIATIONAL, DistributedKernelGP
from pyrogp_models.models.distributed_kernel.regions import Regions, split_dimension

METHODS = ("solve", "svi")
#: Each region starts at least this many initial lengthscales wide.
MIN_WIDTH = 2.0
#: Warm-started CG iterations per training step of the ``"solve"`` scheme. The checked solve to
#: 10⁻⁷ it replaced took ~24 per step on a chirp (n = 2·10⁴, J = m = 16); 15 reach its ELBO after
#: 100 steps to 10⁻⁵ relative, at about 0.9× its cost per step.
HOOK_ITERATIONS = 15
#: Relative CG residual ‖b − Hm‖/‖b‖ at which a solve stops (the hook freezes, the final solve
#: returns).
SOLVE_TOL = 1e-7
#: The training defaults (a warning says when the step limit stops a fit first):
#: :data:`~pyrogp_models.inference.train_config.DISTRIBUTED_KERNEL_CONFIG`.
DEFAULT_TRAIN_CONFIG = DISTRIBUTED_KERNEL_CONFIG


@dataclass
class DistributedKernelSpec:
    """What to fit (see :class:`~pyrogp_models.models.distributed_kernel.model.
    DistributedKernelGP`).

    ``num_regions`` J and ``num_inducing`` m per region; the regions cut input ``dim`` (default:
    the one with the largest range) at data quantiles, or are the given ``regions``
    (standardised units, J of them). ``lengthscale`` is the initial ℓ in standardised units
    (default: the module docstring's heuristic, or 1 with given regions). ``likelihood_options``
    are options or initial parameter values (e.g. the Gaussian ``variance``, standardised).
    ``method`` is ``"solve"`` or ``"svi"`` (default: solve for a Gaussian likelihood with
    mean-field q and full batches, else svi). ``columns`` (the data's feature and target names,
    units) and ``info`` label the predictor.
    """

    num_regions: int
    num_inducing: int
    dim: int | None = None
    variational: str = "meanfield"
    likelihood: str = "gaussian"
    likelihood_options: dict = field(default_factory=dict)
    ard: bool = False
    method: str | None = None
    batch_size: int | None = None
    halo_eps: float = DEFAULT_EPS
    jitter: float = DEFAULT_JITTER
    learn_inducing: bool = True
    regions: Regions | None = None
    lengthscale: float | torch.Tensor | None = None
    columns: Columns = field(default_factory=Columns)
    info: dict | None = None
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"

    def __post_init__(self):
        if self.num_regions < 1 or self.num_inducing < 1:
            raise ValueError(f"num_regions and num_inducing must be positive, got "
                             f"{self.num_regions} and {self.num_inducing}")
        if self.variational not in VARIATIONAL:
            raise ValueError(f"unknown variational family '{self.variational}'; choose from "
                             f"{VARIATIONAL}")
        if self.likelihood not in LIKELIHOODS:
            raise ValueError(f"unknown likelihood '{self.likelihood}'; choose from "
                             f"{sorted(LIKELIHOODS)}")
        if self.regions is not None and self.regions.num_regions != self.num_regions:
            raise ValueError(f"the given regions are {self.regions.num_regions}, not "
                             f"num_regions = {self.num_regions}")
        solvable = (self.likelihood == "gaussian" and self.variational == "meanfield"
                    and self.batch_size is None)
        if self.method is None:
            self.method = "solve" if solvable else "svi"
        if self.method not in METHODS:
            raise ValueError(f"unknown fitting method '{self.method}'; choose from {METHODS}")
        if self.method == "solve" and not solvable:
            raise ValueError("method='solve' needs a Gaussian likelihood, mean-field q and full "
                             "batches; use method='svi'")


@dataclass
class DistributedKernelFit(Fit):
    """:class:`~pyrogp_models.inference.fit_result.Fit` of a distributed-kernel GP: ``model`` is the
    trained :class:`DistributedKernelGP` with its standardised data bound and ``predictor`` a
    :class:`DistributedKernelPredictor` of it."""

    model: DistributedKernelGP
    predictor: DistributedKernelPredictor


class ConjugateGradientSolve:
    """A pre-step hook of :func:`pyrogp_models.inference.trainer.train`: q(v) of a mean-field
    Gaussian :class:`DistributedKernelGP` moved towards its optimum for the current θ, Z and cuts by
    ``iterations`` warm-started CG iterations (:func:`solve_meanfield`, unchecked: nothing is read
    back to the host). The projections it solves with are computed with gradients and kept for the
    step's loss (:meth:`DistributedKernelGP.keep_projections`), so a step projects the data once.
    ``parameters`` are the layer's variational parameters, which the optimiser then leaves
    alone."""

    def __init__(self, model: DistributedKernelGP, iterations: int = HOOK_ITERATIONS,
                 tol: float = SOLVE_TOL):
        if model.variational != "meanfield" or model.likelihood.name != "gaussian":
            raise ValueError("the conjugate-gradient solve needs mean-field q and a Gaussian "
                             "likelihood")
        if model.batch_size is not None:
            raise ValueError("the conjugate-gradient solve uses all data; minibatches need SVI")
        self.model = model
        self.iterations = iterations
        self.tol = tol
        self.parameters = model.layer.variational_parameters()

    def __call__(self, loss_fn) -> None:
        X, y = self.model.bound_data()
        projections = self.model.projections(X)
        solve_meanfield(self.model, X, y, max_iters=self.iterations, tol=self.tol,
                        projections=projections, checked=False)
        self.model.keep_projections(projections)


def fit_distributed_kernel(data, spec: DistributedKernelSpec,
                           config: TrainConfig | None = None) -> DistributedKernelFit:
    """Fit a distributed-kernel GP to ``data = (X [N, D], y [N])`` in data units (numpy or
    torch); see the module docstring. Problems with the data raise :class:`DataError`."""
    X, y, standardisation = model_data(*data, spec)
    model = build_model(X, y, spec)
    result = train_distributed_kernel(model, spec.method, config)
    with torch.no_grad():
        elbo = float(model.elbo())
    predictor = DistributedKernelPredictor(model, standardisation, len(y), elbo, spec.info,
                                           spec.columns)
    return DistributedKernelFit(model, result, predictor, standardisation)


def train_distributed_kernel(model: DistributedKernelGP, method: str,
                             config: TrainConfig | None = None) -> TrainResult:
    """Train a model with its data bound, in place, by ``method`` (module docstring): ``"svi"``,
    or ``"solve"``: the :class:`ConjugateGradientSolve` hook before every step and a checked
    solve to :data:`SOLVE_TOL` after the last."""
    config = config or DEFAULT_TRAIN_CONFIG
    if method not in METHODS:
        raise ValueError(f"unknown fitting method '{method}'; choose from {METHODS}")
    if method == "solve" and config.natural_gradient_lr is not None:
        raise ValueError("method='solve' sets q itself; natural_gradient_lr needs method='svi'")
    hooks = [ConjugateGradientSolve(model)] if method == "solve" else []
    result = train(model, config=config, hooks=hooks)
    if method == "solve":
        solve_meanfield(model, *model.bound_data(), tol=SOLVE_TOL)
    return result


def model_data(X, y, spec: DistributedKernelSpec
               ) -> tuple[torch.Tensor, torch.Tensor, Standardisation]:
    """Validated inputs [N, D] and targets [N] in model units as tensors of the spec's dtype and
    device, and the standardisation fitted on them."""
    X = np.asarray(torch.as_tensor(X).cpu(), dtype=np.float64)
    y = np.asarray(torch.as_tensor(y).cpu(), dtype=np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise DataError(f"expected inputs [N, D] and targets [N], got shapes {X.shape} and "
                        f"{y.shape}")
    require_finite(X, "inputs")
    require_finite(y, "targets")
    if spec.num_regions > len(y):
        raise DataError(f"{spec.num_regions} regions are more than the {len(y)} data points")
    standardisation = Standardisation.fit(X, y, LIKELIHOODS[spec.likelihood].standardise_targets)

    def as_tensor(values) -> torch.Tensor:
        return torch.as_tensor(values, dtype=spec.dtype, device=spec.device)

    return (as_tensor(standardisation.transform_x(X)), as_tensor(standardisation.transform_y(y)),
            standardisation)


def build_model(X: torch.Tensor, y: torch.Tensor, spec: DistributedKernelSpec
                ) -> DistributedKernelGP:
    """The unfitted model on standardised data, (X, y) bound: J regions cut at quantiles along
    one input (or the spec's regions), m inducing inputs on a grid over each region's points."""
    dim, lengthscale = None, spec.lengthscale
    if spec.regions is None:
        dim = cut_dimension(X, spec)
        if lengthscale is None:
            lengthscale = initial_lengthscale(X[:, dim], spec.num_regions)
    elif lengthscale is None:
        lengthscale = 1.0
    model = build_distributed_kernel_gp(
        X, spec.num_regions, spec.num_inducing, y, lengthscale=lengthscale,
        likelihood=spec.likelihood, variational=spec.variational, ard=spec.ard,
        regions=spec.regions, dim=dim, learn_inducing=spec.learn_inducing,
        min_width=MIN_WIDTH, jitter=spec.jitter, halo_eps=spec.halo_eps,
        batch_size=spec.batch_size, likelihood_options=spec.likelihood_options)
    model.likelihood.validate_targets(y)
    return model


def cut_dimension(X: torch.Tensor, spec: DistributedKernelSpec) -> int:
    """The input to cut: ``spec.dim``, or the one with the largest range; it must vary."""
    input_dim = X.shape[1]
    if spec.dim is not None and not 0 <= spec.dim < input_dim:
        raise DataError(f"dim {spec.dim} is not an input dimension (0 to {input_dim - 1})")
    dim = split_dimension(X, X.new_ones(1)) if spec.dim is None else spec.dim
    if spec.num_regions > 1 and bool(X[:, dim].min() == X[:, dim].max()):
        features = spec.columns.features
        name = f"column '{features[dim]}'" if features else f"input {dim}"
        raise DataError(f"{name} is constant and cannot be cut into regions")
    return dim


def initial_lengthscale(x: torch.Tensor, num_regions: int) -> float:
    """min(1, range/(2·MIN_WIDTH·J)) of the cut input x [N] (standardised), 1 for one region."""
    if num_regions == 1:
        return 1.0
    return min(1.0, float(x.max() - x.min()) / (2 * MIN_WIDTH * num_regions))
