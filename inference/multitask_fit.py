"""Fit a multitask (deep) GP: ``fit_multitask_dgp(data, spec, config) -> MultitaskFit``.

The data — a list of per-task pairs [(X^t, y^t)], a long-format triple (X, task, y) or a
:class:`~pyrogp_models.models.multitask.TaskData` — are put in one order (by task, input and
target: :meth:`~pyrogp_models.models.multitask.TaskData.in_canonical_order`, so that a fit
depends on the rows and not on their order), standardised (inputs over all tasks,
Gaussian targets per task), the model named by ``spec.model`` is initialised from them (k-means
inducing inputs, M per process from the tasks' rows, fixed linear inner means) and trained with
the library's trainer (:func:`pyrogp_models.inference.trainer.train`):

- a single-layer model (iGP, cGP) whose ELBO is deterministic (full batch, closed-form or
  quadrature expectations) by L-BFGS until its ELBO stops changing (with a Gaussian likelihood
  on Titsias' collapsed bound, q(u) at its optimum; iGP's tasks, independent problems, each
  with its own L-BFGS memory and step length); with a Monte Carlo objective by Adam, with
  natural-gradient steps on q(u) unless the likelihood's expectation is itself Monte Carlo;
- a deep model (sMDGP, mMDGP, iDGP, cMDGP) first fits the shallow model it contains (iGP; cGP for
  cMDGP) that way, starts from it (:func:`~pyrogp_models.models.multitask.warm_start.embed_shallow`:
  the same predictions, the inner layer at its prior) and trains by Adam — with
  natural-gradient steps on the top layer's q(u) where the likelihood is Gaussian — until the
  change of its estimated ELBO is within its Monte Carlo noise, or until a window of steps ends
  with its ELBO, estimated precisely (:func:`estimate_elbo`), below the best window end's,
  returning to that window's parameters (under a fixed learning rate the loss can rise for
  hundreds of steps and settle higher). An mMDGP
  whose shared process has a free column starts first with the latent of the task with the most
  rows in it (:func:`~pyrogp_models.models.multitask.warm_start.embed_transfer`), so that the
  other tasks can learn their outputs as functions of it, and from the shallow model only if
  that ends below it. Every deep ELBO is estimated precisely (:func:`estimate_elbo`, common random
  numbers) and compared with the embedded shallow model's (where the embedding is not exact,
  with more inputs than a process's width, the shallow fit's own): the best state is kept, so a
  deep fit never ends below the shallow model it contains.

A default cGP compares two ranks on more than two tasks and, with a Gaussian likelihood, each
with correlated and with independent noise (:func:`default_candidates`), and fits to all rows
the one that predicts hidden stretches of the outputs best, refitted without them, each output
weighted by its gaps (:func:`~pyrogp_models.inference.multitask_held_out.held_out_error`;
where no model has a closed-form q(u) optimum, it fits every rank and keeps the higher ELBO).
The fit records every phase (model, steps, seconds, converged, ELBO, held-out error where
computed), the final ELBO and what a constant per task scores
(:func:`constant_log_likelihood`); a fit whose ELBO is no higher warns
(:class:`~pyrogp_models.errors.ConstantFitWarning`). The predictor works in data units and
takes the task of every point as ``labels``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace

import torch
from pyrogp_models.inference.fit_result import Fit
from pyrogp_models.inference.multitask_held_out import HELD_OUT_FOLDS, held_out_error
from pyrogp_models.inference.natural_gradient import NaturalGradient
from pyrogp_models.inference.train_config import (
    COLLAPSED_CONFIG,
    MULTITASK_DEEP_CONFIG,
    MULTITASK_SHALLOW_CONFIG,
    MULTITASK_UNCOLLAPSED_CONFIG,
    TrainConfig,
)
from pyrogp_models.inference.trainer import TrainResult, train
from tqdm import tqdm

from pyrogp_models.errors import (
    CandidateDroppedWarning,
    CholeskyError,
    ConstantFitWarning,
    DataError,
    NotConvergedWarning,
)
from pyrogp_models.likelihoods import LIKELIHOODS, monte_carlo_expectation
from pyrogp_models.models.multitask import (
    MultitaskGP,
    MultitaskOptions,
    MultitaskPredictor,
    TaskData,
    TaskStandardisation,
    as_task_data,
    build_model,
)
from pyrogp_models.models.multitask.options import DEFAULT_COREGIONAL_RANK
from pyrogp_models.models.multitask.warm_start import (
    CONTAINED,
    SWITCHED_OFF,
    embed_shallow,
    embed_transfer,
    source_task,
    transfer_column,
)

#: Draws of the latent space per row for the precise ELBO of a deep model.
ELBO_SAMPLES = 64
#: Unit natural-gradient steps on the top layer's q(u) after a transfer start (which leaves it at
#: the prior) before training.
TRANSFER_NATURAL_STEPS = 5
#: The relative change of the loss over a window at which the fits of the held-out folds stop:
#: their predictions settle long before the bound (air quality's first stretch, four
#: candidates: 1e-4 gave the same held-out errors to four digits as the default 1e-7 in 80 % of
#: the time; gilgai's 4 × 365 rows at M = 100: 1e-3 the same as 1e-4 for three candidates and
#: 0.4165 against 0.4151 for the fourth, in 86 %).
HELD_OUT_TOL = 1e-3
#: The most steps of a held-out fold's fit. The cGP fits of the real sets in
#: ``benchmarks/multitask_experiments.py`` converge in 6–40 steps, except on a short table of
#: many outputs (grunfeld: 20 years, 11 firms), where a fit walks a ray — a lengthscale, the
#: mixing weights and a noise correlation growing together — for hundreds of steps, its bound
#: and predictions barely changing; a step of a correlated-noise cGP on 800 rows (macro) takes
#: a second. Measured with correlated noise and 3 folds, 20 steps against 50: macro's second
#: stretch (R = 2) 4.328 against 4.336 in 58 % of the time, grunfeld's first (R = 2, R = 11)
#: 1.418 and 2.391 against 1.404 and 2.661 in 65 % and 49 %; the candidates ranked alike.
#: A step of L-BFGS is up to 20 iterations, and at 1e-3 most folds stop within 5: 5 steps
#: against 20 (the real section rerun, 2026-11-30) kept the same candidate on 20 of 21
#: stretches and on El Niño's second a better one (R = 2 for R = 12, 0.409 against 0.468 training
#: sd); a default fit took 0.31 (grunfeld), 0.44 (macro), 0.53 (El Niño), 0.62 (danish) and
#: 0.8 (air quality) of the time, timed side by side on one stretch of each.
HELD_OUT_STEPS = 5
#: What a held-out fold's fit can raise on the rows it keeps where the fit to all rows need not
#: (a fifth of every task's rows fewer can leave two outputs exact linear copies where both are
#: observed, or a factorisation failing): the candidate is then dropped, with a warning.
FOLD_FAILURES = (DataError, CholeskyError, FloatingPointError, torch.linalg.LinAlgError)
#: Samples × rows × inducing points evaluated at once by :func:`estimate_elbo`.
CHUNK_ELEMENTS = 2**22


@dataclass
class MultitaskSpec(MultitaskOptions):
    """What to fit: the model (``"smdgp"``, ``"mmdgp"``, ``"cmdgp"``, ``"idgp"``, ``"igp"`` or
    ``"cgp"``), its architecture (:class:`MultitaskOptions`: likelihood, widths, M, S, batch size
    and minibatch scheme, q_scale, …), how to initialise the inducing inputs (``"kmeans"`` or
    ``"grid"``), whether a deep model starts from the shallow model it contains and keeps the
    better of the two (``warm_start``), the mixture components of the predictor and the
    tensors' dtype and device."""

    model: str = "cgp"
    inducing_init: str = "kmeans"
    warm_start: bool = True
    predictive_samples: int = 200
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"

    def options(self) -> MultitaskOptions:
        """The architecture part of the spec."""
        return MultitaskOptions(**{f.name: getattr(self, f.name)
                                   for f in fields(MultitaskOptions)})


