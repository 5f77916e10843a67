"""The distributed-kernel GP as a Pyro module: SVI trains every parameter in both parameter modes
and agrees with the library's trainer, Predictive draws agree with the predictor, ArviZ reads its
draws, checkpoints hold no data and two models never share parameters (float64)."""

import math
import struct

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import SVI, JitTraceMeanField_ELBO, Predictive, TraceMeanField_ELBO
from pyrogp_models.inference.distributed_kernel_fit import (
    DistributedKernelSpec,
    fit_distributed_kernel,
)
from pyrogp_models.inference.trainer import TrainConfig, train

from pyrogp_models import arviz_bridge
from pyrogp_models.models.distributed_kernel.construct import build_distributed_kernel_gp

CASES = [("meanfield", "gaussian"), ("joint", "gaussian"), ("meanfield", "bernoulli"),
         ("joint", "bernoulli")]
CASE_IDS = [f"{variational}-{likelihood}" for variational, likelihood in CASES]


def data(likelihood: str, n: int = 120, seed: int = 0):
    """Sorted 1-D inputs on [0, 12] and noisy sin targets (or their signs as 0/1 labels)."""
    generator = torch.Generator().manual_seed(seed)
    X = (torch.rand(n, 1, generator=generator) * 12).sort(0).values
    y = torch.sin(X[:, 0]) + 0.2 * torch.randn(n, generator=generator)
    return X, (y > 0).to(y.dtype) if likelihood == "bernoulli" else y


def model_for(variational: str, likelihood: str, **kwargs):
    """Three regions with learnable cuts and 5 inducing inputs each, the data bound."""
    X, y = data(likelihood)
    return build_distributed_kernel_gp(X, 3, 5, y, lengthscale=0.8, likelihood=likelihood,
                                       variational=variational, learn_cuts=True, **kwargs)


def random_q(model, seed: int = 0) -> None:
    """A q(v) away from the prior (at the prior q(f) is the prior: no gradient for θ, Z, cuts)."""
    generator = torch.Generator().manual_seed(seed)
    eye = torch.eye(model.q_sqrt.shape[-1]).expand(model.q_sqrt.shape)
    model.set_whitened_posterior(
        torch.randn(model.q_mean.shape, generator=generator),
        0.5 * eye + 0.1 * torch.randn(model.q_sqrt.shape, generator=generator).tril(-1))


