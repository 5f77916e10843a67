"""ArviZ conversion of a module's draws: shapes, and draws that agree with the closed forms."""

import numpy as np
import pytest
import torch
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.metrics import pit_uniformity
from pyrogp_models.inference.trainer import TrainConfig

from pyrogp_models import arviz_bridge
from pyrogp_models.data.partitioners import partition_random


@pytest.fixture(scope="module")
def regression_module():
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, size=(200, 1))
    y = 3.0 + 2.0 * np.sin(X[:, 0]) + 0.3 * rng.standard_normal(200)
    fit = fit_local((X, y, partition_random(200, 1, 0)), LocalFitSpec(num_inducing=10),
                    TrainConfig(steps=500, lr=0.05))
    X_test = rng.uniform(0, 5, size=(80, 1))
    y_test = 3.0 + 2.0 * np.sin(X_test[:, 0]) + 0.3 * rng.standard_normal(80)
    return fit.modules["part000"], X_test, y_test


def test_groups_and_shapes(regression_module):
    module, X, y = regression_module
    idata = module.to_inference_data(X, y, num_samples=300)
    assert arviz_bridge.group(idata, "posterior")["f"].shape == (1, 300, 80)
    assert arviz_bridge.group(idata, "posterior")["u"].shape == (1, 300, 1, 10)
    assert arviz_bridge.group(idata, "posterior_predictive")["y"].shape == (1, 300, 80)
    assert arviz_bridge.group(idata, "log_likelihood")["y"].shape == (1, 300, 80)
    assert np.allclose(arviz_bridge.group(idata, "observed_data")["y"], y)


def test_draws_agree_with_closed_form_predictive(regression_module):
    module, X, y = regression_module
    idata = module.to_inference_data(X, y, num_samples=4000, seed=1)
    f = arviz_bridge.group(idata, "posterior")["f"].values[0]
    mean, var = module.predict_f(X)
    s = module.standardisation
    assert np.allclose(f.mean(0), s.inverse_y_mean(mean).numpy(), atol=0.05)
    assert np.allclose(f.var(0), s.inverse_y_var(var).numpy(), rtol=0.15, atol=1e-3)
    # lppd = Σ_i log mean_s p(y_i | f_s) from the pointwise draws estimates the closed-form
    # Σ_i log N(y_i | m_i, v_i + σ²) (≈ -20.9 here); its Monte Carlo error over draw seeds is
    # ≈ 0.02, so 0.1 is 5 standard errors: a log-likelihood off by a Jacobian (80 log 1.52), a
    # noise variance used as a standard deviation or the predictive variance in place of σ²
    # misses it by far more.
    loo = arviz_bridge.loo(idata)
    exact = module.log_predictive(X, y).sum().item()
    assert loo.elpd_loo + loo.p_loo == pytest.approx(exact, abs=0.1)
    pointwise = arviz_bridge.group(idata, "log_likelihood")["y"].values[0]
    np.testing.assert_allclose(np.log(np.exp(pointwise).mean(0)).sum(), exact, atol=0.1)
    assert loo.elpd_loo < exact  # leaving points out can only cost density
    assert 0.5 < loo.p_loo < 10  # effective parameters: a smooth fit of 10 inducing values


def test_posterior_predictive_pit_is_uniform_for_a_well_specified_model(regression_module):
    module, X, y = regression_module
    idata = module.to_inference_data(X, y, num_samples=2000)
    draws = arviz_bridge.group(idata, "posterior_predictive")["y"].values[0]
    pit = (draws < y).mean(0)
    assert pit_uniformity(pit) < 0.2
    assert pit_uniformity(np.full_like(pit, 0.99)) > 0.5  # the statistic can fail


def test_classifier_draws_are_labels():
    rng = np.random.default_rng(1)
    X = rng.uniform(-3, 3, size=(150, 1))
    y = (rng.uniform(size=150) < 1 / (1 + np.exp(-2 * X[:, 0]))).astype(float)
    fit = fit_local((X, y, partition_random(150, 1, 0)),
                    LocalFitSpec(num_inducing=6, likelihood="bernoulli"),
                    TrainConfig(steps=200))
    idata = fit.modules["part000"].to_inference_data(X, y, num_samples=200)
    draws = arviz_bridge.group(idata, "posterior_predictive")["y"].values
    assert set(np.unique(draws)) <= {0.0, 1.0}
    log_lik = arviz_bridge.group(idata, "log_likelihood")["y"].values
    assert np.all(log_lik <= 0)
    assert torch.is_tensor(fit.modules["part000"].q_mean)
