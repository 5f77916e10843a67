"""Noise correlated across the outputs observed at one input (cGP's default): the per-site
likelihood checked against the exact coregionalised GP with a full noise covariance, its closed
forms against autograd, its Pyro observation against the joint density."""

import math

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyrogp_models.inference.natural_gradient import NaturalGradient, covariance_gradient

from multitask_helpers import randomise
from pyrogp_models.errors import DataError
from pyrogp_models.models.multitask import (
    MultitaskOptions,
    MultitaskPredictor,
    TaskData,
    TaskStandardisation,
    build_model,
)
from pyrogp_models.models.multitask.noise_correlation import SiteCorrelated, SiteLayout

NUM_SITES, NUM_TASKS = 12, 3


def wide_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, TaskData]:
    """Sites x [G, 1], outputs Y [G, T], which are observed [G, T] (about 70 %), and the long
    table of the observed ones."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.linspace(-1, 1, NUM_SITES, dtype=torch.float64)[:, None]
    Y = torch.randn(NUM_SITES, NUM_TASKS, generator=generator, dtype=torch.float64)
    observed = torch.rand(NUM_SITES, NUM_TASKS, generator=generator) > 0.3
    site, task = observed.nonzero().unbind(-1)
    return x, Y, observed, TaskData(x[site], task, Y[site, task], NUM_TASKS)


def correlated_cgp(data: TaskData, **options):
    """cGP (LMC, rank 2) with its noise correlated and its noise variances off their start."""
    model = build_model("cgp", data, MultitaskOptions(jitter=1e-12, **options))
    with torch.no_grad():
        model.site_noise.correlation_raw.copy_(torch.tensor([0.7, -0.4, 0.9]))
        model.likelihood.variance = torch.tensor([0.3, 0.5, 0.2], dtype=torch.float64)
    return model


def exact_covariance(model, X: torch.Tensor, tasks: torch.Tensor, X2: torch.Tensor,
                     tasks2: torch.Tensor) -> torch.Tensor:
    """Σ_r W_tr W_t'r k_r(x, x') + Σ_tt' [x = x'] between two sets of rows."""
    mixing, kernel = model.top.mixing, model.top.layer.kernel
    rank = mixing.shape[-1]

    def points(inputs):
        return inputs[None, None].expand(rank, 1, -1, -1)
    latent = kernel(points(X), points(X2))[:, 0].permute(1, 2, 0)
    scale = model.likelihood.variance.sqrt()
    noise = scale[:, None] * model.site_noise.correlation() * scale
    same = (X[:, None, :] == X2[None, :, :]).all(-1)
    return ((mixing[tasks][:, None] * mixing[tasks2][None] * latent).sum(-1)
            + noise[tasks][:, tasks2] * same)


@torch.no_grad()
def test_with_every_input_inducing_cgp_is_the_exact_gp_with_correlated_noise():
    """Z = X: the collapsed bound is the exact log marginal likelihood, the ELBO after one unit
    natural step equals it, and every hidden output's predictive given its site's observed
    outputs, rows in the fit, is the exact GP's (mean and variance); with C = I the bound
    differs."""
    x, Y, observed, data = wide_data()
    model = correlated_cgp(data, num_inducing=NUM_SITES)
    assert not model.options.learn_inducing                         # Z = X: the exact GP
    K = exact_covariance(model, data.X, data.task, data.X, data.task)
    exact = torch.distributions.MultivariateNormal(torch.zeros(len(data.y)), K)
    bound = float(model.collapsed_bound())
    assert bound == pytest.approx(float(exact.log_prob(data.y)), abs=1e-7)
    NaturalGradient(model, 1.0)(lambda: -model.elbo())
    assert float(model.elbo()) == pytest.approx(bound, abs=1e-8)

    identity = TaskStandardisation(np.zeros(1), np.ones(1), 0.0, 1.0, np.zeros(NUM_TASKS),
                                   np.ones(NUM_TASKS))
    known = torch.where(observed, Y, torch.full_like(Y, math.nan))
    mean, var = MultitaskPredictor(model, identity).predict_given_outputs(x, known,
                                                                          rows_in_fit=True)
    site, task = (~observed).nonzero().unbind(-1)
    cross = exact_covariance(model, x[site], task, data.X, data.task)
    prior = exact_covariance(model, x[site], task, x[site], task).diagonal()
    torch.testing.assert_close(mean[task, site], cross @ torch.linalg.solve(K, data.y),
                               rtol=0, atol=1e-8)
    torch.testing.assert_close(var[task, site],
                               prior - (cross * torch.linalg.solve(K, cross.T).T).sum(-1),
                               rtol=0, atol=1e-8)

    model.site_noise.correlation_raw.zero_()
    assert abs(float(model.collapsed_bound()) - bound) > 1.0


@torch.no_grad()
def test_new_rows_given_their_observed_outputs_are_the_exact_gp_with_those_outputs_added():
    """By default, at inputs the fit never saw with some outputs observed there: every row's
    hidden outputs are the exact GP's predictive given the training rows and that row's
    observed outputs (each row on its own)."""
    x, Y, observed, data = wide_data()
    model = correlated_cgp(data, num_inducing=NUM_SITES)
    NaturalGradient(model, 1.0)(lambda: -model.elbo())
    identity = TaskStandardisation(np.zeros(1), np.ones(1), 0.0, 1.0, np.zeros(NUM_TASKS),
                                   np.ones(NUM_TASKS))
    new_x = (x[:-1] + x[1:])[:5] / 2                                 # between training sites
    new_Y = torch.randn(5, NUM_TASKS, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(9))
    known = torch.tensor([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=torch.bool)
    mean, var = MultitaskPredictor(model, identity).predict_given_outputs(
        new_x, torch.where(known, new_Y, torch.full_like(new_Y, math.nan)))
    for row in range(5):
        seen, hidden = known[row].nonzero()[:, 0], (~known[row]).nonzero()[:, 0]
        X_all = torch.cat([data.X, new_x[row].expand(len(seen), 1)])
        tasks_all, y_all = torch.cat([data.task, seen]), torch.cat([data.y, new_Y[row, seen]])
        K = exact_covariance(model, X_all, tasks_all, X_all, tasks_all)
        at = new_x[row].expand(len(hidden), 1)
        cross = exact_covariance(model, at, hidden, X_all, tasks_all)
        prior = exact_covariance(model, at, hidden, at, hidden).diagonal()
        torch.testing.assert_close(mean[hidden, row], cross @ torch.linalg.solve(K, y_all),
                                   rtol=0, atol=1e-8)
        torch.testing.assert_close(var[hidden, row],
                                   prior - (cross * torch.linalg.solve(K, cross.T).T).sum(-1),
                                   rtol=0, atol=1e-8)


def test_closed_forms_of_the_site_likelihood_match_autograd_and_its_optimum():
    """M < sites (an unexplained variance per latent GP): the declared ∂E/∂m, ∂E/∂S equal
    autograd's of the data term off the prior; after a unit step the ELBO is the collapsed
    bound, whose gradient in the correlation is finite and non-zero."""
    _, _, _, data = wide_data(1)
    model = randomise(correlated_cgp(data, num_inducing=5))
    with torch.no_grad():
        model.site_noise.correlation_raw.copy_(torch.tensor([0.7, -0.4, 0.9]))
    layer = model.top.layer
    by_mean, by_cov = model.top_data_gradients()
    mean_grad, sqrt_grad = torch.autograd.grad(model.data_terms().sum(),
                                               layer.variational_parameters())
    torch.testing.assert_close(by_mean.reshape(-1), mean_grad.reshape(-1), rtol=1e-10,
                               atol=1e-10)
    torch.testing.assert_close(by_cov, covariance_gradient(layer.q_sqrt.detach(), sqrt_grad),
                               rtol=1e-10, atol=1e-10)
    # the same term site by site, unwhitened: log N(y_o | μ_o, Σ_oo) − ½ tr(Σ_oo⁻¹ Cov_q(f_o))
    with torch.no_grad():
        x, Y, observed, _ = wide_data(1)
        features, _, unexplained = model.top.features(x.unsqueeze(0), per_latent=True)
        spread = features @ layer.q_sqrt
        mixing, scale = model.top.mixing, model.likelihood.variance.sqrt()
        noise = scale[:, None] * model.site_noise.correlation() * scale
        reference = 0.0
        for site in range(NUM_SITES):
            o = observed[site].nonzero()[:, 0]
            b, d = spread[o, site], unexplained[0, site]
            cov_f = b @ b.T + (mixing[o] * d) @ mixing[o].T
            mean = features[o, site] @ layer.q_mean.reshape(-1)
            density = torch.distributions.MultivariateNormal(mean, noise[o][:, o])
            reference += (density.log_prob(Y[site, o])
                          - 0.5 * torch.trace(torch.linalg.solve(noise[o][:, o], cov_f)))
        assert float(model.data_terms().sum()) == pytest.approx(float(reference), abs=1e-9)
    bound = model.collapsed_bound()
    [gradient] = torch.autograd.grad(bound, [model.site_noise.correlation_raw])
    assert bool(torch.isfinite(gradient).all()) and float(gradient.abs().max()) > 1e-3
    assert float(model.elbo()) < float(bound) - 1e-3
    NaturalGradient(model, 1.0)(lambda: -model.elbo())
    assert float(model.elbo()) == pytest.approx(float(bound), rel=1e-10, abs=1e-10)


@torch.no_grad()
def test_the_site_observation_is_the_joint_density_and_draws_its_covariance():
    """Per-row log densities of :class:`SiteCorrelated` sum to the joint Gaussian density of
    every site's observed outputs; its draws have the noise covariance across a site."""
    _, Y, observed, data = wide_data(2)
    model = correlated_cgp(data)
    f = torch.randn(len(data.y), dtype=torch.float64)
    observation = model.observation(f, data.X, data.task)
    assert isinstance(observation, SiteCorrelated)
    scale = model.likelihood.variance.sqrt()
    noise = scale[:, None] * model.site_noise.correlation() * scale
    same = (data.X[:, None, :] == data.X[None, :, :]).all(-1)
    joint = torch.distributions.MultivariateNormal(f, noise[data.task][:, data.task] * same)
    assert float(observation.log_prob(data.y).sum()) == pytest.approx(
        float(joint.log_prob(data.y)), abs=1e-10)
    torch.manual_seed(0)
    draws = observation.sample((20000,)) - f
    empirical = torch.cov(draws.T)
    torch.testing.assert_close(empirical, joint.covariance_matrix, rtol=0, atol=0.03)


