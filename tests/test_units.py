"""Modules from independent fits combine: every module converts exactly to one coordinate
system (its own standardisation → the pooled one), so the units a site happened to fit in change
nothing — not the predictions, not the meta-GP, not a combination or a routed set."""


from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.recycling import RecycleSpec, recycle

from helpers import run_ok, write_csv
from pyrogp_models.data import Standardisation
from pyrogp_models.data.partitioners import partition_contiguous
from pyrogp_models.gaussian.expectations import site_parameters
from pyrogp_models.models.experts.predictor import ExpertCombination
from pyrogp_models.modules.files import load_module
from pyrogp_models.modules.routing import RoutedModules
from pyrogp_models.modules.units import common_standardisation, convert

SCALE_X, SHIFT_X, SCALE_Y, SHIFT_Y = 7.0, -3.0, 0.25, 40.0


def data(n=240, seed=0, dims=1):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 6, (n, dims))
    y = np.sin(X[:, 0]) + 0.3 * X[:, -1] + 0.1 * rng.standard_normal(n)
    return X, y


def fit(X, y, likelihood="gaussian", partitions=3, **spec):
    return fit_local((X, y, partition_contiguous(X, partitions)),
                     LocalFitSpec(num_inducing=6, likelihood=likelihood, **spec)).modules


@pytest.fixture(scope="module")
def original():
    X, y = data()
    return X, y, fit(X, y)


@pytest.fixture(scope="module")
def refitted(original):
    """The same data in other units: x·a + b, y·c + d."""
    X, y, _ = original
    return fit(SCALE_X * X + SHIFT_X, SCALE_Y * y + SHIFT_Y)


OTHER = Standardisation(np.array([2.0, -1.0]), np.array([0.3, 5.0]), -4.0, 9.0)


@pytest.mark.parametrize("likelihood,options", [("gaussian", {}), ("poisson", {}),
                                                ("heteroscedastic", {}),
                                                ("categorical", {"num_classes": 3,
                                                                 "link": "robustmax"})])
@pytest.mark.parametrize("ard", [False, True])
def test_a_converted_module_predicts_the_same_in_data_units(likelihood, options, ard):
    X, y = data(150, dims=2)
    if likelihood == "poisson":
        y = np.round(np.exp(np.sin(X[:, 0])))
    elif likelihood == "categorical":
        y = np.digitize(X[:, 0], [2.0, 4.0]).astype(float)
    module = next(iter(fit(X, y, likelihood, partitions=1, ard=ard,
                           likelihood_options=options).values()))
    converted = convert(module, OTHER)
    assert converted.standardisation is not module.standardisation
    grid = np.random.default_rng(1).uniform(-1, 7, (40, 2))
    for got, want in zip(converted.predict_y(grid), module.predict_y(grid), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)
    labels = y[:40]
    torch.testing.assert_close(converted.log_predictive(X[:40], labels),
                               module.log_predictive(X[:40], labels), rtol=1e-8, atol=1e-10)
    if likelihood in ("gaussian", "heteroscedastic"):  # the bound moves by −N log a
        a = module.standardisation.y_scale / OTHER.y_scale
        assert converted.elbo == pytest.approx(module.elbo - module.num_data * np.log(a))


def test_an_isotropic_module_becomes_ard_where_the_input_scales_differ(original):
    X, y = data(120, dims=2)
    module = next(iter(fit(X, y, partitions=1).values()))
    assert not module.kernel.ard and convert(module, OTHER).kernel.ard


def in_other_units(module):
    """The module a site holds that fitted the same data in other units, x·a + b and y·c + d:
    its standardised data — hence everything in model units — are the same; only its
    standardisation differs."""
    s = module.standardisation
    return replace(module, standardisation=Standardisation(
        SCALE_X * s.x_mean + SHIFT_X, SCALE_X * s.x_scale, SCALE_Y * s.y_mean + SHIFT_Y,
        SCALE_Y * s.y_scale))