@dataclass
class Phase:
    """One training phase of a fit: the model kind trained (with what sets it apart where a
    default cGP compares candidates, ``"cgp (R = 4, independent noise)"``:
    :func:`default_candidates`), its optimiser steps, wall seconds, whether it converged, its
    ELBO at the end (:func:`estimate_elbo`; None for a candidate not kept, which is fitted to
    its held-out folds only, with 0 steps and seconds), where candidates were compared by it
    its held-out error (:func:`held_out_error`) and, where its loss rose, the step whose
    parameters it returned to (``TrainConfig.patience``)."""

    model: str
    steps: int
    seconds: float
    converged: bool
    elbo: float | None
    held_out: float | None = None
    returned_to: int | None = None


@dataclass
class MultitaskFit(Fit):
    """:class:`Fit` (the trained model, its record, the predictor, the standardisation) with the
    spec, the training data in model units (in canonical order), the final ELBO
    (:func:`estimate_elbo`), the phases of the fit, which state was kept (``spec.model``, or the
    contained shallow model's kind when the deep fit ended below it: the model then holds that
    embedding, or is the shallow model itself where the embedding is not exact), the wall
    seconds of the whole fit (training, ELBO estimates, the candidates' held-out errors) and the
    log likelihood of the best constant per task (:func:`constant_log_likelihood`), which the
    ELBO of a fit that learnt anything exceeds."""

    spec: MultitaskSpec
    data: TaskData
    elbo: float = math.nan
    phases: list[Phase] = field(default_factory=list)
    kept: str = ""
    seconds: float = math.nan
    constant_log_likelihood: float = math.nan

    @property
    def training_seconds(self) -> float:
        """Wall seconds of the phases' training."""
        return sum(phase.seconds for phase in self.phases)

    @property
    def steps(self) -> int:
        """Optimiser steps of all phases."""
        return sum(phase.steps for phase in self.phases)

    @property
    def converged(self) -> bool:
        """Whether every phase converged."""
        return all(phase.converged for phase in self.phases)

    def summary(self) -> dict:
        """The final ELBO, the constant per task's log likelihood, kept state, total steps,
        seconds (in all and of training) and every phase (JSON-able)."""
        return {"elbo": self.elbo, "constant_log_likelihood": self.constant_log_likelihood,
                "kept": self.kept, "steps": self.steps,
                "seconds": self.seconds, "training_seconds": self.training_seconds,
                "converged": self.converged,
                "phases": [asdict(phase) for phase in self.phases]}


