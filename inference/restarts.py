"""Hyperparameter restarts as extra members of one batched fit.

A sparse GP's bound has several optima: a long lengthscale with a large noise that calls every
fast structure noise (on the Mauna Loa CO2 series a single partition settles there from the
rule's start, 2.1 ppm held-out error, with the seasonal cycle as "noise"), or the one that
explains the structure.
Which one a fit reaches depends on its start. With R restarts every partition is fitted from R
starts at once — R members of one batched model, each a copy of the partition's data — and the
start whose bound is highest after a screening fit (the earliest within :data:`MARGIN`) is
fitted again from its start, alone.

The starts (:func:`local_restart_scales`): the library's rule (:mod:`~pyrogp_models.models.
local.initialisation`), whose lengthscale is about the spacing of the inducing inputs, then
lengthscales (and periods not given) longer by up to the factor :data:`LONGEST` with initial
Gaussian noise smaller by up to :data:`QUIETEST`, spread evenly in log scale. On the CO2 series
the last start (ℓ × 4, noise × 0.01) finds the seasonal optimum (bound 3620 against 1147); a
short-lengthscale start loses itself in the trace term of the sparse bound. A composite kernel's
last start has its lengthscales at least at the inputs' spread, where its long terms belong: on
CO2 with whole summers held out (one partition, M = 300, ``rbf + periodic(period=1) * rbf + rq
+ white``) the rule's starts settle at a seasonal envelope of 1.5 years (bound 4684, held-out
RMSE 0.62 ppm), the spread's at 150 years (bound 4878, 0.41 ppm; scikit-learn's exact GP 0.40).
Exact experts have no trace term and start from the other side (:func:`exact_restart_scales`):
the rule's lengthscale (1 in standardised units, about a third of the inputs' range), then
shorter ones down to :data:`~pyrogp_models.inference.train_config.SPACING_MULTIPLE` times the
inputs' spacing. On CO2 the rule's start settles on the trend (12 years, 2.1 ppm held-out error)
and the short one on the seasonal optimum (0.29 years, log marginal likelihood 3622 against 1147
for one exact GP).
Values the user gave are kept in every start.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
from pyrogp_models.inference.train_config import SPACING_MULTIPLE, TrainConfig
from pyrogp_models.inference.trainer import TrainResult, train

from pyrogp_models.data.partitioners import Partition
from pyrogp_models.errors import CholeskyError, NotConvergedWarning, UnboundedBoundError
from pyrogp_models.gaussian.linalg import deferred_checks
from pyrogp_models.kernels import Kernel, Product, Sum
from pyrogp_models.models.local.initialisation import spreads_per_lengthscale

#: The longest restart lengthscale, relative to the rule's.
LONGEST = 4.0
#: The smallest restart noise, relative to the rule's (10 % of each partition's variance).
QUIETEST = 1e-2
#: A later start is kept only when its bound beats every earlier start's by more than this
#: (relative): starts that reach one optimum tie, and rounding (float32 against float64, another
#: batch composition) cannot swap the winner between them.
MARGIN = 1e-4
#: The screen fits each partition on at most this many of its rows (a random subset, the same for
#: every start); the winning start is then fitted on all of them. On 10⁶ rows in one partition a
#: screen of every row took the three starts (three copies of the data) over 12 minutes, where
#: one start fits in about one.
SCREEN_ROWS = 2000
#: The screen's convergence test: the bound changing by less than this (relative) over the
#: window, the :data:`MARGIN` that decides between starts, where the fit itself goes on to 1e-6.
#: On 10⁶ rows in 5000 partitions (M_k = 3) the screen took 370 L-BFGS steps to 1e-6 (225 s)
#: and 90 to 1e-4 (55 s); 11 partitions changed their winner, 8 of them to a start that ends at
#: the same bound and 3 lower by 0.2–0.3 nats (of about 130). On the seasonal series of
#: ``benchmarks/seasonal.py`` it picks the same starts, but for log AirPassengers with the
#: default M, where it picks the start whose continued fit ends higher (122.5 against 115.0).
SCREEN_TOL = MARGIN


def best_start(values: torch.Tensor) -> torch.Tensor:
    """The first start [...] whose bound in ``values`` [..., R] is within :data:`MARGIN`
    (relative) of the highest."""
    top = values.max(-1, keepdim=True).values
    near = values >= top - MARGIN * top.abs().clamp_min(1.0)
    return near.to(torch.int8).argmax(-1)  # the first True


def replaces(bound: float, best: float) -> bool:
    """Whether a later start's final ``bound`` replaces the ``best`` so far under
    :func:`best_start`'s rule: it is higher by more than :data:`MARGIN` (relative); a NaN bound
    counts as −∞."""
    bound, best = (-math.inf if math.isnan(value) else value for value in (bound, best))
    return best < bound - MARGIN * max(abs(bound), 1.0)


FitFromStart = Callable[[Kernel], tuple[torch.nn.Module, TrainResult]]


def best_fit(starts: Sequence[Kernel], fit_from: FitFromStart, what: str = "the kernel"
             ) -> tuple[torch.nn.Module, TrainResult]:
    """The fit from the start with the highest final bound, fitted in turn: a later start replaces
    the best so far only if it ends higher by more than the restart margin (:func:`replaces`),
    and the loser is freed at once. A start whose bound turns out unbounded, or whose K_** has no
    Cholesky factor (a long lengthscale in float32), is skipped with a warning naming ``what``
    while another start fits; when none does, the first start's error is raised."""
    best, error = None, None
    for start in starts:
        try:
            fit = fit_from(start)
        except (UnboundedBoundError, CholeskyError) as failed:
            error = error or failed
            continue
        if best is None:
            best = fit
            continue
        if replaces(-fit[1].final_loss, -best[1].final_loss):
            best = fit
    if best is None:
        raise error
    if error is not None:
        warnings.warn(f"a start of {what} was skipped: {error}", stacklevel=2)
    return best


