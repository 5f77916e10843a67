"""Predictions of a multitask GP: the S-sample Gaussian mixture and a data-units predictor.

Drawing S samples of the latent space at x* and taking the top layer's marginal N(μ_s, σ_s²) for
each makes task t's predictive a mixture of S Gaussians (the DS-DGP convention; the paper is
silent). With p_s(y) = ∫ p(y | f) N(f | μ_s, σ_s²) df:

    mean = (1/S) Σ_s E_s[y],   variance = (1/S) Σ_s Var_s[y] + Var_s(E_s[y])   (total variance),
    log p(y) = logsumexp_s log p_s(y) − log S,

and class probabilities (1/S) Σ_s p_s(y = c). NLPD is −log p(y) of this mixture (not of a
moment-matched Gaussian, which differs). Single-layer models (iGP, cGP) have one component, and
their predictive is exact. Draws come from a seeded generator, so a predictor's answers are
reproducible; the latent space is evaluated in chunks of samples to bound memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pyrogp_models.models.multitask.data import TaskLayout
from pyrogp_models.models.multitask.model import MultitaskGP
from pyrogp_models.models.multitask.noise_correlation import condition_on_site
from pyrogp_models.models.multitask.standardisation import TaskStandardisation
from pyrogp_models.modules.predictor import Predictor

#: Samples × slots × inducing points × latent functions evaluated at once when predicting.
CHUNK_ELEMENTS = 2**22


def mixture_moments(means: torch.Tensor, variances: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of an equal-weight mixture of S components [S, ...]."""
    return means.mean(0), variances.mean(0) + means.var(0, unbiased=False)


def mixture_log_density(log_densities: torch.Tensor) -> torch.Tensor:
    """log (1/S) Σ_s p_s from log p_s [S, ...]."""
    return torch.logsumexp(log_densities, 0) - math.log(log_densities.shape[0])


@dataclass
class Components:
    """The S mixture components of q(f) at rows laid out per task: latent draws λ [S, T, P, D^λ],
    means and variances [S, T, P(, L)], and the layout of the rows."""

    latent: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor
    layout: TaskLayout


def components(model: MultitaskGP, X: torch.Tensor, tasks: torch.Tensor, num_samples: int,
               generator: torch.Generator | None = None) -> Components:
    """Mixture components at rows (X [N, D] in model units, tasks [N])."""
    layout = TaskLayout.of(tasks, model.num_tasks)
    return Components(*_evaluate(model, layout.gather(X, 1), num_samples, generator, False),
                      layout)