def test_sites_pair_the_k_th_repeat_of_every_task_at_an_input():
    X = torch.tensor([[0.0], [1.0], [0.0], [0.0], [1.0], [0.0]])
    tasks = torch.tensor([0, 0, 1, 0, 1, 1])
    sites = SiteLayout.of(X, tasks, 2)
    assert sites.mask.sum() == 6 and len(sites.mask) == 3
    for row, (site, task) in enumerate(zip(sites.site.tolist(), tasks.tolist(), strict=True)):
        assert int(sites.rows[site, task]) == row
    # the first and second rows of each task at x = 0 form two sites, x = 1 one
    assert sites.site[0] == sites.site[2] and sites.site[3] == sites.site[5]
    assert sites.site[0] != sites.site[3] and sites.site[1] == sites.site[4]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_outputs_that_copy_each_other_are_refused_with_correlated_noise_only(dtype):
    """b = 2a + 1 at every shared input: one noise, no optimum of its correlation short of
    singular; independent noise takes them."""
    _, _, _, data = wide_data()
    x = torch.linspace(-1, 1, NUM_SITES, dtype=dtype)[:, None]
    a = torch.sin(3 * x[:, 0])
    copied = TaskData(torch.cat([x, x]), torch.repeat_interleave(torch.arange(2), NUM_SITES),
                      torch.cat([a, 2 * a + 1]), 2)
    with pytest.raises(DataError, match="tasks 0 and 1 are exact linear copies"):
        build_model("cgp", copied)
    assert build_model("cgp", copied, MultitaskOptions(noise="independent")).site_noise is None
    assert build_model("cgp", data).site_noise is not None    # distinct outputs are taken