def test_a_module_fitted_in_other_units_predicts_the_same(original, refitted):
    X, _, modules = original
    for name, module in modules.items():
        mean, var = module.predict_y(X)
        other = in_other_units(module)
        mean_other, var_other = other.predict_y(SCALE_X * X + SHIFT_X)
        torch.testing.assert_close(mean_other, SCALE_Y * mean + SHIFT_Y, rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(var_other, SCALE_Y**2 * var, rtol=1e-8, atol=1e-12)
        # an actual refit on the transformed data: its standardised data differ by rounding,
        # which can lead the optimiser to another optimum of the same bound (part002 has two
        # within 7e-6 nats); both are pinned, equally good, and predict alike
        again = refitted[name]
        assert again.elbo == pytest.approx(module.elbo, abs=1e-4)  # of standardised data
        mean_again, var_again = again.predict_y(SCALE_X * X + SHIFT_X)
        torch.testing.assert_close(mean_again, SCALE_Y * mean + SHIFT_Y, rtol=0,
                                   atol=5e-3 * SCALE_Y)
        torch.testing.assert_close(var_again, SCALE_Y**2 * var, rtol=2e-2, atol=0)


def test_recycling_modules_in_other_units_gives_the_same_meta_gp(original):
    X, _, modules = original
    spec = RecycleSpec(num_inducing=15)
    meta = recycle(modules, spec).module
    meta_other = recycle({k: in_other_units(m) for k, m in modules.items()}, spec).module
    mean, var = meta.predict_y(X)
    mean_other, var_other = meta_other.predict_y(SCALE_X * X + SHIFT_X)
    torch.testing.assert_close(mean_other, SCALE_Y * mean + SHIFT_Y, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(var_other, SCALE_Y**2 * var, rtol=1e-6, atol=1e-9)


OTHER_1D = Standardisation(np.array([2.0]), np.array([0.3]), -4.0, 9.0)


def test_combinations_and_routing_do_not_see_a_modules_units(original):
    X, y, modules = original
    mixed = {**modules, "part001": convert(modules["part001"], OTHER_1D)}
    for rule in ("rbcm", "gpoe", "bcm"):
        torch.testing.assert_close(ExpertCombination(mixed, rule).predict_y(X)[0],
                                   ExpertCombination(modules, rule).predict_y(X)[0],
                                   rtol=1e-8, atol=1e-8)
    rule = partition_contiguous(X, 3).rule
    torch.testing.assert_close(RoutedModules(mixed, rule).predict_y(X)[0],
                               RoutedModules(modules, rule).predict_y(X)[0], rtol=1e-8,
                               atol=1e-8)
    torch.testing.assert_close(RoutedModules(mixed, rule).log_predictive(X, y),
                               RoutedModules(modules, rule).log_predictive(X, y), rtol=1e-8,
                               atol=1e-8)


def test_the_pooled_standardisation_is_the_union_of_the_sites_data():
    X, y = data(300)
    left = X[:, 0] < 2.5
    sites = [fit(X[rows], y[rows], partitions=2) for rows in (left, ~left)]
    pooled = common_standardisation({f"{k}{name}": m for k, site in enumerate(sites)
                                     for name, m in site.items()})
    union = Standardisation.fit(X, y)
    np.testing.assert_allclose(pooled.x_mean, union.x_mean, rtol=1e-12)
    np.testing.assert_allclose(pooled.x_scale, union.x_scale, rtol=1e-12)
    assert pooled.y_mean == pytest.approx(union.y_mean, rel=1e-12)
    assert pooled.y_scale == pytest.approx(union.y_scale, rel=1e-12)


def test_site_parameters_with_a_prior_mean_are_the_dense_site():
    """b = S⁻¹μ − K⁻¹μ_p and c = μᵀS⁻¹μ − μ_pᵀK⁻¹μ_p + log|S| − log|K| by dense numpy."""
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((2, 4, 4))
    S, K = A @ A.T + 0.5 * np.eye(4), B @ B.T + 0.5 * np.eye(4)
    mu, mu_p = rng.standard_normal(4), np.full(4, 0.7)
    sites = site_parameters(*(torch.as_tensor(v) for v in (
        mu, np.linalg.cholesky(S), np.linalg.cholesky(K), mu_p)))
    np.testing.assert_allclose(sites.shift.numpy(),
                               np.linalg.solve(S, mu) - np.linalg.solve(K, mu_p), rtol=1e-10)
    constant = (mu @ np.linalg.solve(S, mu) - mu_p @ np.linalg.solve(K, mu_p)
                + np.linalg.slogdet(S)[1] - np.linalg.slogdet(K)[1])
    assert float(sites.constant) == pytest.approx(constant, rel=1e-10)


def test_two_sites_with_their_own_units_recycle_like_a_joint_fit():
    """Site A measures on [0, 6) in its own units, site B on [6, 12) with an offset and a scale;
    each fits its own modules. Their meta-GP comes within 1.5× the RMSE of a fit on all data."""
    rng = np.random.default_rng(4)
    x = np.sort(rng.uniform(0, 12, 600))[:, None]
    f = np.sin(x[:, 0]) + 0.2 * x[:, 0]
    y = f + 0.1 * rng.standard_normal(600)
    a = x[:, 0] < 6
    site_a = fit(x[a], y[a], partitions=3)
    site_b = fit(x[~a], y[~a], partitions=3)
    modules = {**{f"A/{k}": m for k, m in site_a.items()}, **{f"B/{k}": m for k, m in
                                                             site_b.items()}}
    meta = recycle(modules, RecycleSpec(num_inducing=40)).module
    joint = fit_local((x, y, partition_contiguous(x, 1)),
                      LocalFitSpec(num_inducing=40)).predictor
    grid = np.linspace(0.2, 11.8, 300)[:, None]
    truth = np.sin(grid[:, 0]) + 0.2 * grid[:, 0]

    def rmse(predictor):
        return float(np.sqrt(np.mean((predictor.predict_y(grid)[0].numpy() - truth) ** 2)))

    assert rmse(meta) <= 1.5 * rmse(joint)


def test_a_pyramid_of_meta_gps_fitted_on_two_halves_recycles(capsys, folder):
    x, y = data(400)
    paths = []
    for name, rows in (("left", x[:, 0] < 3), ("right", x[:, 0] >= 3)):
        csv = write_csv(folder / f"{name}.csv", {"x": x[rows, 0], "y": y[rows]})
        run_ok(capsys, "fit-local", csv, "--target", "y", "--partitions", 3, "--partition-by",
               "contiguous", "--inducing", 6, "--out", folder / name)
        run_ok(capsys, "recycle", folder / name, "--inducing", 20, "--out", folder / f"m_{name}")
        paths.append(folder / f"m_{name}")
    out = run_ok(capsys, "recycle", *paths, "--inducing", 30, "--out", folder / "top")
    assert "recycled 2 modules" in out
    top = load_module(folder / "top.safetensors")
    assert top.num_data == 400
    grid = np.linspace(0.2, 5.8, 50)[:, None]
    error = top.predict_y(grid)[0].numpy() - np.sin(grid[:, 0]) - 0.3 * grid[:, 0]
    assert np.sqrt(np.mean(error**2)) < 0.1
    assert top.standardisation.x_mean[0] == pytest.approx(x.mean(), rel=1e-9)