def deterministic_objective(spec: MultitaskOptions, model: str) -> bool:
    """Whether ``model``'s ELBO is computed exactly: no inner layer, full batch, a likelihood
    with a closed-form or quadrature expectation."""
    if model not in CONTAINED.values() or spec.batch_size is not None:
        return False
    return not monte_carlo_expectation(spec.likelihood, spec.likelihood_options)


def collapsible(spec: MultitaskSpec) -> bool:
    """Whether ``spec`` is a single-layer model with a Gaussian likelihood on all rows: q(u) has
    a closed-form optimum, so it trains on the collapsed bound and has a held-out error."""
    return deterministic_objective(spec, spec.model) and spec.likelihood == "gaussian"


def default_config(spec: MultitaskSpec) -> TrainConfig:
    """How ``spec.model`` trains by default (see the module docstring; the settings and the
    measurements behind them are in :mod:`~pyrogp_models.inference.train_config`):

    - iGP with a Gaussian likelihood on all rows: its collapsed bound per task
      (:meth:`MultitaskGP.collapsed_bound`) by the batched L-BFGS of the local fits, one memory
      and one step length per task, then pinned
      (:data:`~pyrogp_models.inference.train_config.COLLAPSED_CONFIG`); q(u) set to its optimum
      at the end;
    - another deterministic single-layer objective: L-BFGS (strong Wolfe) — with a Gaussian
      likelihood (cGP) on the collapsed bound over the joint q of its latent GPs
      (:data:`~pyrogp_models.inference.train_config.MULTITASK_SHALLOW_CONFIG`), q(u) set to its
      optimum at the end; with another likelihood, q(u) among the parameters
      (:data:`~pyrogp_models.inference.train_config.MULTITASK_UNCOLLAPSED_CONFIG`);
    - otherwise Adam with a change test on the mean loss of windows of steps and a return to
      the best window end's parameters once a window ends below it by the precisely estimated
      ELBO (:func:`estimate_elbo`)
      (:data:`~pyrogp_models.inference.train_config.MULTITASK_DEEP_CONFIG`), with
      natural-gradient steps on q(u): γ = 1 for a single-layer model whose likelihood has a
      deterministic expectation (with minibatches), none where it is a Monte Carlo estimate (a
      softmax: a non-conjugate step is kept only where it raises the objective, and two estimates
      with different draws say little about that; on scikit-learn's digits, 3 tasks of 300
      images, iGP ended 73–146 nats higher without them and cGP 77, at a lower held-out log
      loss, in 40–84 % of the time); 0.1 on a deep model's top layer where the likelihood is
      Gaussian."""
    if collapsible(spec):
        return COLLAPSED_CONFIG if spec.model == "igp" else MULTITASK_SHALLOW_CONFIG
    if deterministic_objective(spec, spec.model):
        return MULTITASK_UNCOLLAPSED_CONFIG
    config = MULTITASK_DEEP_CONFIG
    if spec.model in CONTAINED.values():
        if monte_carlo_expectation(spec.likelihood, spec.likelihood_options):
            return config
        return replace(config, natural_gradient_lr=1.0)
    if spec.likelihood == "gaussian":
        return replace(config, natural_gradient_lr=0.1)
    return config


