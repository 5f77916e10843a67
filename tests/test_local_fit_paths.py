"""Paths of a local fit that the default settings do not take: a loss that turns non-finite,
minibatches through ``fit_local``, and the guarantee that collapsed fits can always be recycled
(their sites are the collapsed optimum's, positive semi-definite by construction)."""

import math
from dataclasses import replace

import numpy as np
import pyro
import pytest
import torch
from pyro.nn import PyroModule, PyroParam
from pyrogp_models.inference.local_fit import (
    LocalFitSpec,
    beyond_ceiling,
    default_config,
    fit_local,
    model_inputs,
)
from pyrogp_models.inference.recycling import RecycleSpec, recycle
from pyrogp_models.inference.trainer import TrainConfig, train

from helpers import run_failing, write_csv
from pyrogp_models.data.partitioners import Partition, partition_random
from pyrogp_models.errors import NotConvergedWarning, RoundingWarning
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.modules.stack import ModuleStack


# A non-finite loss ------------------------------------------------------------------------------
class LogBarrier(PyroModule):
    """ELBO log x − x (maximum at x = 1) from x = 3: Adam's first step has length lr, so at
    lr 5 it lands on x = −2, where log x is NaN."""

    def __init__(self):
        super().__init__()
        self.x = PyroParam(torch.tensor(3.0))

    def model(self):
        pyro.factor("f", torch.log(self.x) - self.x)

    def guide(self):
        pass


@pytest.mark.filterwarnings("ignore:Encountered NaN")
def test_a_non_finite_loss_stops_the_fit_naming_its_step():
    """The trainer's own check (Pyro's argument validation off, as in a sync-free loop)."""
    with pyro.validation_enabled(False), pytest.raises(
            FloatingPointError, match=r"^the loss became nan at step 2; try a smaller learning "
                                      r"rate$"):
        train(LogBarrier(), config=TrainConfig(lr=5.0, steps=50, window=10, tol=None))
    # a fit that stays finite is not stopped
    result = train(LogBarrier(), config=TrainConfig(lr=0.1, steps=30, window=10, tol=None))
    assert result.steps == 30 and math.isfinite(result.losses[-1])


def test_a_non_finite_loss_is_named_with_pyro_validation_on():
    with pyro.validation_enabled(True), pytest.raises(FloatingPointError,
                                                      match="the loss became nan at step 2"):
        train(LogBarrier(), config=TrainConfig(lr=5.0, steps=50, window=10, tol=None))


class WalledQuartic(PyroModule):
    """ELBO −(x − 2)⁴ from x = 0, NaN beyond x = ``wall`` (hyperparameters where a
    factorisation fails, say) or, with ``finite_loss``, finite there with a NaN gradient."""

    def __init__(self, wall: float, finite_loss: bool = False):
        super().__init__()
        self.x = PyroParam(torch.tensor(0.0, dtype=torch.float64))
        self.wall, self.finite_loss = wall, finite_loss

    def model(self):
        value = -(self.x - 2.0) ** 4
        if self.finite_loss:  # past the wall the loss is finite, its gradient NaN (0 · ∞)
            inside = value + 0.0 * torch.sqrt(self.wall - self.x)
            pyro.factor("f", torch.where(self.x > self.wall, value, inside))
        else:
            pyro.factor("f", torch.where(self.x > self.wall, math.nan, value))

    def guide(self):
        pass


def test_torch_lbfgs_backs_off_from_non_finite_trial_points():
    """A model without independent members trains under torch's L-BFGS, whose line search
    tries points in the NaN region past the wall: with the wall beyond the optimum the fit
    converges as without it; with the optimum beyond the wall it ends at the best finite point,
    the wall."""
    config = TrainConfig(optimizer="lbfgs", lr=1.0, steps=200, window=2, tol=1e-12)
    for wall, end in ((math.inf, 2.0), (2.5, 2.0), (1.0, 1.0)):
        module = WalledQuartic(wall)
        result = train(module, config=config)
        assert result.converged and all(math.isfinite(loss) for loss in result.losses)
        assert float(module.x) == pytest.approx(end, abs=0.01)


