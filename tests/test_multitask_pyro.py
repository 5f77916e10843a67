"""The multitask models as Pyro models and their fit: ``pyro.infer.SVI`` moves every parameter in
both of Pyro's parameter modes and, from the same start and seed (common random numbers), reaches
the trainer's ELBO; natural gradients where they apply; two models never share parameters;
``fit_multitask_dgp`` trains (spec T7) regression and classification models.

T9 and T10 (the toy comparisons against cGP and iDGP on the toy experiment's fits: five seeds of
5000 steps of four models, about half an hour) run only with ``PYROGP_SLOW=1``; neither
reproduces, and both are marked as expected failures
(``benchmarks/results/multitask_experiments.md``).
"""

import math
import os
import sys

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyrogp_models.inference.multitask_fit import MultitaskFit, MultitaskSpec, fit_multitask_dgp
from pyrogp_models.inference.natural_gradient import NaturalGradient, covariance_gradient
from pyrogp_models.inference.trainer import TrainConfig, train

from helpers import ROOT
from multitask_helpers import randomise, toy_model
from pyrogp_models.layers import ClosedFormGradients
from pyrogp_models.models.multitask import MODELS, toy_grid, toy_tasks

STEPS, LR = 25, 0.01
T9_REASON = ("T9 does not reproduce: cGP (ICM, rank 2) fits the toy at least as well as sMDGP "
             "and mMDGP; see benchmarks/results/multitask_experiments.md")
T10_REASON = ("T10 does not reproduce: mMDGP's RMSE in task 2's gap is below iDGP's on 2 of 5 "
              "seeds (mean 0.271 vs 0.215); see benchmarks/results/multitask_experiments.md")
# ``param_mode`` (tests/conftest.py) runs a test in both of Pyro's parameter modes.


@pytest.mark.parametrize("kind", MODELS)
def test_svi_moves_every_parameter(kind, param_mode):
    model = toy_model(kind, batch_size=16)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": LR}), TraceMeanField_ELBO())
    for _ in range(3):
        assert math.isfinite(svi.step())
    unmoved = [name for name, p in model.named_parameters()
               if torch.equal(p.detach(), before[name])]
    assert unmoved == []


@pytest.mark.parametrize("kind,options", [("smdgp", {}), ("mmdgp", {"batch_size": 12}),
                                          ("cmdgp", {"minibatch": "stratified",
                                                     "batch_size": 12}),
                                          ("igp", {}), ("cgp", {})])
def test_svi_reaches_the_trainers_elbo(kind, options):
    by_trainer, by_svi = toy_model(kind, **options), toy_model(kind, **options)
    result = train(by_trainer, config=TrainConfig(lr=LR, steps=STEPS, tol=None, seed=3))
    pyro.set_rng_seed(3)
    svi = SVI(by_svi.model, by_svi.guide, pyro.optim.Adam({"lr": LR}), TraceMeanField_ELBO())
    losses = [svi.step() for _ in range(STEPS)]
    assert losses[-1] == pytest.approx(result.losses[-1], rel=1e-4)
    noise = None if not by_svi.is_deep else torch.randn(2, len(by_svi.data_y),
                                                          by_svi.latent.noise_width)
    final = [float(m.elbo(noise=noise)) for m in (by_trainer, by_svi)]
    assert final[1] == pytest.approx(final[0], rel=1e-4)


def test_natural_gradients_step_a_deep_gps_gaussian_top_layer_only():
    model = toy_model("smdgp")
    step = NaturalGradient(model, 1.0)
    assert [layer for layer, _ in step.targets] == [model.top.layer]
    inner = model.latent.shared.layer
    before = inner.q_mean.detach().clone()
    noise = torch.randn(1, len(model.data_y), model.latent.noise_width)
    start = float(model.elbo(noise=noise))
    step(lambda: -model.elbo(noise=noise))   # a unit step to the optimum for its own draws
    assert float(model.elbo(noise=noise)) > start and torch.equal(inner.q_mean, before)
    with pytest.raises(ValueError, match="need a Gaussian likelihood"):
        NaturalGradient(toy_model("smdgp", likelihood="bernoulli"), 1.0)


