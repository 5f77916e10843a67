"""The trainer's convergence test: an exact loss stops when it no longer changes; an estimated
(noisy) loss stops when its change between two windows is within twice its standard error, and
not while a real trend remains."""

from __future__ import annotations

from dataclasses import replace

import pyro
import pytest
import torch
from pyro.nn import PyroModule, PyroParam
from pyrogp_models.inference.local_fit import LocalFitSpec, default_config, fit_local
from pyrogp_models.inference.trainer import TrainConfig, train
from sklearn.datasets import load_diabetes

from pyrogp_models.data.partitioners import partition_random
from pyrogp_models.errors import NotConvergedWarning

CONFIG = TrainConfig(lr=0.05, steps=2000, window=50, tol=1e-6)


class Quadratic(PyroModule):
    """−log p = (θ − target)² + noise·ε, ε ~ N(0, 1) fresh at every evaluation."""

    def __init__(self, target: float, noise: float, noisy_objective: bool):
        super().__init__()
        self.theta = PyroParam(torch.tensor(0.0, dtype=torch.float64))
        self.target, self.noise = target, noise
        self.noisy_objective = noisy_objective

    def model(self):
        draw = torch.randn((), dtype=torch.float64)
        pyro.factor("loss", -((self.theta - self.target) ** 2 + 10.0 + self.noise * draw))

    def guide(self):
        pass


def test_an_estimated_loss_converges_once_its_change_is_within_its_noise():
    module = Quadratic(target=0.0, noise=0.5, noisy_objective=True)
    result = train(module, config=CONFIG)
    assert result.converged and result.steps <= 4 * CONFIG.window


def test_the_same_loss_taken_as_exact_never_converges():
    module = Quadratic(target=0.0, noise=0.5, noisy_objective=False)
    with pytest.warns(NotConvergedWarning):
        result = train(module, config=replace(CONFIG, steps=400))
    assert not result.converged


def test_a_trend_larger_than_the_noise_keeps_an_estimated_loss_going():
    module = Quadratic(target=5.0, noise=0.5, noisy_objective=True)
    result = train(module, config=CONFIG)
    assert result.converged
    assert abs(float(module.theta) - 5.0) < 0.3  # it did not stop on the way




def test_a_fit_whose_inducing_inputs_creep_converges_with_them_held():
    """scikit-learn's diabetes (442 × 10), one partition, the defaults (M = 100 inducing inputs
    learned in 10-D): Z creeps along directions worth ~10⁻⁵ nats a step, so pinning every
    parameter took more than 5000 steps; with Z held after the precise phase's first judgements
    the kernel and noise pin and the fit converges within the default step limit."""
    X, y = load_diabetes(return_X_y=True)
    spec = LocalFitSpec()
    fit = fit_local((X, y, partition_random(len(y), 1, 0)), spec, None)
    assert fit.result.converged and fit.result.held
    assert fit.result.steps < default_config(spec).steps
    assert next(iter(fit.modules.values())).info["converged"]