def number_of_starts(asked: int | None, default: int) -> int:
    """The starts asked for (at least one), else ``default``."""
    if asked is None:
        return default
    if asked < 1:
        raise ValueError(f"restarts must be at least 1, got {asked}")
    return asked


def restart_scales(restarts: int, last_lengthscale: float | torch.Tensor = LONGEST
                   ) -> torch.Tensor:
    """[..., R, 2] factors on the rule's (lengthscale, noise) for each start: (1, 1) first, then
    evenly in log scale to (``last_lengthscale`` [...], :data:`QUIETEST`)."""
    steps = torch.linspace(0.0, 1.0, restarts, dtype=torch.float64)
    lengthscales = torch.as_tensor(last_lengthscale, dtype=torch.float64).unsqueeze(-1) ** steps
    return torch.stack([lengthscales, (QUIETEST ** steps).expand_as(lengthscales)], -1)


def local_restart_scales(restarts: int, kernel: Kernel, partition: Partition,
                         num_inducing: list[int], dims: int) -> torch.Tensor:
    """[K, R, 2] starts of local fits: :func:`restart_scales` to :data:`LONGEST`; for a
    composite kernel the last start's lengthscales are at least the inputs' spread
    (:func:`~pyrogp_models.models.local.initialisation.spreads_per_lengthscale` times the
    rule's), where the long terms — a trend, a seasonal envelope — start. The factor is one per
    partition, for all ``dims`` input dimensions: a leaf on fewer of them starts below its
    spread."""
    longest = torch.full((partition.num_partitions,), LONGEST, dtype=torch.float64)
    if isinstance(kernel, Sum | Product):
        spread = spreads_per_lengthscale(
            torch.as_tensor(num_inducing, dtype=torch.float64),
            torch.as_tensor(partition.sizes, dtype=torch.float64), dims)
        longest = torch.maximum(longest, spread)
    return restart_scales(restarts, longest)


def input_spacing(X: torch.Tensor) -> float:
    """The inputs' typical spacing: the median of range_d / N^(1/D) over the D non-constant
    columns of X [N, ·] (inf when every column is constant: no shorter start)."""
    ranges = X.amax(0) - X.amin(0)
    ranges = ranges[ranges > 0]
    if not len(ranges):
        return float("inf")
    return float((ranges / X.shape[0] ** (1.0 / len(ranges))).median())