@pytest.mark.parametrize("kind", ["igp", "cgp", "smdgp", "mmdgp", "cmdgp"])
def test_closed_form_top_layer_gradients_are_autograds_of_the_data_term(kind):
    """The natural-gradient step's declared ∂E/∂m and ∂E/∂S of the top layer's q(v) equal
    autograd's of the data term on the same draws (off the prior, with a non-zero linear top
    mean where the model has one)."""
    model = randomise(toy_model(kind, num_samples=3))
    if getattr(model.top, "mean_weights", None) is not None:
        with torch.no_grad():
            model.top.mean_weights.copy_(torch.randn(model.top.mean_weights.shape))
    layer = model.top.layer
    torch.manual_seed(5)
    by_mean, by_cov = model.top_data_gradients()
    torch.manual_seed(5)
    data = model.data_terms(model.draw_batch()).sum()
    mean_grad, sqrt_grad = torch.autograd.grad(data, layer.variational_parameters())
    torch.testing.assert_close(by_mean.reshape(-1), mean_grad.reshape(-1), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(by_cov, covariance_gradient(layer.q_sqrt.detach(), sqrt_grad),
                               rtol=1e-10, atol=1e-10)
    [(top, declared)] = [(t, o) for t, o in NaturalGradient(model, 1.0).targets]
    assert top is layer and isinstance(declared, ClosedFormGradients)


@pytest.mark.parametrize("kind", ["igp", "cgp"])
def test_the_collapsed_bound_is_the_elbo_at_the_optimal_q(kind):
    """Titsias' bound of a single-layer Gaussian model equals its ELBO once a unit natural step
    has put q(v) at the optimum, and no other q(v) beats it; with tasks of different sizes (padded
    slots) its gradient is finite."""
    model = randomise(toy_model(kind, gap=(0.3, 0.6), coregionalisation="lmc"))
    assert not bool(model.data_mask.all())                       # padded slots exist
    bound = model.collapsed_bound()
    hyper = [p for name, p in model.named_parameters() if "q_" not in name]
    assert all(bool(torch.isfinite(g).all()) for g in torch.autograd.grad(bound, hyper))
    assert float(model.elbo()) < float(bound) - 1e-3               # randomised q: below it
    NaturalGradient(model, 1.0)(lambda: -model.elbo())
    assert float(model.elbo()) == pytest.approx(float(bound), rel=1e-10, abs=1e-10)
    with model.collapsed_objective():
        assert not any(p.requires_grad for p in model.top.layer.variational_parameters())
        loss = TraceMeanField_ELBO().differentiable_loss(model.model, model.guide)
        assert float(loss) == pytest.approx(-float(bound), rel=1e-12)
    assert all(p.requires_grad for p in model.top.layer.variational_parameters())


def test_a_unit_natural_step_puts_gaussian_igp_at_its_optimum():
    model = toy_model("igp")
    step = NaturalGradient(model, 1.0)

    def loss():
        return TraceMeanField_ELBO().differentiable_loss(model.model, model.guide)

    start = float(model.elbo())
    step(loss)
    optimum = float(model.elbo())
    step(loss)
    assert optimum > start + 1.0
    assert float(model.elbo()) == pytest.approx(optimum, rel=1e-9)


@pytest.mark.parametrize("kind,likelihood", [("cgp", "gaussian"), ("igp", "bernoulli")])
def test_safeguarded_natural_gradients_never_lower_the_elbo(kind, likelihood):
    model = toy_model(kind, likelihood=likelihood)
    elbos = [float(model.elbo())]
    step = NaturalGradient(model, 1.0)
    for _ in range(4):
        step(lambda: TraceMeanField_ELBO().differentiable_loss(model.model, model.guide))
        elbos.append(float(model.elbo()))
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(elbos, elbos[1:], strict=False))
    assert elbos[-1] > elbos[0]


def test_two_models_in_the_global_store_keep_their_own_parameters(param_mode):
    first, second = toy_model("mmdgp"), toy_model("mmdgp")
    assert first._pyro_name != second._pyro_name
    untouched = {name: p.detach().clone() for name, p in second.named_parameters()}
    svi = SVI(first.model, first.guide, pyro.optim.Adam({"lr": 0.05}), TraceMeanField_ELBO())
    for _ in range(3):
        svi.step()
        TraceMeanField_ELBO().loss(second.model, second.guide)
    for name, p in second.named_parameters():
        assert torch.equal(p.detach(), untouched[name]), name