@torch.no_grad()
def estimate_elbo(model: MultitaskGP, num_samples: int = ELBO_SAMPLES, seed: int = 0) -> float:
    """The ELBO (eq. 9) on all rows: exact for a deterministic single-layer model; otherwise
    the mean of ``num_samples`` draws of the latent space per row (fixed by ``seed``: the same
    draws for two states of one model are common random numbers) and, for a Monte Carlo
    likelihood, of as many evaluations."""
    generator = torch.Generator(device=model.data_X.device).manual_seed(seed)
    batch = model.full_batch()
    if not model.is_deep:
        if not model.likelihood.stochastic:
            return float(model.elbo(batch))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return float(torch.stack([model.elbo(batch) for _ in range(num_samples)]).mean())
    per_sample = batch.rows.numel() * model.top.layer.num_inducing * model.num_latent
    chunk = max(1, CHUNK_ELEMENTS // per_sample)
    total = 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, num_samples, chunk):
            count = min(chunk, num_samples - start)
            noise = model.draw_noise(count, batch.rows.shape, model.data_X, generator)
            total = total + count * model.data_terms(batch, _per_row(noise, batch)).sum()
    return float(total / num_samples - model.kl())


def _per_row(noise: torch.Tensor, batch) -> torch.Tensor:
    """Draws on the [T, P] layout → per data row [S, N, W] (what ``data_terms`` indexes)."""
    rows = torch.zeros(noise.shape[0], int(batch.rows.max()) + 1, noise.shape[-1],
                       dtype=noise.dtype, device=noise.device)
    rows[:, batch.rows] = noise
    return rows


def fit_multitask_dgp(data, spec: MultitaskSpec | None = None,
                      config: TrainConfig | None = None) -> MultitaskFit:
    """Standardise, build ``spec.model`` and train it on the ELBO of Boustati et al. (eq. 9);
    ``data`` is a list of per-task pairs [(X^t [N^t, D], y^t [N^t])], a long-format triple
    (X [N, D], task [N], y [N]) or a :class:`TaskData`. ``config`` replaces the default training
    of ``spec.model`` (:func:`default_config`); the contained shallow model of a warm start always
    trains by its own default. Warns (:class:`~pyrogp_models.errors.ConstantFitWarning`) where
    the final ELBO is no higher than a constant per task scores. See the module docstring."""
    fit = _fit(data, spec, config)
    constant = constant_log_likelihood(fit.model, fit.data)
    if fit.elbo <= constant:
        warnings.warn(ConstantFitWarning(
            f"the fit's ELBO {fit.elbo:.6g} is no higher than the log likelihood of a constant "
            f"per task ({constant:.6g}): it has learnt nothing from the inputs",
            fit.elbo, constant), stacklevel=2)
    return replace(fit, constant_log_likelihood=constant)


