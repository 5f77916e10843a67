"""Builders shared by the multitask test modules: the paper's toy data in model units, small
models on it and non-trivial variational parameters."""

import torch

from pyrogp_models.layers import variational_layers
from pyrogp_models.models.multitask import (
    MultitaskGP,
    MultitaskOptions,
    TaskData,
    TaskStandardisation,
    build_model,
    toy_tasks,
)


def toy_data(num_points: int = 20, seed: int = 0, gap=None, likelihood: str = "gaussian"
             ) -> tuple[TaskData, TaskStandardisation]:
    """The toy example (two tasks) in model units, and its standardisation; Bernoulli labels
    are the signs of the standardised targets."""
    data = TaskData.from_list(toy_tasks(num_points, gap=gap, seed=seed))
    standardisation = TaskStandardisation.from_data(data)
    model_data = standardisation.transform(data)
    if likelihood == "bernoulli":
        model_data = TaskData(model_data.X, model_data.task, (model_data.y > 0).double(),
                              model_data.num_tasks)
    return model_data, standardisation


def toy_model(kind: str, num_points: int = 20, seed: int = 0, gap=None,
              **options) -> MultitaskGP:
    """``kind`` on the toy data with M = 5 per task unless ``options`` say otherwise."""
    data, _ = toy_data(num_points, seed, gap, options.get("likelihood", "gaussian"))
    return build_model(kind, data, MultitaskOptions(**{"num_inducing": 5, **options}))


@torch.no_grad()
def randomise(model: MultitaskGP, seed: int = 1, scale: float = 0.3) -> MultitaskGP:
    """Random whitened q(v) in every layer (means ~ N(0, 1), lower-triangular factors near
    ``scale``·I) and random likelihood variances, so identities are checked off the prior."""
    generator = torch.Generator().manual_seed(seed)
    for layer in variational_layers(model):
        mean = torch.randn(layer.q_mean.shape, generator=generator)
        noise = 0.1 * torch.randn(layer.q_sqrt.shape, generator=generator)
        diagonal = scale * (1.0 + torch.rand(layer.q_sqrt.shape[:-1], generator=generator))
        layer.set_whitened_posterior(mean, noise.tril(-1) + torch.diag_embed(diagonal))
    if model.likelihood.name == "gaussian":
        model.likelihood.variance = 0.05 + 0.1 * torch.rand(
            model.likelihood.variance.shape, generator=generator)
    return model