# The fit ----------------------------------------------------------------------------------------
def test_training_increases_the_elbo():
    fit = fit_multitask_dgp(toy_tasks(30), MultitaskSpec(model="mmdgp", num_inducing=10,
                                                         warm_start=False),
                            TrainConfig(lr=0.01, steps=300, tol=None))
    assert isinstance(fit, MultitaskFit) and fit.result.steps == 300
    losses = np.asarray(fit.result.losses)
    assert np.isfinite(losses).all()
    assert losses[-100:].mean() < losses[:100].mean() - 10
    X, _ = toy_grid(7)
    mean, var = fit.predictor.predict_y(X, np.zeros(7))
    assert mean.shape == var.shape == (7,) and bool((var > 0).all())


@pytest.mark.parametrize("likelihood,options", [("bernoulli", {}),
                                                ("categorical", {"num_classes": 3})])
def test_classifiers_fit_and_predict_class_probabilities(likelihood, options):
    pairs = toy_tasks(25)
    labels = [(X, np.digitize(y, np.quantile(y, [0.5] if not options else [1 / 3, 2 / 3])))
              for X, y in pairs]
    fit = fit_multitask_dgp(labels, MultitaskSpec(model="smdgp", likelihood=likelihood,
                                                  likelihood_options=options, num_inducing=6),
                            TrainConfig(lr=0.02, steps=60, tol=None))
    X, tasks = labels[1][0][:5], np.ones(5, dtype=int)
    probs, _ = fit.predictor.predict_y(X, tasks)
    if options:
        assert probs.shape == (5, 3) and torch.allclose(probs.sum(-1), torch.ones(5))
    else:
        assert probs.shape == (5,) and bool(((probs > 0) & (probs < 1)).all())
    assert bool(torch.isfinite(fit.predictor.log_predictive(X, labels[1][1][:5], tasks)).all())


# T9, T10 (slow) ---------------------------------------------------------------------------------
SLOW = pytest.mark.skipif(not os.environ.get("PYROGP_SLOW"),
                          reason="5 seeds × 5000 steps of four models; set PYROGP_SLOW=1")


@pytest.fixture(scope="module")
def toy_comparisons():
    """T9 and T10 read off the toy experiment's own fits (benchmarks/multitask_experiments.py:
    the gap (0.4, 0.6) in task 2, M = 20, 5000 Adam steps for the deep models, L-BFGS for cGP,
    five seeds)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from multitask_experiments import FULL, toy_claims, toy_job

    runs = {kind: [toy_job(kind, seed, FULL) for seed in FULL.toy_seeds]
            for kind in ("smdgp", "mmdgp", "idgp", "cgp")}
    return toy_claims(runs)


@SLOW
@pytest.mark.xfail(strict=True, reason=T9_REASON)
def test_toy_nonlinear_tasks_favour_the_multitask_dgp_over_icm(toy_comparisons):
    t9, _ = toy_comparisons
    assert t9["met"], t9


@SLOW
@pytest.mark.xfail(strict=True, reason=T10_REASON)
def test_toy_transfer_into_a_gap_of_task_two(toy_comparisons):
    _, t10 = toy_comparisons
    assert t10["met"], t10


def _elbo_estimate(model, estimator, particles: int = 400) -> tuple[float, float]:
    """An ELBO (negated loss) as the mean of ``particles`` single-draw estimates, and its
    Monte Carlo standard error."""
    pyro.set_rng_seed(11)
    with torch.no_grad():
        draws = torch.tensor([-estimator.loss(model.model, model.guide)
                              for _ in range(particles)], dtype=torch.float64)
    return float(draws.mean()), float(draws.std() / math.sqrt(particles))


@pytest.mark.parametrize("kind", MODELS)
def test_trace_elbo_agrees_with_trace_mean_field_elbo(kind):
    """Both estimate the same ELBO (Trace_ELBO with a sampled log q − log p, TraceMeanField
    with the KL in closed form): finite and within five standard errors of their difference of
    each other, at the start and after training (a q(u) scale of 1e-5 once made Trace_ELBO's
    loss −1e54 while TraceMeanField's was finite)."""
    model = toy_model(kind)
    for stage in ("start", "trained"):
        if stage == "trained":
            train(model, config=TrainConfig(lr=0.01, steps=200, tol=None, seed=0))
        (trace, trace_error), (meanfield, meanfield_error) = (
            _elbo_estimate(model, Trace_ELBO()), _elbo_estimate(model, TraceMeanField_ELBO()))
        assert math.isfinite(trace) and math.isfinite(meanfield), stage
        allowed = 5 * math.hypot(trace_error, meanfield_error) + 1e-6 * abs(meanfield)
        assert abs(trace - meanfield) < allowed, (stage, trace, meanfield, allowed)
