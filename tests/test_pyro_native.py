"""Every model is a Pyro model a Pyro user can train and draw from.

For each model (local SVGPs uncollapsed and collapsed, the meta-GP uncollapsed and collapsed, the
multi-output meta-GP, exact experts): ``pyro.infer.SVI`` with a ``pyro.optim`` optimiser moves
every parameter, in both of Pyro's parameter modes; SVI from the same start reaches the ELBO of
the library's trainer; ``pyro.infer.Predictive`` draws agree with ``predict_y`` (Monte Carlo,
4 standard errors); two models in one process never share parameters; checkpoints hold no data;
every predictor turns into an ArviZ InferenceData that ``az.summary`` and ``az.loo`` accept.
"""

import math
import re
import runpy
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import SVI, JitTraceMeanField_ELBO, Predictive, TraceMeanField_ELBO
from pyrogp_models.inference.experts_fit import fit_exact_experts
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local, local_predictor
from pyrogp_models.inference.natural_gradient import NaturalGradient
from pyrogp_models.inference.recycling import RecycleSpec, recycle, recycle_multioutput
from pyrogp_models.inference.trainer import TrainConfig, train

from pyrogp_models import arviz_bridge
from pyrogp_models.data.partitioners import (
    partition_by_label,
    partition_contiguous,
    partition_random,
)
from pyrogp_models.errors import DataError
from pyrogp_models.models.experts.predictor import ExpertCombination
from pyrogp_models.models.local.collapsed import collapsed_bound
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.modules.routing import RoutedModules

STEPS, LR = 25, 0.01
NO_STEPS = TrainConfig(steps=0)


def series(n=120, seed=0, labels=False):
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0, 6, size=(n, 1)), axis=0)
    f = np.sin(1.5 * X[:, 0])
    if labels:
        return X, (rng.uniform(size=n) < 1 / (1 + np.exp(-3 * f))).astype(float)
    return X, 2.0 + 0.5 * f + 0.1 * rng.standard_normal(n)


# Models under test, each built fresh at its start: (model, predictor, X_data, y_data) ------------
def local_model(collapsed=False, likelihood="gaussian"):
    X, y = series(labels=likelihood == "bernoulli")
    fit = fit_local((X, y, partition_contiguous(X, 3)),
                    LocalFitSpec(num_inducing=5, collapsed=collapsed, likelihood=likelihood),
                    NO_STEPS)
    return fit.model, fit.predictor, X, y


def trained_modules(collapsed=True, seed=0):
    X, y = series(seed=seed)
    return fit_local((X, y, partition_contiguous(X, 3)),
                     LocalFitSpec(num_inducing=6, collapsed=collapsed)).modules, X, y


def meta_model(collapsed=False):
    modules, X, y = trained_modules()
    fit = recycle(modules, RecycleSpec(num_inducing=8, collapsed=collapsed), NO_STEPS)
    return fit.model, fit.module, X, y


def multioutput_model():
    X, y = series(90)
    labels = np.repeat(np.arange(3), 30)
    modules = fit_local((X, y, partition_by_label(labels, "output")),
                        LocalFitSpec(num_inducing=5)).modules
    fit = recycle_multioutput(modules, 2, RecycleSpec(num_inducing=6), NO_STEPS)
    return fit.model, fit.predictor("part001"), X, y


def experts_model():
    X, y = series(60)
    fit = fit_exact_experts((X, y, partition_random(60, 3, 0)), config=NO_STEPS)
    return fit.model, fit.predictor, X, y


MODELS = {
    "local": local_model,
    "local-bernoulli": lambda: local_model(likelihood="bernoulli"),
    "local-collapsed": lambda: local_model(collapsed=True),
    "meta": meta_model,
    "meta-collapsed": lambda: meta_model(collapsed=True),
    "multioutput": multioutput_model,
    "experts": experts_model,
}


@pytest.mark.parametrize("kind", MODELS)
def test_svi_moves_every_parameter(kind, param_mode):
    model = MODELS[kind]()[0]
    before = {name: p.detach().clone() for name, p in model.named_parameters()
              if p.requires_grad}
    assert before
    svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": LR}), TraceMeanField_ELBO())
    for _ in range(3):
        assert math.isfinite(svi.step())
    unmoved = [name for name, p in model.named_parameters()
               if p.requires_grad and torch.equal(p.detach(), before[name])]
    assert unmoved == []