def test_correlated_noise_is_cgp_s_gaussian_full_batch_default_and_refused_elsewhere():
    _, _, _, data = wide_data()
    assert build_model("cgp", data).options.noise == "correlated"
    assert build_model("cgp", data, MultitaskOptions(batch_size=8)).options.noise == \
        "independent"
    assert build_model("igp", data).site_noise is None
    with pytest.raises(ValueError, match="correlated noise needs cgp"):
        build_model("igp", data, MultitaskOptions(noise="correlated"))


@pytest.mark.parametrize("elbo", [TraceMeanField_ELBO, Trace_ELBO])
def test_a_users_svi_trains_the_correlation_and_its_loss_is_the_negative_elbo(elbo, param_mode):
    """A Pyro user's own SVI on the correlated cGP moves every parameter, the noise correlation
    included, and its loss, averaged over many particles, is −ELBO (the ELBO's expected log
    likelihood is exact; SVI's is a Monte Carlo estimate of it)."""
    _, _, _, data = wide_data(3)
    model = randomise(correlated_cgp(data, num_inducing=6))
    pyro.set_rng_seed(0)
    estimate = elbo(num_particles=4000, vectorize_particles=True).loss(model.model, model.guide)
    assert estimate == pytest.approx(-float(model.elbo()), abs=0.5)
    before = {name: p.detach().clone() for name, p in model.named_parameters()
              if p.requires_grad}
    assert any(name.startswith("site_noise.") for name in before)
    svi = SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.01}), elbo())
    for _ in range(3):
        assert math.isfinite(svi.step())
    unmoved = [name for name, p in model.named_parameters()
               if p.requires_grad and torch.equal(p.detach(), before[name])]
    assert unmoved == []