def constant_log_likelihood(model: MultitaskGP, data: TaskData) -> float:
    """Σ_t max_θ Σ_{n: t_n = t} log p(y_n | θ): the log likelihood of the best constant per task
    (:meth:`~pyrogp_models.likelihoods.base.Likelihood.constant_log_likelihood` of ``model``'s
    likelihood; ``data`` in model units), what a fit that ignores its inputs scores."""
    return float(sum(model.likelihood.constant_log_likelihood(data.y[data.task == task])
                     for task in data.task.unique()))


def _fit(data, spec: MultitaskSpec | None, config: TrainConfig | None) -> MultitaskFit:
    """:func:`fit_multitask_dgp` without the constant per task."""
    started = time.perf_counter()
    spec = spec or MultitaskSpec()
    config = config or default_config(spec)
    if spec.likelihood not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood '{spec.likelihood}'; "
                         f"choose from {sorted(LIKELIHOODS)}")
    tasks = as_task_data(data, spec.dtype, spec.device).in_canonical_order()
    standardisation = TaskStandardisation.from_data(
        tasks, LIKELIHOODS[spec.likelihood].standardise_targets)
    model_data = standardisation.transform(tasks)
    seed = 0 if config.seed is None else config.seed
    options = spec.options().with_inducing_for(
        torch.bincount(model_data.task, minlength=model_data.num_tasks).tolist())
    spec = replace(spec, num_inducing=options.num_inducing)
    candidates = default_candidates(spec, model_data.num_tasks)
    if len(candidates) > 1:
        return replace(_best_candidate(tasks, model_data, candidates, config, seed),
                       seconds=time.perf_counter() - started)
    model = _build(spec, model_data, seed)
    if not (model.is_deep and spec.warm_start):
        result = _train(model, config, seed)
        phases = [_phase(model, result, seed)]
        kept, elbo = spec.model, phases[0].elbo
    else:
        model, result, phases, kept, elbo = _fit_from_shallow(model, model_data, spec, config,
                                                              seed)
    predictor = MultitaskPredictor(model, standardisation, spec.predictive_samples, seed)
    return MultitaskFit(model, result, predictor, standardisation, spec, model_data, elbo, phases,
                        kept, time.perf_counter() - started)


def default_candidates(spec: MultitaskSpec, num_tasks: int) -> list[MultitaskSpec]:
    """The fits a default cGP compares by their held-out error (:func:`held_out_error`):

    - where the rank is not given and there are more than 2 tasks, R = 2 latent GPs of M
      inducing inputs each, and a latent GP per task (R = T) with as many inducing values in
      all, ⌈2M/T⌉ per latent GP, at k-means centres of the inputs (fixed unless
      ``learn_inducing`` says otherwise): few shared latent GPs squeeze outputs that move on
      their own, many can carry noise from one output into another;
    - where the noise is not given and can be correlated (a Gaussian likelihood on all rows,
      more than one task), each with the noise correlated across the outputs at one input and
      independent: a correlation of T outputs has T(T − 1)/2 parameters, which a short table
      of many outputs cannot pin down.

    ``spec`` alone otherwise."""
    if spec.model != "cgp":
        return [spec]
    ranks = [spec]
    if spec.coregional_rank is None and num_tasks > DEFAULT_COREGIONAL_RANK:
        per_latent = math.ceil(DEFAULT_COREGIONAL_RANK * spec.num_inducing / num_tasks)
        learn = False if spec.learn_inducing is None else spec.learn_inducing
        ranks = [replace(spec, coregional_rank=DEFAULT_COREGIONAL_RANK),
                 replace(spec, coregional_rank=num_tasks, num_inducing=per_latent,
                         learn_inducing=learn)]
    if spec.noise is not None or num_tasks < 2 or not spec.correlated_noise_fits(spec.model):
        return ranks
    return [replace(rank, noise=noise) for rank in ranks
            for noise in ("correlated", "independent")]