def exact_restart_scales(restarts: int, X: torch.Tensor, lengthscale: float) -> torch.Tensor:
    """[R, 2] starts of exact experts around the rule's ``lengthscale``: (1, 1) first, then
    evenly in log scale to a lengthscale of
    :data:`~pyrogp_models.inference.train_config.SPACING_MULTIPLE` × the spacing of X [N, D]
    (never longer than the rule's) with noise × :data:`QUIETEST`."""
    shortest = min(1.0, SPACING_MULTIPLE * input_spacing(X) / lengthscale)
    return restart_scales(restarts, shortest)


def screen(build: Callable[..., torch.nn.Module], X: torch.Tensor, y: torch.Tensor,
           partition: Partition, inducing: list[torch.Tensor], starts: torch.Tensor,
           config: TrainConfig) -> torch.Tensor:
    """Fit every partition from its R ``starts`` [K, R, 2] (:func:`restart_scales`) as one
    batched model (``build(X, y, partition, inducing, start_scales, num_inducing)`` makes it) to
    the change test of ``config`` loosened to :data:`SCREEN_TOL`, without pinning and without
    reporting its convergence, on at most :data:`SCREEN_ROWS` rows of each partition
    (:func:`screening_rows`); returns the
    winning start per partition [K]. A start whose bound cannot be evaluated as the trainer
    evaluates it (a factorisation that fails without the jitter ladder: tiny noise on a very
    large partition) loses, and so does one whose bound ends above its likelihood's ceiling
    (:meth:`~pyrogp_models.models.local.local_gps.LocalGPs.possible`). The fit then starts
    afresh from each partition's winning start, so that its result does not depend on how the
    screen batched the partitions (its end points differ by rounding amplified along flat
    directions; its starts do not)."""
    K, R = starts.shape[:2]
    copies = np.arange(R)
    labels = np.asarray(partition.assignments)
    rows = screening_rows(labels, SCREEN_ROWS, config.seed or 0)
    if len(rows) < len(labels):
        kept = torch.as_tensor(rows, device=X.device)
        X, y, labels = X[kept], y[kept], labels[rows]
    assignments = (labels[None, :] * R + copies[:, None]).reshape(-1)
    repeated = Partition(assignments, {"kind": "random", "num_partitions": K * R})
    num_inducing = [len(inducing[k]) for k in range(K) for _ in copies]

    def screen_model_from(scales: torch.Tensor) -> torch.nn.Module:
        return build(X.repeat(R, *[1] * (X.dim() - 1)), y.repeat(R), repeated,
                     [inducing[k] for k in range(K) for _ in copies], scales, num_inducing)

    scales = starts.reshape(K * R, 2).clone()
    screen_model = screen_model_from(scales)
    failed = _unevaluable(screen_model).cpu()  # one read per fit; the scales live on the host
    if bool(failed.any()):  # such a start loses: it becomes a copy of the rule's, which ties
        scales[failed] = 1.0
        screen_model = screen_model_from(scales)
    if config.tol is not None:
        config = replace(config, tol=max(config.tol, SCREEN_TOL))
    with warnings.catch_warnings():  # only the continued fit's convergence is reported
        warnings.simplefilter("ignore", NotConvergedWarning)
        train(screen_model, config=config)
    screen_model.finalise()  # the collapsed bound's q(u) at its optimum: the ELBO is the bound
    return best_start(screen_model.possible(screen_model.elbo()).reshape(K, R)).cpu()


def screening_rows(labels: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """The rows a screen fits on, in their order: every row of a partition with at most
    ``limit`` rows, else ``limit`` of them drawn at random (``labels`` [N]: each row's
    partition)."""
    keys = np.random.default_rng(seed).random(len(labels))
    order = np.lexsort((keys, labels))  # by partition, in random order within each
    ordered = labels[order]
    rank = np.arange(len(order)) - np.searchsorted(ordered, ordered, side="left")
    return np.sort(order[rank < limit])


def _unevaluable(model: torch.nn.Module) -> torch.Tensor:
    """Which members [partition order] have a non-finite objective at their start, evaluated as
    the trainer evaluates it (factorisation checks deferred)."""
    with torch.no_grad(), deferred_checks():
        values = torch.cat([objective() for _, objective in model.member_objectives()])
    return ~torch.isfinite(torch.stack(model.partition_values(list(values))))
