"""Exact GP experts with shared hyperparameters (Cohen et al., ICML 2020, eq. 2), float64.

The reference is a textbook GP written here in numpy (Rasmussen & Williams 2006, Alg. 2.1).
"""

import math

import numpy as np
import pyro
import pytest
import torch
from pyrogp_models.inference.experts_fit import DEFAULT_TRAIN_CONFIG, ExpertsSpec, fit_exact_experts
from pyrogp_models.inference.trainer import TrainConfig, train

from pyrogp_models.data import Standardisation
from pyrogp_models.data.partitioners import partition_kmeans, partition_random
from pyrogp_models.models.experts import ExactExperts, grbcm_rows
from pyrogp_models.modules.files import module_from_bytes, module_to_bytes

LENGTHSCALE = np.array([0.7, 1.6])
VARIANCE, NOISE = 1.3, 0.05
TOL = dict(rtol=1e-8, atol=1e-10)


def rbf(a, b, lengthscale=LENGTHSCALE, variance=VARIANCE):
    d = (a[:, None, :] - b[None, :, :]) / lengthscale
    return variance * np.exp(-0.5 * (d**2).sum(-1))


def numpy_gp(X, y, Xs, noise=NOISE, **kernel):
    """Log marginal likelihood and latent predictive mean/variance of an exact GP."""
    K = rbf(X, X, **kernel) + noise * np.eye(len(X))
    L = np.linalg.cholesky(K)
    alpha = np.linalg.solve(L.T, np.linalg.solve(L, y))
    lml = -0.5 * y @ alpha - np.log(np.diag(L)).sum() - 0.5 * len(X) * math.log(2 * math.pi)
    Ks = rbf(X, Xs, **kernel)
    v = np.linalg.solve(L, Ks)
    return lml, Ks.T @ alpha, rbf(Xs, Xs, **kernel).diagonal() - (v**2).sum(0)


def data(n=80, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, 2))
    y = np.sin(2 * X[:, 0]) * np.cos(X[:, 1]) + 0.1 * rng.standard_normal(n)
    return X, y, rng.uniform(-3, 3, (50, 2))


def experts(X, y, partition, noise=NOISE):
    """Experts in model units with the fixed ARD hyperparameters above."""
    model = ExactExperts(torch.as_tensor(X), torch.as_tensor(y), partition, ard=True,
                         variance=VARIANCE, noise=noise)
    model.kernel.lengthscale = torch.as_tensor(LENGTHSCALE)
    return model


def test_one_partition_is_the_exact_gp():
    X, y, Xs = data()
    model = experts(X, y, partition_random(len(y), 1, 0))
    lml, mean, var = numpy_gp(X, y, Xs)
    np.testing.assert_allclose(model.log_marginal().item(), lml, **TOL)
    m, v = model.predict_f(torch.as_tensor(Xs))
    np.testing.assert_allclose(m[0].numpy(), mean, **TOL)
    np.testing.assert_allclose(v[0].numpy(), var, **TOL)


def test_batched_log_marginals_equal_separate_ones_with_gradients():
    X, y, _ = data(120)
    partition = partition_kmeans(X, 5, seed=1)
    assert len(set(partition.sizes.tolist())) > 1  # unequal sizes: padding is exercised
    model = experts(X, y, partition)
    batched = model.log_marginal()
    batched.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    separate = []
    for k in range(5):
        rows = partition.indices(k)
        np.testing.assert_allclose(batched[k].item(), numpy_gp(X[rows], y[rows], X[:1])[0],
                                   **TOL)
        single = experts(X[rows], y[rows], partition_random(len(rows), 1, 0))
        value = single.log_marginal().sum()
        value.backward()
        separate.append([p.grad for p in single.parameters()])
    for k, grad in enumerate(grads):
        np.testing.assert_allclose(grad.numpy(), sum(s[k] for s in separate).numpy(), **TOL)


def test_model_is_a_pyro_factor_with_an_empty_guide():
    X, y, _ = data(40)
    model = experts(X, y, partition_random(len(y), 4, 0))
    trace = pyro.poutine.trace(model.model).get_trace()
    site = trace.nodes[f"{model._pyro_name}.log_marginal"]
    assert site["type"] == "sample" and site["is_observed"]
    np.testing.assert_allclose(site["fn"].log_prob(site["value"]).item(),
                               model.log_marginal().sum().item(), **TOL)
    assert pyro.poutine.trace(model.guide).get_trace().stochastic_nodes == []


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_training_maximises_the_summed_log_marginal(optimizer):
    X, y, _ = data(90)
    model = experts(X, y, partition_random(len(y), 3, 0), noise=0.5)
    before = model.log_marginal().sum().item()
    config = (DEFAULT_TRAIN_CONFIG
              if optimizer == "lbfgs" else TrainConfig(lr=0.1, steps=100, tol=None))
    result = train(model, config=config)
    after = model.log_marginal().sum()
    assert after.item() > before + 10 and result.losses[-1] < result.losses[0]
    if optimizer == "lbfgs":
        assert result.converged and result.final_loss == pytest.approx(-after.item())
        after.backward()
        assert max(p.grad.abs().max().item() for p in model.parameters()) < 1e-4