def _best_candidate(tasks: TaskData, data: TaskData, candidates: list[MultitaskSpec],
                    config: TrainConfig, seed: int) -> MultitaskFit:
    """The fit of the candidate that predicts hidden stretches best (:func:`held_out_error` of
    ``data``, model units, every fold fitted as the candidate is: :func:`_fold_fitter`), fitted
    to all rows (``tasks``) alone; every other candidate has a phase with its held-out error and
    no steps or ELBO (nor a held-out error where a fold's fit failed: :data:`FOLD_FAILURES`; if
    every candidate's did, the first failure is raised); ``config.progress`` shows one bar over
    the candidates' folds. Where q(u) has no closed-form optimum
    (a likelihood other than Gaussian, or minibatches), every candidate is fitted and the
    higher ELBO kept, with every fit's phases."""
    if not collapsible(candidates[0]):
        fits = [_fit(tasks, candidate, config) for candidate in candidates]
        best = max(fits, key=lambda fit: fit.elbo)
        return replace(best, phases=[replace(phase, model=f"{phase.model} ({_label(fit.spec)})")
                                     for fit in fits for phase in fit.phases])
    errors, failures = [], []
    with tqdm(total=len(candidates) * HELD_OUT_FOLDS, disable=not config.progress,
              desc="held-out folds", leave=False) as bar:
        for done, candidate in enumerate(candidates, 1):
            bar.set_postfix_str(_label(candidate))
            try:
                errors.append(held_out_error(data, _fold_fitter(candidate, config, seed,
                                                                on_fit=bar.update), seed=seed))
            except FOLD_FAILURES as failure:
                errors.append(None)
                failures.append(failure)
                warnings.warn(f"candidate {_label(candidate)} dropped: a fit to its held-out "
                              f"folds failed ({failure})", CandidateDroppedWarning, stacklevel=2)
            bar.update(done * HELD_OUT_FOLDS - bar.n)  # fewer folds on few inputs, or failed
    if len(failures) == len(candidates):
        raise failures[0]
    kept = candidates[errors.index(min(error for error in errors if error is not None))]
    best = _fit(tasks, kept, config)
    phases = []
    for candidate, error in zip(candidates, errors, strict=True):
        label = f"{candidate.model} ({_label(candidate)})"
        if candidate is kept:
            phases += [replace(phase, model=label, held_out=error) for phase in best.phases]
        else:
            phases.append(Phase(label, 0, 0.0, True, None, held_out=error))
    return replace(best, phases=phases)


def _label(spec: MultitaskSpec) -> str:
    """"R = 4, independent noise": what sets a candidate apart (its rank, and its noise where
    the noise is compared)."""
    noise = f", {spec.noise} noise" if spec.noise is not None else ""
    return f"R = {spec.coregional_rank or DEFAULT_COREGIONAL_RANK}{noise}"


def _fold_fitter(spec: MultitaskSpec, config: TrainConfig, seed: int,
                 on_fit: Callable[[], object] | None = None
                 ) -> Callable[[TaskData], MultitaskGP]:
    """Fits of ``spec`` to the rows of a held-out fold: to :data:`HELD_OUT_TOL` in at most
    :data:`HELD_OUT_STEPS` (a fold's fit that stops there scores the candidate; it warns of
    nothing, and shows no progress bar of its own), each followed by ``on_fit()``."""
    fold_config = replace(config, tol=HELD_OUT_TOL, steps=min(config.steps, HELD_OUT_STEPS),
                          progress=False)

    def fit_rows(rows: TaskData) -> MultitaskGP:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotConvergedWarning)
            model = _fitted(spec, rows, fold_config, seed)
        if on_fit is not None:
            on_fit()
        return model

    return fit_rows


def _build(spec: MultitaskSpec, data: TaskData, seed: int) -> MultitaskGP:
    """``spec.model`` initialised from ``data`` (model units)."""
    return build_model(spec.model, data, spec.options(), spec.inducing_init,
                       torch.Generator(device=spec.device).manual_seed(seed))


def _fitted(spec: MultitaskSpec, data: TaskData, config: TrainConfig, seed: int
            ) -> MultitaskGP:
    """A single-layer ``spec.model`` built and trained on ``data`` (model units)."""
    model = _build(spec, data, seed)
    _train(model, config, seed)
    return model