def test_torch_lbfgs_backs_off_from_trial_points_whose_gradient_is_not_finite():
    """Past the wall the loss is finite and its gradient NaN (a bound far out on a ray, where
    a gradient overflows before the loss does): a NaN gradient taken in would put NaN into
    L-BFGS's next direction and the parameters; refused, the fit ends at the wall."""
    config = TrainConfig(optimizer="lbfgs", lr=1.0, steps=200, window=2, tol=1e-12)
    module = WalledQuartic(1.0, finite_loss=True)
    result = train(module, config=config)
    assert result.converged and all(math.isfinite(loss) for loss in result.losses)
    assert float(module.x) == pytest.approx(1.0, abs=0.01)


def nan_poisson_fit(capsys, tmp_path, monkeypatch) -> str:
    from pyrogp_models.likelihoods.poisson import Poisson

    x = np.linspace(0.0, 10.0, 40)
    data = write_csv(tmp_path / "counts.csv", {"x": x, "count": np.round(3 + 2 * np.sin(x))})
    monkeypatch.setattr(Poisson, "expected_log_prob",
                        lambda self, y, mean, var: mean * math.nan)
    message = run_failing(capsys, "fit-local", data, "--target", "count", "--likelihood",
                          "poisson", "--partitions", "2", "--inducing", "3", "--steps", "20",
                          "--natural-gradient", "0", "--out", tmp_path / "out")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["counts.csv"]
    return message


def test_a_non_finite_loss_from_the_command_line_is_one_line_and_writes_nothing(
        capsys, tmp_path, monkeypatch):
    nan_poisson_fit(capsys, tmp_path, monkeypatch)


def test_a_non_finite_loss_from_the_command_line_names_the_step(capsys, tmp_path, monkeypatch):
    message = nan_poisson_fit(capsys, tmp_path, monkeypatch)
    assert "the loss became nan at step 1; try a smaller learning rate" in message


# Minibatches through fit_local -----------------------------------------------------------------
@pytest.fixture(scope="module")
def uneven():
    """28 and 92 points in two contiguous partitions: minibatch weights differ per partition."""
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0, 10, 120))
    assignments = (x > 2.5).astype(int)
    partition = Partition(assignments, {"kind": "contiguous", "num_partitions": 2, "dim": 0,
                                        "boundaries": [2.5]})
    return x[:, None], np.sin(x) + 0.1 * rng.normal(size=120), partition


def test_minibatch_data_terms_are_unbiased_for_unequal_partitions(uneven):
    """The mean of many minibatch estimates (B = 16 positions of the padded layout, weight
    N_max/B) equals the full data term of each partition, padded or not, within 5 standard
    errors."""
    X, y, partition = uneven
    spec = LocalFitSpec(num_inducing=5, batch_size=16)
    X_model, y_model, _ = model_inputs(X, y, spec)
    model = LocalGPs(X_model, y_model, partition, 5, "gaussian", batch_size=16)
    (group,) = model.svgps
    with torch.no_grad():
        full = group.expected_log_lik(group.data_X, group.data_y, group.data_mask.to(X_model.dtype))
        torch.manual_seed(0)
        draws = torch.stack([group.data_term() for _ in range(1000)])
    error = draws.std(0) / math.sqrt(len(draws))
    assert torch.all((draws.mean(0) - full).abs() < 5 * error), (draws.mean(0), full, error)
    assert torch.all(draws.std(0) > 0.01 * full.abs())  # they are minibatches


def test_a_minibatch_fit_through_fit_local(uneven):
    X, y, partition = uneven
    spec = LocalFitSpec(num_inducing=6, batch_size=16)
    with pytest.warns(NotConvergedWarning):
        fit = fit_local((X, y, partition), spec, replace(default_config(spec), steps=100))
    assert fit.result.steps == 100 and all(g.batch_size == 16 for g in fit.model.svgps)
    # the modules record the full-data ELBO, not a minibatch estimate
    (group,) = fit.model.svgps
    with torch.no_grad():
        full = (group.expected_log_lik(group.data_X, group.data_y, group.data_mask.double())
                - group.kl()).numpy().ravel()
    np.testing.assert_allclose([m.elbo for m in fit.modules.values()], full, rtol=1e-9)
    assert [m.num_data for m in fit.modules.values()] == [28, 92]
    grid = np.linspace(0.2, 9.8, 100)[:, None]
    mean = fit.predictor.predict_y(grid)[0].numpy()
    rmse = np.sqrt(np.mean((mean - np.sin(grid[:, 0])) ** 2))
    assert rmse < 0.1  # the constant predictor: 0.7; the converged full-batch fit: 0.03


