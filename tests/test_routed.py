"""RoutedModules: each new point is predicted by the module of its partition."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.trainer import TrainConfig

from pyrogp_models.data.columns import Columns
from pyrogp_models.data.partitioners import partition_by_label, partition_kmeans, partition_random
from pyrogp_models.errors import (
    DataError,
    IncompatibleModulesError,
    ModuleFileError,
    UnroutableModulesError,
)
from pyrogp_models.io import load_predictor
from pyrogp_models.modules.files import save_modules
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.routing import RoutedModules, as_predictor

FEW_STEPS = TrainConfig(steps=10, tol=None)




@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(centre, 0.5, size=(30, 2)) for centre in (-3.0, 0.0, 3.0)])
    y = np.sin(X[:, 0]) + X[:, 1] + 0.1 * rng.normal(size=len(X))
    labels = np.repeat([2.0, 5.0, 7.0], 30)
    return X, y, labels


@pytest.fixture(scope="module")
def kmeans_fit(data):
    X, y, _ = data
    partition = partition_kmeans(X, 3, seed=0)
    return fit_local((X, y, partition), LocalFitSpec(num_inducing=5), FEW_STEPS), partition


@pytest.fixture(scope="module")
def label_fit(data):
    X, y, labels = data
    partition = partition_by_label(labels, "site")
    return fit_local((X, y, partition), LocalFitSpec(num_inducing=5), FEW_STEPS), partition


def test_kmeans_routing_uses_the_module_of_the_nearest_centre(data, kmeans_fit):
    X, y, _ = data
    fit, partition = kmeans_fit
    routed = RoutedModules(fit.modules, partition.rule)
    X_new = np.random.default_rng(2).uniform(-4, 4, size=(50, 2))
    y_new = np.sin(X_new[:, 0])
    centres = np.asarray(partition.rule["centres"])
    nearest = np.argmin(((X_new[:, None, :] - centres) ** 2).sum(-1), axis=1)
    np.testing.assert_array_equal(routed.route(X_new), nearest)
    assert len(np.unique(nearest)) == 3

    mean, var = routed.predict_y(X_new)
    f_mean, f_var = routed.predict_f(X_new)
    log_density = routed.log_predictive(X_new, y_new)
    assert mean.shape == var.shape == f_mean.shape == f_var.shape == log_density.shape == (50,)
    for k, module in enumerate(fit.modules.values()):
        rows = nearest == k
        expected_mean, expected_var = module.predict_y(X_new[rows])
        torch.testing.assert_close(mean[rows], expected_mean)
        torch.testing.assert_close(var[rows], expected_var)
        torch.testing.assert_close(f_mean[rows], module.predict_f(X_new[rows])[0])
        torch.testing.assert_close(log_density[rows],
                                   module.log_predictive(X_new[rows], y_new[rows]))


def test_label_routing_uses_the_module_of_each_label(data, label_fit):
    X, y, labels = data
    fit, partition = label_fit
    routed = RoutedModules(fit.modules, partition.rule)
    order = np.random.default_rng(3).permutation(len(X))
    X_new, labels_new = X[order], labels[order]
    mean, _ = routed.predict_y(X_new, labels_new)
    for k, (value, module) in enumerate(zip([2.0, 5.0, 7.0], fit.modules.values(), strict=True)):
        rows = labels_new == value
        np.testing.assert_array_equal(routed.route(X_new, labels_new)[rows], k)
        torch.testing.assert_close(mean[rows], module.predict_y(X_new[rows])[0])

    with pytest.raises(DataError, match="needs the values of column 'site'"):
        routed.predict_y(X_new)
    with pytest.raises(DataError, match="unknown label values in column 'site': 3"):
        routed.predict_y(X_new[:2], np.array([2.0, 3.0]))


def test_random_partitions_cannot_be_routed(data, kmeans_fit):
    fit, _ = kmeans_fit
    rule = partition_random(len(data[0]), 3, seed=0).rule
    with pytest.raises(UnroutableModulesError, match="product-of-experts rule"):
        RoutedModules(fit.modules, rule)
    with pytest.raises(UnroutableModulesError, match="product-of-experts rule"):
        as_predictor(fit.modules)


def test_mixed_likelihoods_and_mismatched_rules_are_refused(kmeans_fit):
    fit, partition = kmeans_fit
    modules = dict(fit.modules)
    name = list(modules)[1]
    modules[name] = replace(modules[name], likelihood_name="poisson", likelihood_params={})
    with pytest.raises(IncompatibleModulesError, match=f"'{name}' differ.*likelihood"):
        RoutedModules(modules, partition.rule)
    two_modules = dict(list(fit.modules.items())[:2])
    with pytest.raises(ModuleFileError, match="3 partitions but there are 2 modules"):
        RoutedModules(two_modules, partition.rule)


def test_predictors_follow_the_protocol(tmp_path, data, kmeans_fit):
    X, y, _ = data
    fit, partition = kmeans_fit
    module = next(iter(fit.modules.values()))
    single = as_predictor(module)
    assert isinstance(single, Module) and isinstance(single, Predictor)
    torch.testing.assert_close(single.predict_y(X, labels=None)[0], module.predict_y(X)[0])
    assert single.likelihood_name == "gaussian" and not single.is_classifier

    save_modules(fit.modules, tmp_path / "modules", partition.rule)
    loaded = load_predictor(tmp_path / "modules")
    assert isinstance(loaded, RoutedModules) and isinstance(loaded, Predictor)
    assert loaded.columns == Columns()
    torch.testing.assert_close(loaded.predict_y(X)[0],
                               RoutedModules(fit.modules, partition.rule).predict_y(X)[0])