@pytest.mark.parametrize("kind", MODELS)
def test_svi_reaches_the_trainers_elbo(kind):
    by_trainer, by_svi = MODELS[kind]()[0], MODELS[kind]()[0]
    result = train(by_trainer, config=TrainConfig(lr=LR, steps=STEPS, tol=None))
    svi = SVI(by_svi.model, by_svi.guide, pyro.optim.Adam({"lr": LR}), TraceMeanField_ELBO())
    losses = [svi.step() for _ in range(STEPS)]
    assert losses[-1] == pytest.approx(result.losses[-1], rel=1e-4)
    elbo = TraceMeanField_ELBO()
    final = [elbo.loss(m.model, m.guide) for m in (by_trainer, by_svi)]
    assert final[1] == pytest.approx(final[0], rel=1e-4)
    assert final[0] < result.losses[0]  # training did something


def predictive_draws(kind, model, X_data, predictor, num_samples):
    """Posterior-predictive draws of y at X_data by pyro.infer.Predictive, in data units."""
    predictive = Predictive(model.predictive_model, guide=model.predictive_guide,
                            num_samples=num_samples, parallel=True)
    s = predictor.standardisation
    if kind.startswith("local"):
        draws = predictive()[f"{model._pyro_name}.y"]  # at the bound data, in data order
    elif kind == "multioutput":
        X_model = torch.as_tensor(s.transform_x(X_data))
        draws = predictive(X_model)[f"{model._pyro_name}.y.part001"]
    else:
        X_model = torch.as_tensor(s.transform_x(X_data))
        draws = predictive(X_model)[f"{model._pyro_name}.y"]
        if kind == "experts":
            draws = draws[:, 1]  # expert 1
    return s.inverse_y_mean(draws) if predictor.likelihood().standardise_targets else draws


@pytest.mark.parametrize("kind", MODELS)
def test_predictive_draws_match_predict_y(kind):
    model, predictor, X, y = MODELS[kind]()
    train(model, config=TrainConfig(lr=0.05, steps=40, tol=None))
    if kind == "experts":  # expert 1, exported exactly as a module
        predictor = list(model.to_modules(predictor.standardisation).values())[1]
    elif kind.startswith("local"):  # the trained modules, routed
        predictor = local_predictor(model.to_modules(predictor.standardisation),
                                    model.partition)
    elif kind.startswith("meta"):
        predictor = model.to_module()
    num_samples = 6000
    draws = predictive_draws(kind, model, X, predictor, num_samples)
    rows = [5, 20, 40, 55]
    mean, var = predictor.predict_y(X[rows])
    draws = draws[:, rows]
    assert (draws.mean(0) - mean).abs().max() < 4 * (var / num_samples).sqrt().max()
    if not predictor.is_classifier:
        se_var = var * math.sqrt(2.0 / (num_samples - 1))
        assert bool(((draws.var(0) - var).abs() < 4 * se_var).all())


def test_two_models_in_the_global_store_keep_their_own_parameters(param_mode):
    first, second = local_model()[0], local_model()[0]
    assert first._pyro_name != second._pyro_name
    svi = SVI(first.model, first.guide, pyro.optim.Adam({"lr": 0.05}), TraceMeanField_ELBO())
    untouched = {name: p.detach().clone() for name, p in second.named_parameters()}
    for _ in range(3):
        svi.step()
        # evaluating the second model between steps must not swap in the first one's values
        TraceMeanField_ELBO().loss(second.model, second.guide)
    for name, p in second.named_parameters():
        assert torch.equal(p.detach(), untouched[name]), name
    moved = dict(first.named_parameters())
    assert any(not torch.equal(moved[name].detach(), untouched[name]) for name in untouched)


@pytest.mark.parametrize("kind", ["local", "meta", "experts"])
def test_checkpoints_hold_no_data(kind, tmp_path):
    model, _, X, y = MODELS[kind]()
    path = tmp_path / "fit.safetensors"
    train(model, config=TrainConfig(steps=3, tol=None, checkpoint=path))
    content = path.read_bytes() + path.with_suffix(".safetensors.json").read_bytes()
    standardised = (y - y.mean()) / y.std()
    for value in [*X[:20, 0], *standardised[:20], *y[:20]]:
        for dtype in (np.float64, np.float32):
            assert np.asarray(value, dtype=dtype).tobytes() not in content


def test_offset_shifts_the_latent_mean_of_the_local_gps():
    """An offset c in the model is the same objective as the targets y − c."""
    model = local_model()[0]
    elbo = TraceMeanField_ELBO()
    offset = torch.linspace(-0.5, 0.5, model.num_points)
    with_offset = elbo.loss(model.model, model.guide, offset=offset)
    for group, index in zip(model.groups, model._group_index, strict=True):
        group.data_y = group.data_y - offset[index] * group.data_mask
    assert elbo.loss(model.model, model.guide) == pytest.approx(with_offset, rel=1e-12)


