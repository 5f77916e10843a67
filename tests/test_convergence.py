"""The trainer's convergence test: an exact loss stops when it no longer changes; an estimated
(noisy) loss stops when its change between two windows is within twice its standard error, and
not while a real trend remains."""

from __future__ import annotations

from dataclasses import replace

import pyro
import pytest
import torch
from pyro.nn import PyroModule, PyroParam
from pyrogp_models.inference.trainer import TrainConfig, train

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


