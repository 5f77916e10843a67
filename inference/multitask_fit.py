"""Fit a multitask (deep) GP: ``fit_multitask_dgp(data, spec, config) -> MultitaskFit``.

The data — a list of per-task pairs [(X^t, y^t)], a long-format triple (X, task, y) or a
:class:`~pyrogp_models.models.multitask.TaskData` — are standardised (inputs over all tasks,
Gaussian targets per task), the model named by ``spec.model`` is initialised from them
(k-means inducing inputs per task, fixed linear inner means) and trained with the library's
trainer (:func:`pyrogp_models.inference.trainer.train`). By default (:func:`default_config`) the
deep models train by Adam, the paper's optimiser, judged converged when the change of their
estimated ELBO is within its Monte Carlo noise; the single-layer baselines iGP and cGP add unit
natural-gradient steps on q(u) (exact for a Gaussian iGP, safeguarded otherwise). The predictor
works in data units and takes the task of every point as ``labels``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from pyrogp_models.inference.fit_result import Fit
from pyrogp_models.inference.train_config import MULTITASK_CONFIG, TrainConfig
from pyrogp_models.inference.trainer import train

from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.models.multitask import (
    MultitaskOptions,
    MultitaskPredictor,
    TaskData,
    TaskStandardisation,
    as_task_data,
    build_model,
)


@dataclass
class MultitaskSpec(MultitaskOptions):
    """What to fit: the model (``"smdgp"``, ``"mmdgp"``, ``"cmdgp"``, ``"idgp"``, ``"igp"`` or
    ``"cgp"``), its architecture (:class:`MultitaskOptions`: likelihood, widths, M per task, S,
    batch size and minibatch scheme, q_scale, …), how to initialise the inducing inputs
    (``"kmeans"`` or ``"grid"``), the mixture components of the predictor and the tensors'
    dtype and device."""

    model: str = "smdgp"
    inducing_init: str = "kmeans"
    predictive_samples: int = 200
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"

    def options(self) -> MultitaskOptions:
        """The architecture part of the spec."""
        return MultitaskOptions(**{f.name: getattr(self, f.name)
                                   for f in fields(MultitaskOptions)})


@dataclass
class MultitaskFit(Fit):
    """:class:`Fit` (the trained model, its record, the predictor, the standardisation) with the
    spec and the training data in model units."""

    spec: MultitaskSpec
    data: TaskData


#: Models without an inner layer: their q(u) takes natural-gradient steps by default.
SINGLE_LAYER = ("igp", "cgp")


def default_config(spec: MultitaskSpec) -> TrainConfig:
    """Adam (lr 0.05, at most 1000 steps, tolerance 1e-6 over 50 steps); for iGP and cGP also a
    unit natural-gradient step on q(u) before each Adam step."""
    config = MULTITASK_CONFIG
    return replace(config, natural_gradient_lr=1.0) if spec.model in SINGLE_LAYER else config


def fit_multitask_dgp(data, spec: MultitaskSpec | None = None,
                      config: TrainConfig | None = None) -> MultitaskFit:
    """Standardise, build ``spec.model`` and train it on the ELBO of Boustati et al. (eq. 9);
    ``data`` is a list of per-task pairs [(X^t [N^t, D], y^t [N^t])], a long-format triple
    (X [N, D], task [N], y [N]) or a :class:`TaskData`. See the module docstring."""
    spec = spec or MultitaskSpec()
    config = config or default_config(spec)
    if spec.likelihood not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood '{spec.likelihood}'; "
                         f"choose from {sorted(LIKELIHOODS)}")
    tasks = as_task_data(data, spec.dtype, spec.device)
    standardisation = TaskStandardisation.from_data(
        tasks, LIKELIHOODS[spec.likelihood].standardise_targets)
    model_data = standardisation.transform(tasks)
    generator = torch.Generator(device=spec.device)
    generator.manual_seed(0 if config.seed is None else config.seed)
    model = build_model(spec.model, model_data, spec.options(), spec.inducing_init, generator)
    result = train(model, config=config)
    predictor = MultitaskPredictor(model, standardisation, spec.predictive_samples,
                                   0 if config.seed is None else config.seed)
    return MultitaskFit(model, result, predictor, standardisation, spec, model_data)
