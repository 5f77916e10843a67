"""The trainer's convergence test: an exact loss stops when it no longer changes; an estimated
(noisy) loss stops when its change between two windows is within twice its standard error, and
not while a real trend remains; with ``patience`` a loss that rises above its lowest window stops
there and returns to that window's parameters, the windows judged by their mean loss or by a
precise loss at their ends."""

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


class MovingTarget(PyroModule):
    """−log p = (θ − 1)² for the first ``switch`` evaluations, then (θ − 3)² + 5: the loss rises
    at the switch and settles above where it was (the evaluations are counted in the state)."""

    def __init__(self, switch: int):
        super().__init__()
        self.theta = PyroParam(torch.tensor(0.0, dtype=torch.float64))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.switch = switch

    def model(self):
        before = bool(self.calls < self.switch)
        self.calls += 1
        loss = (self.theta - 1.0) ** 2 if before else (self.theta - 3.0) ** 2 + 5.0
        pyro.factor("loss", -loss)

    def guide(self):
        pass


class Recorder:
    """A pre-step hook that records θ before every step (it owns no parameter)."""

    parameters = ()

    def __init__(self, module: MovingTarget):
        self.module, self.thetas = module, []

    def __call__(self, loss_fn):
        self.thetas.append(float(self.module.theta))


def lowest_window_end(losses: list[float], window: int) -> int:
    means = [sum(losses[end - window:end]) / window
             for end in range(window, len(losses) + 1, window)]
    return window * (means.index(min(means)) + 1)


@pytest.mark.parametrize("patience", [1, 2])
def test_a_loss_that_rises_stops_at_its_lowest_window_and_returns_there(patience):
    config = TrainConfig(lr=0.05, steps=2000, window=50, tol=None, patience=patience)
    module = MovingTarget(switch=200)
    recorder = Recorder(module)
    result = train(module, config=config, hooks=[recorder])
    best = lowest_window_end(result.losses, config.window)
    assert result.converged and result.returned_to == best
    assert result.steps == best + patience * config.window
    # the parameters are those after the lowest window's last step, before the rise
    assert float(module.theta) == recorder.thetas[best]
    assert abs(float(module.theta) - 1.0) < 0.1


def test_without_patience_the_same_loss_goes_on_past_the_rise():
    module = MovingTarget(switch=200)
    result = train(module, config=TrainConfig(lr=0.05, steps=600, window=50, tol=None))
    assert result.returned_to is None and result.steps == 600
    assert abs(float(module.theta) - 3.0) < 0.1


def test_a_fit_stopped_by_patience_resumes_from_a_checkpoint_to_the_same_state(tmp_path):
    config = TrainConfig(lr=0.05, steps=2000, window=50, tol=None, patience=2,
                         checkpoint=tmp_path / "fit.safetensors", checkpoint_every=225)
    whole = MovingTarget(switch=200)
    reference = train(whole, config=replace(config, checkpoint=None))
    train(MovingTarget(switch=200), config=replace(config, steps=225))  # a checkpoint at 225
    resumed = MovingTarget(switch=200)
    result = train(resumed, config=replace(config, resume=True))
    assert (result.steps, result.returned_to) == (reference.steps, reference.returned_to)
    assert result.losses == reference.losses
    assert float(resumed.theta) == float(whole.theta)


class DistanceFrom:
    """A precise loss that is not the training loss: (θ − centre)², each value recorded."""

    def __init__(self, module: MovingTarget, centre: float):
        self.module, self.centre, self.calls = module, centre, []

    def __call__(self) -> float:
        theta = float(self.module.theta.detach())
        self.calls.append((theta - self.centre) ** 2)
        return self.calls[-1]


def test_a_precise_loss_judges_the_windows_at_their_ends():
    """θ goes to 1, then (after the switch) towards 3 while the training loss rises: by its mean
    the lowest window is the one before the switch; judged by (θ − 2.5)², one on the way to 3.
    The second window's precise value is above the first's while the mean still falls: no stop
    there."""
    config = TrainConfig(lr=0.05, steps=2000, window=50, tol=None, patience=1)
    module = MovingTarget(switch=100)
    precise = DistanceFrom(module, centre=2.5)
    result = train(module, config=config, precise_loss=precise)
    best = config.window * (precise.calls.index(min(precise.calls)) + 1)
    assert len(precise.calls) == result.steps // config.window  # once per window, at its end
    assert precise.calls[1] > precise.calls[0]
    assert result.converged and result.returned_to == best
    assert best > lowest_window_end(result.losses, config.window)
    assert result.steps == best + config.window
    assert (float(module.theta) - 2.5) ** 2 == min(precise.calls)


def test_a_fit_judged_by_a_precise_loss_resumes_from_a_checkpoint_to_the_same_state(tmp_path):
    config = TrainConfig(lr=0.05, steps=2000, window=50, tol=None, patience=2,
                         checkpoint=tmp_path / "fit.safetensors", checkpoint_every=275)
    whole = MovingTarget(switch=100)
    reference = train(whole, config=replace(config, checkpoint=None),
                      precise_loss=DistanceFrom(whole, centre=2.5))
    first = MovingTarget(switch=100)
    train(first, config=replace(config, steps=275), precise_loss=DistanceFrom(first, 2.5))
    resumed = MovingTarget(switch=100)
    result = train(resumed, config=replace(config, resume=True),
                   precise_loss=DistanceFrom(resumed, centre=2.5))
    assert 275 < reference.steps
    assert (result.steps, result.returned_to) == (reference.steps, reference.returned_to)
    assert result.losses == reference.losses
    assert float(resumed.theta) == float(whole.theta)


def test_patience_is_at_least_one_window():
    with pytest.raises(ValueError, match="patience"):
        TrainConfig(patience=0)


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