def joint_components(model: MultitaskGP, X: torch.Tensor, num_samples: int,
                     generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """λ, μ and σ² [S, T, N, …] of every task at X [N, D] (model units), with one draw of every
    shared process per point and sample for all tasks (joint across tasks)."""
    return _evaluate(model, X.unsqueeze(0), num_samples, generator, True)


def _evaluate(model: MultitaskGP, X: torch.Tensor, num_samples: int,
              generator: torch.Generator | None, tie_shared: bool):
    """λ, μ_f, σ_f² at the layout X [T', P, D], S samples, in chunks of samples."""
    shape = (model.num_tasks, X.shape[1])
    if not model.is_deep:
        return model.output_moments(X, None)
    per_sample = math.prod(shape) * model.top.layer.num_inducing * model.num_latent
    chunk = max(1, CHUNK_ELEMENTS // per_sample)
    parts = [model.output_moments(X, model.draw_noise(min(chunk, num_samples - start), shape, X,
                                                      generator, tie_shared))
             for start in range(0, num_samples, chunk)]
    return tuple(torch.cat(values) for values in zip(*parts, strict=True))


class MultitaskPredictor(Predictor):
    """Predictions of a multitask model in data units; ``labels`` are the task of every point.

    Args:
        model: the trained model (model units).
        standardisation: its inputs' and per-task targets' standardisation.
        num_samples: mixture components S (one for a single-layer model).
        seed: seed of the draws (every prediction uses the same).
        info: ``features`` and ``target`` names, when known.
    """

    def __init__(self, model: MultitaskGP, standardisation: TaskStandardisation,
                 num_samples: int = 200, seed: int = 0, info: dict | None = None):
        self.model = model
        self.standardisation = standardisation
        self.num_samples = num_samples
        self.seed = seed
        self.info = info or {}
        self.input_dim = model.input_dim
        reference = model.top.layer.q_mean
        self.dtype, self.device = reference.dtype, reference.device

    @property
    def num_tasks(self) -> int:
        return self.model.num_tasks

    def likelihood(self):
        """The model's likelihood, batched over tasks ([T] parameters)."""
        return self.model.likelihood

    # Rows and units -----------------------------------------------------------------------------
    def tasks(self, labels, num_points: int) -> torch.Tensor:
        """The task of every point [N] (all 0 for one task without labels)."""
        if labels is None:
            if self.num_tasks != 1:
                raise ValueError("pass the task of every point (labels=...) to a multitask "
                                 "predictor")
            return torch.zeros(num_points, dtype=torch.long, device=self.device)
        tasks = torch.as_tensor(labels, device=self.device).long().reshape(-1)
        if len(tasks) != num_points or bool(((tasks < 0) | (tasks >= self.num_tasks)).any()):
            raise ValueError(f"labels must give a task in 0..{self.num_tasks - 1} per point")
        return tasks

    def task_targets(self, y, tasks: torch.Tensor) -> torch.Tensor:
        """Validated targets in model units (standardised per task where the likelihood is
        location–scale)."""
        y = torch.as_tensor(y, dtype=self.dtype, device=self.device)
        self.likelihood().validate_targets(y)
        if self.likelihood().standardise_targets:
            return self.standardisation.transform_task_y(y, tasks)
        return y

    def to_data_units(self, values: torch.Tensor, tasks: torch.Tensor, var: bool = False
                      ) -> torch.Tensor:
        """Means or draws (``var``: variances) of standardised targets → data units."""
        if not self.likelihood().standardise_targets:
            return values
        if var:
            return self.standardisation.inverse_task_var(values, tasks)
        return self.standardisation.inverse_task_mean(values, tasks)

    def components(self, X, labels) -> Components:
        """The mixture components at X [N, D] (data units) for tasks ``labels``."""
        X = self.inputs(X)
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        with torch.no_grad():
            return components(self.model, self.standardisation.transform_x(X),
                              self.tasks(labels, len(X)), self.num_samples, generator)

    # Predictions --------------------------------------------------------------------------------
    def latent(self, X: torch.Tensor, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of the mixture q(f) [N(, L)], model units."""
        parts = self.components(X, labels)
        event = parts.mean.dim() - 3
        return tuple(parts.layout.to_long(value, event)
                     for value in mixture_moments(parts.mean, parts.var))

    def predict_y(self, X, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Mixture mean and variance of y in data units (class probabilities and p(1 − p) for
        classifiers)."""
        parts = self.components(X, labels)
        with torch.no_grad():
            means, variances = self.likelihood().predictive_moments(parts.mean, parts.var)
        event = means.dim() - 3
        mean, var = (parts.layout.to_long(value, event)
                     for value in mixture_moments(means, variances))
        tasks = parts.layout.tasks
        return self.to_data_units(mean, tasks), self.to_data_units(var, tasks, var=True)

    def log_predictive(self, X, y, labels=None) -> torch.Tensor:
        """log p(y_i | x_i) of the mixture per point [N], data units."""
        parts = self.components(X, labels)
        tasks = parts.layout.tasks
        targets = parts.layout.gather(self.task_targets(y, tasks))
        with torch.no_grad():
            log_density = mixture_log_density(
                self.likelihood().log_predictive(targets, parts.mean, parts.var))
        return parts.layout.to_long(log_density) - self.log_scale(tasks)

    def log_scale(self, tasks: torch.Tensor) -> torch.Tensor | float:
        """log s_{t_n}, by which densities of standardised targets shrink in data units."""
        if not self.likelihood().standardise_targets:
            return 0.0
        return self.standardisation.log_task_scale(tasks, self.model.top.layer.q_mean)

    def predict_tasks(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of y for every task at X [N, D] (data units): [T, N(, C)]."""
        X = self.inputs(X)
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        with torch.no_grad():
            _, means, variances = joint_components(
                self.model, self.standardisation.transform_x(X), self.num_samples, generator)
            mean, var = mixture_moments(*self.likelihood().predictive_moments(means, variances))
        tasks = torch.arange(self.num_tasks, device=self.device).unsqueeze(-1)
        if mean.dim() == 2:
            return self.to_data_units(mean, tasks), self.to_data_units(var, tasks, var=True)
        return mean, var

    def predict_given_outputs(self, X, Y, rows_in_fit: bool = False
                              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of y for every task at X [N, D] given the other outputs observed
        on the same row, Y [N, T] (NaN where not observed; data units): [T, N]
        (:func:`~.noise_correlation.condition_on_site`). The row's outputs are observations of
        f and of the noise: y ~ N(μ, Cov_q(f) + Σ) conditioned on them — the exact GP's
        predictive given the training rows and that row. ``rows_in_fit``: the rows were in the
        fit, so what their outputs say about f is in q(f) already and they inform the others
        through the noise they share alone (exact there; far off on rows the fit never saw,
        whose residuals are mostly f's error). Single-layer models (iGP, cGP)."""
        model = self.model
        if model.is_deep or model.likelihood.name != "gaussian":
            raise ValueError("predictions given the other outputs need a single-layer model "
                             f"(igp, cgp) with a Gaussian likelihood, not {model.kind} with "
                             f"{model.likelihood.name}")
        X = self.inputs(X)
        Y = torch.as_tensor(Y, dtype=self.dtype, device=self.device)
        if Y.shape != (len(X), self.num_tasks):
            raise ValueError(f"expected outputs of shape [{len(X)}, {self.num_tasks}], got "
                             f"{tuple(Y.shape)}")
        tasks = torch.arange(self.num_tasks, device=self.device)
        observed = ~torch.isnan(Y)
        with torch.no_grad():
            mean, cov = model.top.joint_marginals(self.standardisation.transform_x(X))
            noise = model.noise_covariance()
            if not rows_in_fit:
                cov, noise = torch.zeros_like(noise), cov + noise
            values = self.standardisation.transform_task_y(Y.nan_to_num(), tasks)
            mean, var = condition_on_site(mean, cov, noise, observed, values)
        return (self.to_data_units(mean.mT, tasks.unsqueeze(-1)),
                self.to_data_units(var.mT, tasks.unsqueeze(-1), var=True))

    # Pyro -------------------------------------------------------------------------------------
    def predictive_model(self, X: torch.Tensor, labels=None):
        """The model's :meth:`~MultitaskGP.predictive_model` at X (data units), sites named
        ``<layer>``, ``hidden``, ``f`` and ``y`` (model units)."""
        tasks = self.tasks(labels, len(X))
        return self.model.predictive_sites(self.standardisation.transform_x(X), tasks,
                                           lambda name: name)

    def predictive_guide(self, X: torch.Tensor, labels=None):
        for name, layer in self.model.variational_sites():
            layer.sample(name, posterior=True)

    def pointwise_draws(self, X, y, num_samples: int = 500, labels=None, seed: int = 0
                        ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """Posterior draws at the observed rows: latent sites (``f`` in data units for one
        latent function), posterior-predictive ``y`` [S, N] in data units and the pointwise
        log-likelihood log p(y_i | f_i) [S, N] under each row's task (with correlated noise,
        given the outputs of lower tasks at the row's site: the terms sum to the joint)."""
        tasks = self.tasks(labels, len(X))
        targets = self.task_targets(y, tasks)
        draws = self.posterior_draws(X, num_samples, labels, seed)
        f, y_draws = draws.pop("f"), draws.pop("y")
        with torch.no_grad():
            log_lik = (self.model.observation(f, self.inputs(X), tasks).log_prob(targets)
                       - self.log_scale(tasks))
        if f.dim() == 2:
            f = self.to_data_units(f, tasks)
        latents = {name.rsplit(".", 1)[-1]: value for name, value in draws.items()}
        return {**latents, "f": f}, self.to_data_units(y_draws, tasks), log_lik

    # State --------------------------------------------------------------------------------------
    def to_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """JSON-able config (the model's, the standardisation, S, seed, info) and tensors."""
        model_config, tensors = self.model.to_state()
        return ({"model": model_config, "standardisation": self.standardisation.to_dict(),
                 "num_samples": self.num_samples, "seed": self.seed, "info": self.info},
                tensors)

    @classmethod
    def from_state(cls, config: dict, tensors: dict[str, torch.Tensor]) -> MultitaskPredictor:
        """The predictor :meth:`to_state` described."""
        return cls(MultitaskGP.from_state(config["model"], tensors),
                   TaskStandardisation.from_dict(config["standardisation"]),
                   config["num_samples"], config["seed"], config["info"])
