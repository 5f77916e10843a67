"""ExpertCombination: modules + a product-of-experts rule + the likelihood, in data units."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference.experts_fit import fit_exact_experts
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.trainer import TrainConfig

from pyrogp_models.data.columns import Columns
from pyrogp_models.data.partitioners import partition_kmeans, partition_random
from pyrogp_models.errors import IncompatibleModulesError
from pyrogp_models.models.experts import (
    ExpertCombination,
    ModuleExperts,
    grbcm_rows,
)
from pyrogp_models.modules.routing import Predictor
from test_expert_rules import np_gpoe, np_rbcm, np_softmax

TOL = dict(rtol=1e-9, atol=1e-12)
QUICK = TrainConfig(steps=10, tol=None)

#: (rule, weights, temperature) that return a single expert unchanged (not rBCM_entr, Prop. 3).
ONE_EXPERT_RULES = [
    ("poe", None, None),
    ("gpoe", None, None),
    ("gpoe", "softmax-var", 100.0),
    ("bcm", None, None),
    ("rbcm", "uniform", None),
    ("rbcm", "softmax-var", 15.0),
    ("barycenter", "softmax-var", 100.0),
    ("barycenter-paper", "uniform", None),
]


def regression_data(n=150, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, (n, 2))
    y = 3.0 * np.sin(X[:, 0]) + X[:, 1] + 0.3 * rng.standard_normal(n) + 20.0
    return X, y, rng.uniform(-1, 11, (40, 2))


@pytest.fixture(scope="module")
def exact_fit():
    torch.set_default_dtype(torch.float64)
    X, y, Xs = regression_data()
    fit = fit_exact_experts((X, y, partition_kmeans(X, 4, seed=0)),
                            config=TrainConfig(optimizer="lbfgs", lr=1.0, steps=1, window=1))
    return fit, X, y, Xs


@pytest.fixture(scope="module")
def svgp_modules():
    torch.set_default_dtype(torch.float64)
    X, y, _ = regression_data(seed=1)
    fit = fit_local((X, y, partition_random(len(y), 3, 0)),
                    LocalFitSpec(num_inducing=[5, 8, 5]), QUICK)
    return fit.modules


def assert_predicts_like(combination, module, Xs, y):
    for got, want in zip(combination.predict_f(Xs), module.predict_f(Xs), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)
    for got, want in zip(combination.predict_y(Xs), module.predict_y(Xs), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)
    np.testing.assert_allclose(combination.log_predictive(Xs, y).numpy(),
                               module.log_predictive(Xs, y).numpy(), **TOL)


@pytest.mark.parametrize("rule,weights,temperature", ONE_EXPERT_RULES)
def test_one_module_is_returned_unchanged_in_data_units(rule, weights, temperature, exact_fit,
                                                        svgp_modules):
    fit, _, _, Xs = exact_fit
    y = np.linspace(15.0, 30.0, len(Xs))
    for module in (next(iter(fit.modules.values())), next(iter(svgp_modules.values()))):
        combination = ExpertCombination({"only": module}, rule, weights, temperature)
        assert_predicts_like(combination, module, Xs, y)


def test_one_module_in_y_space_and_grbcm_with_one_augmented_expert(exact_fit):
    fit, X, y, Xs = exact_fit
    y_test = np.linspace(15.0, 30.0, len(Xs))
    first = next(iter(fit.modules.values()))
    assert_predicts_like(ExpertCombination({"a": first}, "poe", space="y"), first, Xs, y_test)
    rows, partition = grbcm_rows(partition_random(len(y), 1, 0), 30, seed=0)
    communication, augmented = fit_exact_experts((X[rows], y[rows], partition),
                                                 config=TrainConfig(steps=0)).modules.values()
    communication = replace(communication, info={**communication.info, "role": "communication"})
    combination = ExpertCombination({"augmented": augmented, "c": communication}, "grbcm")
    assert combination.communication == 1
    assert_predicts_like(combination, augmented, Xs, y_test)


def test_entropy_rbcm_of_one_expert_is_not_the_expert_prop3(exact_fit):
    fit, _, _, Xs = exact_fit
    module = next(iter(fit.modules.values()))
    mean, var = ExpertCombination({"a": module}, "rbcm").predict_f(Xs)
    assert not np.allclose(var.numpy(), module.predict_f(Xs)[1].numpy(), rtol=1e-3)


def test_combination_equals_rules_on_per_module_predictions(exact_fit, svgp_modules):
    """Each module's own prediction, combined by the independent numpy rules of
    test_expert_rules.py (not the library's ``combine``), in f- and y-space."""
    fit, _, _, Xs = exact_fit
    for modules in (fit.modules, svgp_modules):
        experts = ModuleExperts(modules)
        assert len(experts.stack.groups) > 1  # several M: one batched conditional per group
        mean, var = experts.predict_f(Xs)
        for j, module in enumerate(modules.values()):
            for got, want in zip((mean[j], var[j]), module.predict_f(Xs), strict=True):
                np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)
        # the documented prior and noise: means over the experts (one standardisation here)
        m, v = mean.numpy(), var.numpy()
        prior = np.mean([float(module.kernel.variance) for module in modules.values()])
        prior_mean = np.mean([float(module.prior_mean) for module in modules.values()])
        noise = np.mean([float(module.likelihood_params["variance"])
                         for module in modules.values()])
        m_y, v_y, prior_y = m, v + noise, prior + noise
        entropy = np.maximum(0.5 * (np.log(prior) - np.log(v)), 0.0)
        expected = {  # latent (f) or noisy (y) moments of each rule, as (mean, y variance)
            ("rbcm", None, "f"): np_rbcm(m, np.minimum(v, prior), entropy, prior, prior_mean),
            ("gpoe", "softmax-var", "f"): np_gpoe(m, v, np_softmax(-50.0 * v)),
            ("bcm", None, "y"): np_rbcm(m_y, np.minimum(v_y, prior_y), np.ones_like(v), prior_y,
                                        prior_mean),
            ("barycenter", "softmax-var", "y"): np_w2_barycenter(m_y, v_y,
                                                                 np_softmax(-50.0 * v_y)),
        }
        s = fit.standardisation if modules is fit.modules else svgp_modules[
            "part000"].standardisation
        for (rule, weights, space), (want_mean, want_var) in expected.items():
            combination = ExpertCombination(experts, rule, weights, 50.0, space=space)
            want_y_var = want_var + noise if space == "f" else want_var
            y_mean, y_var = combination.predict_y(Xs)
            np.testing.assert_allclose(y_mean.numpy(), want_mean * s.y_scale + s.y_mean,
                                       rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(y_var.numpy(), want_y_var * s.y_scale ** 2, rtol=1e-9)


def np_w2_barycenter(m, v, b):
    """The exact 1-D W2 barycenter: weighted means of the means and of the standard deviations."""
    b = b / b.sum(0)
    return (b * m).sum(0), (b * np.sqrt(v)).sum(0) ** 2


def test_predictor_protocol_and_names(exact_fit):
    fit, _, _, _ = exact_fit
    tagged = {name: replace(m, columns=Columns(["a", "b"], "t"))
              for name, m in fit.modules.items()}
    combination = ExpertCombination(tagged, "gpoe", "softmax-var", 100.0)
    assert isinstance(combination, Predictor)
    assert combination.likelihood_name == "gaussian" and not combination.is_classifier
    assert combination.columns == Columns(["a", "b"], "t")
    assert combination.names == list(fit.modules)


def test_incompatible_modules_are_refused(exact_fit, svgp_modules):
    fit, _, _, _ = exact_fit
    first, second = list(fit.modules.values())[:2]
    other = replace(second, likelihood_name="poisson", likelihood_params={})
    with pytest.raises(IncompatibleModulesError, match="likelihood"):
        ExpertCombination({"a": first, "b": other}, "poe")
    with pytest.raises(IncompatibleModulesError, match="no modules"):
        ExpertCombination({}, "poe")


@pytest.mark.parametrize("rule,weights,temperature,error", [
    ("poe", "uniform", None, "fixed weights"),
    ("gpoe", "softmax-var", None, "temperature"),
    ("median", None, None, "unknown combination rule"),
    ("gpoe", "variance", None, "unknown weighting"),
])
def test_bad_arguments_fail_at_construction(exact_fit, rule, weights, temperature, error):
    with pytest.raises(ValueError, match=error):
        ExpertCombination(exact_fit[0].modules, rule, weights, temperature)


@pytest.mark.parametrize("likelihood,options", [
    ("categorical", {"num_classes": 3, "link": "softmax", "num_samples": 256}),
    ("bernoulli", {"link": "probit"}),
])
def test_classification_combination_gives_probabilities(likelihood, options):
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (240, 2))
    labels = (X[:, 0] > 0).astype(float) + (X[:, 1] > 1.0) * (likelihood == "categorical")
    fit = fit_local((X, labels, partition_kmeans(X, 3, seed=0)),
                    LocalFitSpec(num_inducing=6, likelihood=likelihood,
                                 likelihood_options=options), QUICK)
    Xs = rng.uniform(-5, 5, (30, 2))
    for rule, weights, temperature in [("gpoe", "softmax-var", 10.0), ("rbcm", None, None),
                                       ("barycenter-paper", "uniform", None), ("poe", None, None)]:
        combination = ExpertCombination(fit.modules, rule, weights, temperature)
        assert combination.is_classifier
        prob, _ = combination.predict_y(Xs)
        assert bool(((prob >= 0) & (prob <= 1)).all())
        log_density = combination.log_predictive(Xs, labels[:30])
        assert log_density.shape == (30,) and bool((log_density <= 0).all())
        if likelihood == "categorical":
            assert prob.shape == (30, 3)
            np.testing.assert_allclose(prob.sum(-1).numpy(), 1.0, rtol=1e-12)
        else:
            np.testing.assert_allclose(log_density.exp().numpy(),
                                       np.where(labels[:30] == 1, prob, 1 - prob), rtol=1e-12)
