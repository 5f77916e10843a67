"""Stretches of one output predicted from the rest: a held-out error at fitted hyperparameters.

A fitted single-layer multitask GP with a Gaussian likelihood (iGP, cGP) is scored by what it is
for — an output hidden over a region of the inputs, predicted from its own data elsewhere and
from the other outputs observed there. The rows of every task t are cut into B regions (k-means
clusters of its inputs: stretches of a series); for each region, the task's rows there leave the
bound data, q(v) moves to its optimum on the rest (one unit natural-gradient step: closed form,
from any q; the hyperparameters stay) and the hidden rows are predicted given the other
outputs at their sites (:func:`~.noise_correlation.condition_on_site`, whose rows are in the
fit):

    error = (1/T) Σ_t mean over t's hidden rows of (y − E[y | rest])²     (model units).

The hyperparameters have seen every row, so the error is optimistic for every model alike; it
ranks models by the gap, which their ELBOs need not.
"""

from __future__ import annotations

import torch
from pyrogp_models.inference.natural_gradient import NaturalGradient

from pyrogp_models.data.kmeans import kmeans, kmeans_assign
from pyrogp_models.models.multitask.data import TaskData
from pyrogp_models.models.multitask.model import MultitaskGP
from pyrogp_models.models.multitask.noise_correlation import SiteLayout, condition_on_site

#: Regions of every task's inputs hidden in turn.
HELD_OUT_REGIONS = 10


def task_regions(X: torch.Tensor, num_regions: int, generator: torch.Generator) -> torch.Tensor:
    """The region of every row (X [N, D]): k-means clusters of the rows' inputs [N]."""
    centres = kmeans(X, min(num_regions, len(X)), generator=generator)
    return kmeans_assign(X, centres)


def held_out_error(model: MultitaskGP, data: TaskData, num_regions: int = HELD_OUT_REGIONS,
                   seed: int = 0) -> float:
    """The mean over tasks of :func:`held_out_task_errors` (the error of the module
    docstring)."""
    return float(held_out_task_errors(model, data, num_regions, seed).mean())


def held_out_task_errors(model: MultitaskGP, data: TaskData,
                         num_regions: int = HELD_OUT_REGIONS, seed: int = 0) -> torch.Tensor:
    """The mean squared error of every task's hidden regions [T] (see the module docstring);
    ``data`` are the model's training data in model units. ``model`` is left as it was (state
    and bound data)."""
    if not model.collapsible:
        raise ValueError(f"a held-out error needs a single-layer {model.kind} with a Gaussian "
                         "likelihood on all rows")
    state = {key: value.clone() for key, value in model.state_dict().items()}
    sites = SiteLayout.of(data.X, data.task, data.num_tasks)
    outputs, observed = sites.gather(data.y)[sites.site], sites.mask[sites.site]
    generator = torch.Generator(device=data.X.device).manual_seed(seed)
    errors = []
    try:
        for task in range(data.num_tasks):
            rows = torch.nonzero(data.task == task).squeeze(-1)
            regions = task_regions(data.X[rows], num_regions, generator)
            task_errors = []
            for region in torch.unique(regions):
                hidden = rows[regions == region]
                keep = torch.ones_like(data.task, dtype=torch.bool)
                keep[hidden] = False
                model.bind(TaskData(data.X[keep], data.task[keep], data.y[keep],
                                    data.num_tasks))
                NaturalGradient(model, 1.0)(lambda: -model.elbo())
                with torch.no_grad():
                    mean, cov = model.top.joint_marginals(data.X[hidden])
                    others = observed[hidden].clone()
                    others[:, task] = False
                    mean, _ = condition_on_site(mean, cov, model.noise_covariance(), others,
                                                outputs[hidden])
                task_errors.append((mean[:, task] - data.y[hidden]).square())
            errors.append(torch.cat(task_errors).mean())
    finally:
        model.bind(data)
        model.load_state_dict(state)
    return torch.stack(errors)
