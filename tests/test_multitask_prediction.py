"""Predictions of the multitask models: the Gaussian mixture (spec T12), the data-units
predictor against exact single-layer predictions and against ``pyro.infer.Predictive`` draws,
all tasks at arbitrary inputs (T8), ArviZ, the saved state and the ARD weights."""

import json
import math

import matplotlib
import numpy as np
import pytest
import torch
from pyro.infer import Predictive
from pyrogp_models.inference.trainer import TrainConfig, train

from multitask_helpers import randomise, toy_data, toy_model
from pyrogp_models import arviz_bridge
from pyrogp_models.models.multitask import (
    MultitaskGP,
    MultitaskPredictor,
    joint_components,
    mixture_log_density,
    mixture_moments,
    plot_ard_weights,
    toy_grid,
)

matplotlib.use("Agg")


# T12 ------------------------------------------------------------------------------------------
def test_a_mixture_of_identical_components_is_that_gaussian():
    mean, var = torch.randn(7), torch.rand(7) + 0.1
    means, variances = mean.expand(50, 7), var.expand(50, 7)
    mixed_mean, mixed_var = mixture_moments(means, variances)
    assert torch.allclose(mixed_mean, mean, rtol=1e-14) and torch.allclose(mixed_var, var)
    y = torch.randn(7)
    log_density = torch.distributions.Normal(means, variances.sqrt()).log_prob(y)
    assert torch.allclose(mixture_log_density(log_density), log_density[0], rtol=1e-12)


def test_mixture_moments_and_density_of_distinct_components():
    generator = torch.Generator().manual_seed(0)
    means, variances = torch.randn(40, 9, generator=generator), torch.rand(40, 9) + 0.05
    mean, var = mixture_moments(means, variances)
    draws = torch.distributions.Normal(means, variances.sqrt()).sample((4000,)).flatten(0, 1)
    assert torch.allclose(mean, draws.mean(0), atol=4 * float((var / len(draws)).sqrt().max()))
    y = torch.randn(9, generator=generator)
    log_density = torch.distributions.Normal(means, variances.sqrt()).log_prob(y)
    mixture = mixture_log_density(log_density)
    assert torch.allclose(mixture.exp(), log_density.exp().mean(0), rtol=1e-12)
    assert bool((-mixture <= -log_density.mean(0)).all())          # Jensen


# The predictor --------------------------------------------------------------------------------
def test_single_layer_predictions_are_exact_and_in_data_units_per_task():
    model = randomise(toy_model("igp", gap=(0.3, 0.6)))
    _, standardisation = toy_data(gap=(0.3, 0.6))
    predictor = MultitaskPredictor(model, standardisation)
    X, tasks = torch.rand(6, 1), torch.tensor([0, 1, 0, 1, 1, 0])
    X_model = standardisation.transform_x(X)
    layer = model.top.layer
    with torch.no_grad():
        mean, var = layer.marginals(X_model.expand(2, 1, 6, 1))       # every task everywhere
    own = tasks, torch.arange(6)
    scale = torch.as_tensor(standardisation.task_y_scale)[tasks]
    shift = torch.as_tensor(standardisation.task_y_mean)[tasks]
    noise = model.likelihood.variance.detach()[tasks]
    y_mean, y_var = predictor.predict_y(X, tasks)
    assert torch.allclose(y_mean, mean[:, 0][own] * scale + shift, rtol=1e-12)
    assert torch.allclose(y_var, (var[:, 0][own] + noise) * scale**2, rtol=1e-12)
    y = torch.randn(6)
    expected = torch.distributions.Normal(y_mean, y_var.sqrt()).log_prob(y)
    assert torch.allclose(predictor.log_predictive(X, y, tasks), expected, rtol=1e-10)


def test_every_task_is_predicted_at_common_inputs_with_shared_draws_tied():
    model = randomise(toy_model("mmdgp", q_scale=0.3))
    X = torch.rand(11, 1)
    latent, mean, _ = joint_components(model, X, num_samples=5)
    shared = model.latent.shared_width
    assert latent.shape == (5, 2, 11, model.latent.width) and mean.shape == (5, 2, 11)
    assert torch.equal(latent[:, 0, :, :shared], latent[:, 1, :, :shared])
    assert not torch.equal(latent[:, 0, :, shared:], latent[:, 1, :, shared:])
    predictor = MultitaskPredictor(model, toy_data()[1], num_samples=20)
    y_mean, y_var = predictor.predict_tasks(X)
    assert y_mean.shape == y_var.shape == (2, 11)
    for task in range(2):
        single = predictor.predict_y(X, torch.full((11,), task))[0]
        assert torch.allclose(y_mean[task], single, rtol=0.2, atol=0.2)