def _fit_from_shallow(model: MultitaskGP, data: TaskData, spec: MultitaskSpec,
                      config: TrainConfig, seed: int
                      ) -> tuple[MultitaskGP, TrainResult, list[Phase], str, float]:
    """Fit the shallow model that ``model`` contains, then train ``model`` from its starts
    (:func:`deep_starts`, each from the embedded shallow model with its inner variances
    switched off) in turn until one ends above that embedding (by :func:`estimate_elbo`, common
    random numbers); ``model`` is left in that start's state, or in the embedding if none does.
    Where the embedding is not exact (W_λ mixes inputs: more inputs than a process's width) it
    is not the shallow model (on the digits, 64 inputs through 10 columns: ELBO −4651 and chance
    accuracy against iGP's −1079 and 0.82), so a start must end above the shallow fit's own
    ELBO, and the shallow model itself is returned if none does. Returns the model kept, the
    last training's record, every phase, the kind of the state kept and its estimated ELBO."""
    shallow_spec = replace(spec, model=CONTAINED[spec.model], top_mean=None,
                           noise="independent")
    shallow = build_model(shallow_spec.model, data, shallow_spec.options(),
                          spec.inducing_init,
                          torch.Generator(device=spec.device).manual_seed(seed))
    shallow_config = replace(default_config(shallow_spec), seed=config.seed,
                             progress=config.progress)
    phases = [_phase(shallow, _train(shallow, shallow_config, seed), seed)]
    exact = embed_shallow(model, shallow, SWITCHED_OFF)
    reference, reference_elbo = _state(model), estimate_elbo(model, seed=seed)
    fallback, to_beat = ((shallow, phases[0].elbo) if not exact and phases[0].elbo >= reference_elbo
                         else (model, reference_elbo))
    for start in deep_starts(model):
        _start_deep(model, shallow, config, start)
        result = _train(model, config, seed)
        phases.append(_phase(model, result, seed))
        if phases[-1].elbo > to_beat:
            return model, result, phases, spec.model, phases[-1].elbo
        model.load_state_dict(reference)
    return fallback, result, phases, shallow.kind, to_beat


def deep_starts(model: MultitaskGP) -> tuple[str, ...]:
    """Where a deep model trains from, in turn: ``"transfer"`` (mMDGP with a free shared
    column, :func:`~pyrogp_models.models.multitask.warm_start.embed_transfer`), then
    ``"shallow"`` (the embedded shallow model, inner q(u) at the prior)."""
    return ("transfer", "shallow") if transfer_column(model) is not None else ("shallow",)


def _start_deep(model: MultitaskGP, shallow: MultitaskGP, config: TrainConfig, start: str
                ) -> None:
    """Put ``model`` at ``start`` (:func:`deep_starts`); after a transfer start its top q(u)
    takes :data:`TRANSFER_NATURAL_STEPS` unit natural-gradient steps when the training takes
    such steps."""
    if start == "shallow":
        embed_shallow(model, shallow)
        return
    embed_transfer(model, shallow, source_task(model.data_task, model.num_tasks))
    if config.natural_gradient_lr is not None:
        natural_step = NaturalGradient(model, 1.0)
        for _ in range(TRANSFER_NATURAL_STEPS):
            natural_step(lambda: -model.elbo())


def _state(model: MultitaskGP) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in model.state_dict().items()}


def _train(model: MultitaskGP, config: TrainConfig, seed: int) -> TrainResult:
    """:func:`train`; a model whose loss is a Monte Carlo estimate has the windows of
    ``config.patience`` judged by :func:`estimate_elbo` at their ends (the same draws, fixed by
    ``seed``, at every end: common random numbers); a collapsible model (single layer, Gaussian,
    all rows) trained by L-BFGS trains on its collapsed bound — the ELBO at the optimal q(u) for
    every hyperparameter, no natural-gradient step per evaluation — and ends with q(u) at that
    optimum."""
    if not (model.collapsible and config.optimizer == "lbfgs"):
        precise = (lambda: -estimate_elbo(model, seed=seed)) if model.noisy_objective else None
        return train(model, config=config, precise_loss=precise)
    with model.collapsed_objective():
        result = train(model, config=replace(config, natural_gradient_lr=None))
    NaturalGradient(model, 1.0)(lambda: -model.elbo())  # closed form: the loss is not evaluated
    return result


def _phase(model: MultitaskGP, result: TrainResult, seed: int) -> Phase:
    return Phase(model.kind, result.steps, result.seconds, result.converged,
                 estimate_elbo(model, seed=seed), returned_to=result.returned_to)