def test_one_unit_natural_step_on_a_gaussian_meta_gp_reaches_its_collapsed_optimum():
    meta = meta_model()[0]
    with torch.no_grad():
        meta.q_mean = torch.randn(meta.num_inducing)
        meta.q_sqrt = 0.5 * torch.eye(meta.num_inducing)
    optimum = float(meta.collapsed_bound())
    assert float(meta.bound()) < optimum - 1.0
    NaturalGradient(meta, 1.0)(lambda: TraceMeanField_ELBO().differentiable_loss(meta.model,
                                                                                meta.guide))
    assert float(meta.bound()) == pytest.approx(optimum, rel=1e-8)


@pytest.mark.filterwarnings("ignore::pyrogp_models.errors.NotConvergedWarning")
def test_a_natural_gradient_fit_ends_with_the_optimal_q_for_its_final_hyperparameters():
    """The hooks run once more after the last Adam step: with unit steps on a Gaussian local fit,
    the returned ELBO is the collapsed bound at the final hyperparameters (a q(u) left from the
    step before once left a CO2 block hundreds of nats below its neighbours)."""
    X, y = series()
    fit = fit_local((X, y, partition_contiguous(X, 3)), LocalFitSpec(num_inducing=5,
                                                                     collapsed=False),
                    TrainConfig(lr=0.2, steps=6, natural_gradient_lr=1.0, tol=None))
    with torch.no_grad():
        collapsed = [float(collapsed_bound(svgp, svgp.data_X, svgp.data_y, svgp.data_mask).sum())
                     for svgp in fit.model.svgps]
        elbo = [float(svgp.elbo().sum()) for svgp in fit.model.svgps]
    assert elbo == pytest.approx(collapsed, rel=1e-9)


# ArviZ for every predictor -------------------------------------------------------------------
def predictors():
    modules, X, y = trained_modules()
    meta = recycle(modules, RecycleSpec(num_inducing=8)).module
    return {
        "module": (modules["part000"], X[:40], y[:40]),
        "routed": (RoutedModules(modules, partition_contiguous(X, 3).rule), X, y),
        "combination": (ExpertCombination(modules, "rbcm"), X, y),
        "meta-gp": (meta, X, y),
        "multi-output": (multioutput_model()[1], *series(90)),
        "exact experts": (experts_model()[1], *series(60)),
    }


@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto")
@pytest.mark.parametrize("name", ["module", "routed", "combination", "meta-gp", "multi-output",
                                  "exact experts"])
def test_every_predictor_gives_inference_data_that_arviz_summarises(name):
    predictor, X, y = predictors()[name]
    idata = predictor.to_inference_data(X, y, num_samples=200)
    for group in ("posterior", "posterior_predictive", "log_likelihood", "observed_data"):
        assert arviz_bridge.group(idata, group) is not None
    assert arviz_bridge.group(idata, "posterior")["f"].shape == (1, 200, len(y))
    summary = arviz_bridge.summary(idata, var_names=["f"])
    assert len(summary) == len(y)
    loo = arviz_bridge.loo(idata)
    exact = float(predictor.log_predictive(X, y).sum())
    assert loo.elpd_loo + loo.p_loo == pytest.approx(exact, abs=0.05 * abs(exact) + 1.0)


# The Pyro example of the README and the docs ---------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def own_pyro_example(name: str) -> str:
    if name == "README":
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        section = re.search(r"^## In your own Pyro code\n(.*?)(?=^## )", readme, re.S | re.M)
        return re.search(r"```python\n(.*?)```", section.group(1), re.S).group(1)
    return (ROOT / name).read_text(encoding="utf-8")


def alpha_prior(namespace) -> tuple[torch.Tensor, torch.Tensor]:
    site = pyro.poutine.trace(namespace["model"]).get_trace().nodes["alpha"]
    return site["fn"].loc, site["fn"].scale