@pytest.mark.parametrize("kind", ["mmdgp", "cmdgp", "cgp"])
def test_predictive_draws_match_predict_y(kind):
    model = toy_model(kind, gap=(0.3, 0.6))
    train(model, config=TrainConfig(lr=0.05, steps=40, tol=None))
    predictor = MultitaskPredictor(model, toy_data(gap=(0.3, 0.6))[1], num_samples=20000)
    X, tasks = torch.tensor([[0.1], [0.45], [0.45], [0.9]]), torch.tensor([0, 1, 0, 1])
    predictive = Predictive(model.predictive_model, guide=model.predictive_guide,
                            num_samples=6000, parallel=True)
    with torch.no_grad():
        draws = predictive(predictor.standardisation.transform_x(X), tasks)
    draws = predictor.to_data_units(draws[f"{model._pyro_name}.y"], tasks)
    mean, var = predictor.predict_y(X, tasks)
    se_mean = (var / 6000 + var / predictor.num_samples).sqrt()
    assert bool(((draws.mean(0) - mean).abs() < 4 * se_mean).all())
    centred = draws - draws.mean(0)
    se_var = ((centred**4).mean(0) - centred.square().mean(0) ** 2).sqrt() / math.sqrt(6000)
    assert bool(((draws.var(0) - var).abs() < 4 * se_var).all())


@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto")
def test_inference_data_that_arviz_summarises():
    model = toy_model("smdgp")
    train(model, config=TrainConfig(lr=0.05, steps=30, tol=None))
    data, standardisation = toy_data()
    predictor = MultitaskPredictor(model, standardisation, num_samples=300)
    X = standardisation.x_mean + standardisation.x_scale * data.X.numpy()
    y = standardisation.inverse_task_mean(data.y, data.task)
    idata = predictor.to_inference_data(X, y, labels=data.task, num_samples=200)
    for group in ("posterior", "posterior_predictive", "log_likelihood", "observed_data"):
        assert arviz_bridge.group(idata, group) is not None
    posterior = arviz_bridge.group(idata, "posterior")
    assert posterior["f"].shape == (1, 200, len(y))
    assert posterior["hidden"].shape == (1, 200, len(y), model.latent.width)
    assert len(arviz_bridge.summary(idata, var_names=["f"])) == len(y)
    loo = arviz_bridge.loo(idata)
    exact = float(predictor.log_predictive(X, y, data.task).sum())
    assert loo.elpd_loo + loo.p_loo == pytest.approx(exact, abs=0.05 * abs(exact) + 2.0)


# State and ARD ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["mmdgp", "cmdgp", "igp"])
def test_the_state_rebuilds_the_model_and_predictor(kind):
    model = randomise(toy_model(kind, q_scale=0.3, likelihood_options={"variance": 0.2}))
    predictor = MultitaskPredictor(model, toy_data()[1], num_samples=30)
    config, tensors = predictor.to_state()
    config = json.loads(json.dumps(config))
    assert not any(key.startswith("data_") for key in tensors)     # no data in the state
    rebuilt = MultitaskPredictor.from_state(config, tensors)
    X, tasks = np.random.default_rng(0).uniform(size=(5, 1)), [0, 1, 1, 0, 1]
    for before, after in zip(predictor.predict_y(X, tasks), rebuilt.predict_y(X, tasks),
                             strict=True):
        assert torch.equal(before, after)
    data, _ = toy_data()
    bound = MultitaskGP.from_state(*model.to_state(), data=data)
    assert type(bound) is type(model) and bound.options == model.options
    if model.is_deep:
        noise = torch.randn(2, len(data.y), model.latent.noise_width)
        assert float(bound.elbo(noise=noise)) == float(model.elbo(noise=noise))


def test_ard_weights_are_inverse_squared_lengthscales_and_plot():
    model = toy_model("mmdgp", inner_width=4)
    with torch.no_grad():
        model.top.layer.kernel.lengthscale = torch.tensor([[[0.5, 1.0, 2.0, 4.0]],
                                                           [[1.0, 1.0, 1.0, 1.0]]])
    weights = model.ard_weights()
    assert torch.allclose(weights, torch.tensor([[4.0, 1.0, 0.25, 0.0625], [1.0] * 4]))
    ax = plot_ard_weights(weights, shared_columns=model.latent.shared_width)
    assert len(ax.patches) == 8
    X_grid, _ = toy_grid(5)
    assert X_grid.shape == (5, 1)