@pytest.mark.parametrize("variational,likelihood", CASES, ids=CASE_IDS)
def test_svi_moves_every_parameter(param_mode, variational, likelihood):
    """One SVI step with pyro.optim.Adam moves every parameter tensor by about the learning rate
    somewhere: each received a gradient well above rounding (Adam's first step is
    lr·g/(|g| + 10⁻⁸), ±lr for |g| ≫ 10⁻⁸ and 0 for g = 0)."""
    lr = 0.01
    model = model_for(variational, likelihood)
    random_q(model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    expected = {"layer.inducing_unit_unconstrained", "layer.q_mean_unconstrained",
                "layer.q_sqrt_unconstrained", "layer.kernel.kernel.lengthscale_unconstrained",
                "layer.kernel.kernel.variance_unconstrained",
                "layer.kernel.regions.cut_start_unconstrained"}
    assert expected <= set(before)
    svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": lr}), TraceMeanField_ELBO())
    svi.step()
    for name, parameter in model.named_parameters():
        assert float((parameter.detach() - before[name]).abs().max()) >= 0.5 * lr, name


@pytest.mark.parametrize("variational,likelihood", CASES[:3], ids=CASE_IDS[:3])
def test_svi_reaches_the_trainers_elbo(param_mode, variational, likelihood):
    """From the same start, SVI with pyro.optim.Adam and the library's trainer with Adam at the
    same learning rate and number of steps reach the same ELBO."""
    by_svi, by_trainer = (model_for(variational, likelihood) for _ in range(2))
    svi = SVI(by_svi.model, by_svi.guide, pyro.optim.Adam({"lr": 0.01}), TraceMeanField_ELBO())
    start = float(by_svi.elbo())
    for _ in range(30):
        svi.step()
    train(by_trainer, config=TrainConfig(optimizer="adam", lr=0.01, steps=30, tol=None))
    with torch.no_grad():
        reached, reference = float(by_svi.elbo()), float(by_trainer.elbo())
    assert reached > start + 1.0
    assert abs(reached - reference) <= 1e-4 * abs(reference)


@pytest.mark.parametrize("variational,likelihood", CASES[:3], ids=CASE_IDS[:3])
def test_predictive_draws_match_the_predictor(variational, likelihood):
    """Predictive(predictive_model, guide=predictive_guide) y draws at a few test points have the
    predictor's predict_y mean and variance (data units), within 4 Monte Carlo standard errors;
    f draws the latent moments of predict_f."""
    X, y = data(likelihood)
    fit = fit_distributed_kernel((X * 3.0 + 1.0, y),
                                 DistributedKernelSpec(3, 5, variational=variational,
                                                       likelihood=likelihood),
                                 TrainConfig(steps=40, lr=0.05, tol=None))
    X_test = torch.tensor([[1.5], [7.0], [14.0], [20.0], [36.5]])
    X_model = fit.standardisation.transform_x(X_test)
    model, predictor = fit.model, fit.predictor
    pyro.set_rng_seed(1)
    with torch.no_grad():
        draws = Predictive(model.predictive_model, guide=model.predictive_guide,
                           num_samples=4000, parallel=True)(X_model)
    name = model._pyro_get_fullname
    assert draws[name("u")].shape == ((4000, 3, 5) if variational == "meanfield" else (4000, 15))
    f, y_draws = draws[name("f")], draws[name("y")]
    if predictor.likelihood().standardise_targets:
        y_draws = fit.standardisation.inverse_y_mean(y_draws)
    for values, (mean, var) in ((f, predictor.predict_f(X_test)),
                                (y_draws, predictor.predict_y(X_test))):
        deviation = values - values.mean(0)
        mean_error = deviation.std(0) / math.sqrt(len(values))
        var_error = (deviation.pow(4).mean(0) - deviation.var(0).square()).sqrt() \
            / math.sqrt(len(values))
        assert bool(((values.mean(0) - mean).abs() <= 4 * mean_error).all())
        assert bool(((values.var(0) - var).abs() <= 4 * var_error + 1e-12).all())
    # sequential draws (Predictive's default) run the same model
    few = Predictive(model.predictive_model, guide=model.predictive_guide, num_samples=3)(X_model)
    assert few[name("y")].shape == (3, len(X_test))


@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto")
def test_inference_data_summary_and_loo():
    X, y = data("gaussian", n=80)
    fit = fit_distributed_kernel((X, y), DistributedKernelSpec(2, 6),
                                 TrainConfig(steps=20, tol=None))
    idata = fit.predictor.to_inference_data(X, y, num_samples=300)
    posterior = arviz_bridge.group(idata, "posterior")
    assert set(posterior.data_vars) == {"u", "f"}
    assert posterior["f"].shape == (1, 300, len(y))
    table = arviz_bridge.summary(idata, var_names=["f"])
    assert len(table) == len(y) and np.isfinite(table["mean"].to_numpy()).all()
    loo = arviz_bridge.loo(idata)
    assert math.isfinite(loo.elpd_loo) and loo.loo_i.shape == (len(y),)
    # the pointwise log-likelihood is evaluated at the observed targets in data units
    log_lik = arviz_bridge.group(idata, "log_likelihood")["y"].to_numpy()[0]
    assert abs(loo.elpd_loo - float(fit.predictor.log_predictive(X, y).sum())) <= 0.2 * len(y)
    assert log_lik.shape == (300, len(y))


def test_checkpoints_hold_no_training_data(tmp_path):
    X, y = data("gaussian", n=60, seed=3)
    checkpoint = tmp_path / "ck.safetensors"
    fit = fit_distributed_kernel((X, y), DistributedKernelSpec(2, 4),
                                 TrainConfig(steps=10, tol=None, checkpoint=checkpoint,
                                             checkpoint_every=5))
    X_model, y_model = fit.model.bound_data()
    contents = checkpoint.read_bytes() + checkpoint.with_suffix(".safetensors.json").read_bytes()
    values = torch.cat([X.flatten(), y, X_model.flatten(), y_model])
    assert len(values) == 240
    # the search finds what a checkpoint does hold: the parameters' bytes (the kernel's: the
    # closing solve moves q after the last checkpoint)
    lengthscale = fit.model.kernel.lengthscale_unconstrained.detach().flatten()[0]
    assert struct.pack("<d", float(lengthscale)) in contents
    for value in values.tolist():
        assert struct.pack("<d", value) not in contents, value
        assert repr(value).encode() not in contents, value
    # the checkpoint does restore the model
    assert set(fit.model.state_dict()) >= {"layer.q_mean_unconstrained"}
    assert not any(key.startswith("data_") for key in fit.model.state_dict())


@pyro.settings.context(module_local_params=False)
def test_two_models_in_the_global_param_store_share_nothing():
    first = model_for("meanfield", "gaussian")
    second = model_for("meanfield", "gaussian", variance=3.0)
    assert first._pyro_name != second._pyro_name
    for model in (first, second):
        SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.01}), TraceMeanField_ELBO()).step()
    names = set(pyro.get_param_store().keys())
    assert {name.split(".", 1)[0] for name in names} == {first._pyro_name, second._pyro_name}
    assert len(names) == 2 * len(list(first.parameters()))
    # each model kept its own signal variance (1 and 3, moved by one Adam step of 0.01)
    assert abs(float(first.kernel.variance) - 1.0) < 0.05
    assert abs(float(second.kernel.variance) - 3.0) < 0.1


@pytest.mark.parametrize("collapsed", [False, True])
def test_jit_tracing_is_refused_in_one_line(collapsed):
    """Pyro's JitTraceMeanField_ELBO would freeze the halo's shape, which depends on ℓ: the model
    refuses to be traced with an error naming the alternative."""
    model = model_for("meanfield", "gaussian")
    model.collapsed = collapsed
    svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.01}), JitTraceMeanField_ELBO())
    with pytest.raises(NotImplementedError, match="cannot be traced.*use TraceMeanField_ELBO"):
        svi.step()