@pytest.mark.parametrize("name", ["README", "docs/examples/own_pyro.py"])
def test_the_own_pyro_example_refits_after_clearing_the_store_with_its_prior_fixed(
        name, tmp_path, monkeypatch):
    """The example's prior α ~ N(0, 1) stays N(0, 1) while SVI trains q(α), and a refit after
    ``pyro.clear_param_store()`` starts again from the guide's initial values (a guide that
    passed the prior's own zeros tensor to ``pyro.param`` moved the prior with q and restarted
    from a negative scale)."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "example.py"
    script.write_text(own_pyro_example(name))
    namespace = runpy.run_path(str(script), run_name="__main__")
    loc, scale = alpha_prior(namespace)
    assert torch.equal(loc, torch.zeros_like(loc)) and torch.equal(scale, torch.ones_like(scale))
    assert float(pyro.param("alpha_loc").abs().max()) > 1e-3  # q(α) did move
    pyro.clear_param_store()
    svi = SVI(namespace["model"], namespace["guide"], pyro.optim.Adam({"lr": 0.01}),
              TraceMeanField_ELBO())
    losses = [svi.step() for _ in range(5)]
    assert all(math.isfinite(loss) for loss in losses)
    loc, scale = alpha_prior(namespace)
    assert torch.equal(loc, torch.zeros_like(loc)) and torch.equal(scale, torch.ones_like(scale))
    assert float(pyro.param("alpha_scale").min()) > 0.05  # restarted near 0.1


def test_local_predictive_at_new_inputs_matches_the_routed_modules():
    """``Predictive`` on ``predictive_model(X_new)`` (model units, routed by the partition's
    data-unit rule through the standardisation) draws y like the routed modules predict it;
    the new points leave some partitions empty."""
    X, y = series()
    fit = fit_local((X, y, partition_contiguous(X, 4)), LocalFitSpec(num_inducing=6))
    X_new = np.array([[0.3], [0.9], [4.8], [5.9], [5.1]])
    s = fit.standardisation
    num_samples = 6000
    draws = Predictive(fit.model.predictive_model, guide=fit.model.predictive_guide,
                       num_samples=num_samples, parallel=True)(
        torch.as_tensor(s.transform_x(X_new)))[f"{fit.model._pyro_name}.y"]
    draws = s.inverse_y_mean(draws)
    mean, var = fit.predictor.predict_y(X_new)
    assert (draws.mean(0) - mean).abs().max() < 4 * (var / num_samples).sqrt().max()
    se_var = var * math.sqrt(2.0 / (num_samples - 1))
    assert bool(((draws.var(0) - var).abs() < 4 * se_var).all())


def test_routing_new_inputs_without_the_standardisation_is_refused_in_one_line():
    X, y = series()
    X = 10.0 * X + 100.0  # data units far from the model units
    partition = partition_contiguous(X, 3)
    s = fit_local((X, y, partition), LocalFitSpec(num_inducing=5), NO_STEPS).standardisation
    gps = LocalGPs(torch.as_tensor(s.transform_x(X)), torch.as_tensor(s.transform_y(y)),
                   partition, 5)
    with pytest.raises(DataError, match="standardisation"):
        gps.predictive_model(torch.zeros(2, 1))
    routed = LocalGPs(torch.as_tensor(s.transform_x(X)), torch.as_tensor(s.transform_y(y)),
                      partition, 5, standardisation=s)
    np.testing.assert_array_equal(routed.route(torch.as_tensor(s.transform_x(X))),
                                  partition.assignments)


def test_local_minibatches_are_a_subsampled_plate_without_replacement():
    X, y = series()
    gps = local_model()[0]
    for group in gps.groups:
        group.batch_size = 7
    trace = pyro.poutine.trace(gps.model).get_trace()
    site = trace.nodes[f"{gps.groups[0]._pyro_get_fullname('data')}"]
    (frame,) = [f for f in site["cond_indep_stack"] if f.name.endswith("points")]
    size = gps.groups[0].data_X.shape[1]
    assert frame.size == 7 and site["scale"] == pytest.approx(size / 7)
    positions = trace.nodes[frame.name]["value"]
    assert len(positions.unique()) == 7 and int(positions.max()) < size
    assert site["fn"].batch_shape == (7,)


def test_no_fit_leaves_parameters_in_the_global_store():
    local_model()
    trained_modules(collapsed=False)
    meta_model()
    multioutput_model()
    experts_model()
    assert list(pyro.get_param_store().keys()) == []
    X, y = series()
    fit = fit_local((X, y, partition_contiguous(X, 3)), LocalFitSpec(num_inducing=5),
                    TrainConfig(steps=2, tol=None, global_param_store=True))
    assert any(key.startswith(fit.model._pyro_name) for key in pyro.get_param_store().keys())


@pytest.mark.parametrize("kind", MODELS)
def test_jit_elbo_gives_the_same_steps(kind):
    """``JitTraceMeanField_ELBO`` trains every model: the same losses as the eager ELBO from the
    same start (the local GPs' batched KL once failed to trace)."""
    runs = []
    for elbo in (TraceMeanField_ELBO(), JitTraceMeanField_ELBO()):
        model = MODELS[kind]()[0]
        pyro.set_rng_seed(0)
        svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": LR}), elbo)
        runs.append([svi.step() for _ in range(3)])
    assert runs[1] == pytest.approx(runs[0], rel=1e-9)