# Collapsed fits are always recyclable -----------------------------------------------------------
def rbf(A, B, lengthscale, variance):
    distance = ((A[:, None, :] - B[None, :, :]) / lengthscale) ** 2
    return variance * np.exp(-0.5 * distance.sum(-1))


@pytest.mark.parametrize("steps", [1, 3, None], ids=["1 step", "3 steps", "converged"])
def test_collapsed_fits_are_always_recyclable(steps):
    """Whatever the hyperparameters (after 1, 3 or all L-BFGS steps, overlapping random
    partitions), a collapsed fit exports the collapsed optimum q(u): its site precision
    S⁻¹ − K⁻¹ is K⁻¹ K_zx K_xz K⁻¹ / σ² (recomputed here in numpy), positive semi-definite,
    so the ensemble bound of the modules is bounded and recycling never needs a repair."""
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 6, (150, 2))
    y = np.sin(X[:, 0]) * np.cos(X[:, 1]) + 0.05 * rng.normal(size=150)
    partition = partition_random(150, 3, seed=1)
    spec = LocalFitSpec(num_inducing=7, ard=True)
    config = default_config(spec) if steps is None else replace(default_config(spec),
                                                                steps=steps, tol=None)
    fit = fit_local((X, y, partition), spec, config)
    for k, module in enumerate(fit.modules.values()):
        s = module.standardisation
        X_k = (X[partition.assignments == k] - s.x_mean) / s.x_scale
        Z = module.inducing[0].numpy() if module.inducing.dim() == 3 else module.inducing.numpy()
        lengthscale = module.kernel.lengthscale[0].numpy()
        variance = float(module.kernel.variance[0])
        K = module.prior_cholesky()[0].numpy()
        K = K @ K.T  # with the module's jitter
        S_chol = module.q_chol[0].numpy()
        noise = float(module.likelihood_params["variance"])
        K_zx = rbf(Z, X_k, lengthscale, variance)
        K_inv = np.linalg.inv(K)
        expected = K_inv @ K_zx @ K_zx.T @ K_inv / noise
        site = np.linalg.inv(S_chol @ S_chol.T) - K_inv
        np.testing.assert_allclose(site, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
        assert np.linalg.eigvalsh(expected).min() > -1e-9 * np.abs(expected).max()
    assert ModuleStack.from_modules(fit.modules).indefinite_sites() == []
    meta = recycle(fit.modules, RecycleSpec(num_inducing=10, collapsed=True),
                   TrainConfig(optimizer="lbfgs", lr=1.0, steps=3, tol=None))
    assert meta.model.min_precision_eigenvalue() >= 1.0 - 1e-9  # Λ_w = I + PSD sites
    assert meta.module.info["recycle"]["site_repairs"] == {}


def test_no_fitted_bound_lies_above_its_ceiling_and_one_that_does_is_reported():
    """The ceiling of a Gaussian partition is the log density of its targets met exactly,
    Σ log N(y | y, σ²); every fitted ELBO lies below it. A module whose ELBO lies above it
    (rounding error, not a fit) is named in a RoundingWarning."""
    rng = np.random.default_rng(4)
    X = rng.uniform(-2.0, 2.0, (90, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(90)
    fit = fit_local((X, y, partition_random(len(X), 3, seed=0)),
                    LocalFitSpec(num_inducing=10, restarts=1))
    ceiling = fit.model.elbo_ceiling()
    for k, module in enumerate(fit.modules.values()):
        noise = module.likelihood_params["variance"]
        points = int((torch.as_tensor(fit.model.partition.assignments) == k).sum())
        exact = torch.distributions.Normal(0.0, noise.sqrt()).log_prob(torch.zeros(points))
        assert float(ceiling[k]) == pytest.approx(float(exact.sum()), rel=1e-12)
        assert module.elbo < float(ceiling[k])
    assert beyond_ceiling(fit.model, fit.modules) == []
    tampered = dict(fit.modules)
    name = list(tampered)[1]
    tampered[name] = replace(tampered[name], elbo=float(ceiling[1]) + 1.0)
    with pytest.warns(RoundingWarning, match=r"partitions \[1\]"):
        assert beyond_ceiling(fit.model, tampered) == [1]