@pytest.mark.parametrize("noise", [NOISE, 1e-8])
def test_exported_module_predicts_like_the_exact_gp(noise):
    X, y, Xs = data()
    partition = partition_random(len(y), 3, 0)
    model = experts(X, y, partition, noise=noise)
    standardisation = Standardisation(np.zeros(2), np.ones(2), 0.0, 1.0)
    modules = model.to_modules(standardisation)
    mean, var = model.predict_f(torch.as_tensor(Xs))
    tol = TOL if noise == NOISE else dict(rtol=1e-6, atol=1e-8)
    for k, module in enumerate(modules.values()):
        rows = partition.indices(k)
        assert module.num_inducing == len(rows) and module.info["partition"] == k
        reloaded = module_from_bytes(module_to_bytes(module))
        m, v = reloaded.predict_f(Xs)
        np.testing.assert_allclose(m.numpy(), mean[k].numpy(), **tol)
        np.testing.assert_allclose(v.numpy(), var[k].numpy(), **tol)
        _, ref_mean, ref_var = numpy_gp(X[rows], y[rows], Xs, noise=noise)
        np.testing.assert_allclose(m.numpy(), ref_mean, **tol)
        np.testing.assert_allclose(v.numpy(), ref_var, **tol)
        np.testing.assert_allclose(module.elbo, numpy_gp(X[rows], y[rows], Xs, noise)[0], **tol)


def test_fit_in_data_units_matches_the_exact_gp_in_model_units():
    X, y, Xs = data()
    X, y = 10.0 * X + 3.0, 5.0 * y - 2.0
    fit = fit_exact_experts((X, y, partition_random(len(y), 1, 0)), ExpertsSpec(ard=True),
                            TrainConfig(optimizer="lbfgs", lr=1.0, steps=5, window=1))
    (module,) = fit.modules.values()
    s = fit.standardisation
    Xm, ym, Xsm = s.transform_x(X), s.transform_y(y), s.transform_x(10.0 * Xs + 3.0)
    kernel = dict(lengthscale=fit.model.kernel.lengthscale.detach().numpy(),
                  variance=fit.model.kernel.variance.item())
    noise = fit.model.likelihood.variance.item()
    _, mean, var = numpy_gp(Xm, ym, Xsm, noise=noise, **kernel)
    y_mean, y_var = module.predict_y(10.0 * Xs + 3.0)
    np.testing.assert_allclose(y_mean.numpy(), mean * s.y_scale + s.y_mean, **TOL)
    np.testing.assert_allclose(y_var.numpy(), (var + noise) * s.y_scale**2, **TOL)
    assert module.info["partition_rule"] == "random" and fit.result.steps > 0


def test_grbcm_rows_add_the_communication_set_to_every_expert():
    partition = partition_random(30, 3, 0)
    rows, augmented = grbcm_rows(partition, 4, seed=0)
    communication = set(rows[augmented.assignments == 0].tolist())
    assert len(communication) == 4 and augmented.num_partitions == 4
    for j in range(1, 4):
        members = rows[augmented.assignments == j]
        own = set(partition.indices(j - 1).tolist()) - communication
        assert set(members.tolist()) == communication | own
        assert len(members) == len(communication | own)


def test_default_starts_find_the_seasonal_optimum_the_rule_misses():
    """A trend with a yearly cycle, sampled weekly for 40 years, every 5th week held out: from
    the rule's start alone (lengthscale a third of the range) the shared hyperparameters settle
    on the trend and call the season noise; the default starts include short lengthscales, keep
    the higher summed log marginal likelihood and predict the held-out weeks as well as linear
    interpolation does."""
    rng = np.random.default_rng(0)
    x = np.arange(0.0, 40.0, 7 / 365.25)
    y = 0.02 * (x - 20) ** 2 + 3 * np.sin(2 * np.pi * x) + 0.3 * rng.normal(size=x.size)
    held = np.arange(x.size) % 5 == 4
    X = x[~held, None]
    partition = partition_kmeans(X, 8, seed=0)
    fits = {starts: fit_exact_experts((X, y[~held], partition), ExpertsSpec(restarts=starts))
            for starts in (1, None)}
    bound = {starts: float(fit.model.log_marginal().sum()) for starts, fit in fits.items()}
    error = {starts: float(np.sqrt(np.mean((fit.predictor.predict_y(x[held, None])[0].numpy()
                                            - y[held]) ** 2)))
             for starts, fit in fits.items()}
    interpolation = float(np.sqrt(np.mean((np.interp(x[held], x[~held], y[~held])
                                           - y[held]) ** 2)))
    assert bound[None] > bound[1] + 100
    assert error[1] > 2 * interpolation  # the trend alone
    assert error[None] <= interpolation


def test_a_constant_input_column_does_not_make_a_zero_lengthscale_start():
    from pyrogp_models.inference.restarts import exact_restart_scales

    X = torch.stack([torch.linspace(0.0, 3.0, 400, dtype=torch.float64),
                     torch.zeros(400, dtype=torch.float64)], -1)
    scales = exact_restart_scales(3, X, 1.0)
    assert bool((scales > 0).all()) and float(scales[-1, 0]) < 1.0
