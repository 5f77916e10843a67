"""The meta-GP of Recyclable GPs (Moreno-Muñoz, Artés-Rodríguez, Álvarez, arXiv 2010.02554),
checked against dense GP formulas written here: one module recycled alone, the Gaussian
full-data identity, the combined bound with raw data (eq. 19), invariances, pyramids (§2.3), the
boundedness guard, and end-to-end fits (the toy concatenation of Fig. 2 and the solar data)."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.recycling import RawData, RecycleSpec, recycle
from pyrogp_models.inference.trainer import TrainConfig, TrainResult, train
from torch.distributions import MultivariateNormal, kl_divergence

from pyrogp_models.data import Standardisation, load_sunspots
from pyrogp_models.data.columns import Columns
from pyrogp_models.data.partitioners import Partition, partition_contiguous
from pyrogp_models.errors import (
    CholeskyError,
    IncompatibleModulesError,
    MixedLikelihoodsError,
    UnboundedBoundError,
)
from pyrogp_models.gaussian import conditionals
from pyrogp_models.kernels import Periodic, Stationary, stationary_covariance, stationary_kernel
from pyrogp_models.likelihoods import make_likelihood
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.models.local.svgp import BatchedSVGP
from pyrogp_models.models.meta.boundedness import UnboundedBoundWarning
from pyrogp_models.models.meta.meta_gp import MetaGP
from pyrogp_models.modules.files import load_module, save_module
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.stack import ModuleStack, clip_site_precisions

IDENTITY = Standardisation(np.zeros(1), np.ones(1), 0.0, 1.0)
LENGTHSCALE, VARIANCE, NOISE, JITTER = 0.7, 1.3, 0.2, 1e-9


# Dense reference formulas ---------------------------------------------------------------------
def kern(A, B, lengthscale=LENGTHSCALE, variance=VARIANCE):
    return stationary_covariance("rbf", A, B, torch.tensor([lengthscale]),
                                 torch.tensor(variance))


def prior(Z, jitter=JITTER):
    K = kern(Z, Z)
    return K + jitter * K.diagonal().mean() * torch.eye(len(Z))


def titsias_posterior(X, y, Z, noise=NOISE):
    """Optimal q(u) = N(K Σ⁻¹K_uf y/σ², K Σ⁻¹ K), Σ = K + K_uf K_fu/σ² (Titsias 2009)."""
    K, K_uf = prior(Z), kern(Z, X)
    sigma = K + K_uf @ K_uf.T / noise
    return K @ torch.linalg.solve(sigma, K_uf @ y) / noise, K @ torch.linalg.solve(sigma, K)


def titsias_bound(X, y, Z, noise=NOISE):
    """log N(y | 0, Q_ff + σ²I) − tr(K_ff − Q_ff)/(2σ²)."""
    K_uf = kern(Z, X)
    Q_ff = K_uf.T @ torch.linalg.solve(prior(Z), K_uf)
    evidence = MultivariateNormal(torch.zeros(len(y)), Q_ff + noise * torch.eye(len(y)))
    return evidence.log_prob(y) - (VARIANCE * len(y) - torch.trace(Q_ff)) / (2 * noise)


def svgp_elbo(X, y, Z, mean_u, cov_u, noise=NOISE):
    """Σ_i E_q[log N(y_i | f_i, σ²)] − KL[q(u) ‖ p(u)] with unwhitened q(u) = N(mean_u, cov_u)."""
    K = prior(Z)
    A = torch.linalg.solve(K, kern(Z, X))
    mean_f = A.T @ mean_u
    var_f = VARIANCE - (A * kern(Z, X)).sum(0) + (A * (cov_u @ A)).sum(0)
    data = (-0.5 * math.log(2 * math.pi * noise) - ((y - mean_f) ** 2 + var_f) / (2 * noise)).sum()
    prior_u = MultivariateNormal(torch.zeros(len(Z)), K)
    return data - kl_divergence(MultivariateNormal(mean_u, cov_u), prior_u)


def make_module(name, Z, mean, cov, num_data=10, elbo=0.0, standardisation=IDENTITY,
                lengthscale=LENGTHSCALE, variance=VARIANCE, likelihood="gaussian", noise=NOISE):
    params = {"variance": torch.tensor(noise)} if likelihood == "gaussian" else {}
    kernel = stationary_kernel("rbf", torch.tensor([[lengthscale]]), torch.tensor([variance]),
                               Z.shape[-1])
    return Module(kernel, likelihood, {},
                  params, Z, mean.reshape(1, -1), torch.linalg.cholesky(cov).unsqueeze(0),
                  num_data, float(elbo), standardisation, JITTER, {"name": name})


def titsias_modules(X, y, Z_of, partitions):
    """One Titsias-optimal module per partition (index arrays); Z_of(k, X_k) gives its Z."""
    modules = {}
    for k, index in enumerate(partitions):
        Z = Z_of(k, X[index])
        mean, cov = titsias_posterior(X[index], y[index], Z)
        modules[f"m{k}"] = make_module(f"m{k}", Z, mean, cov, len(index),
                                       titsias_bound(X[index], y[index], Z))
    return modules


def fixed_meta(modules, Z, **kwargs):
    """A meta-GP whose kernel equals the modules' and whose Z_* and ψ_* are fixed."""
    stack = ModuleStack.from_modules(modules) if modules else None
    return MetaGP(stack, Z, Stationary("rbf", Z.shape[-1], (), False, LENGTHSCALE, VARIANCE),
                  learn_inducing=False, learn_kernel=False, jitter=JITTER, **kwargs)


def unwhitened(meta):
    mean, chol = conditionals.unwhiten(meta.prior_cholesky(), meta.q_mean, meta.q_sqrt)
    return mean.detach(), (chol @ chol.mT).detach()


def set_random_q(meta, scale=0.4):
    size = meta.num_inducing
    with torch.no_grad():
        meta.q_mean = torch.randn(size)
        meta.q_sqrt = torch.tril(scale * torch.randn(size, size), -1) + torch.diag(
            torch.rand(size) * 0.5 + 0.3)


def regression_data(num_points, low=0.0, high=6.0, noise=NOISE, seed=0):
    generator = torch.Generator().manual_seed(seed)
    X = (low + (high - low) * torch.rand(num_points, 1, generator=generator)).sort(0).values
    y = torch.sin(2 * X[:, 0]) + noise ** 0.5 * torch.randn(num_points, generator=generator)
    return X, y


# One module recycled alone -----------------------------------------------------------------
@pytest.fixture
def single_module():
    Z = torch.linspace(0.0, 3.0, 5).unsqueeze(-1)
    X, y = regression_data(30, 0.0, 3.0)
    mean, cov = titsias_posterior(X, y, Z)
    return make_module("one", Z, mean, cov)


def test_single_module_bound_is_minus_kl_to_the_module(single_module):
    meta = fixed_meta({"one": single_module}, single_module.inducing)
    target = MultivariateNormal(single_module.q_mean[0], scale_tril=single_module.q_chol[0])
    for _ in range(3):
        set_random_q(meta)
        expected = -kl_divergence(MultivariateNormal(*unwhitened(meta)), target)
        torch.testing.assert_close(meta.bound().detach(), expected, rtol=1e-5, atol=0)


def test_single_module_optimum_is_the_module(single_module):
    meta = fixed_meta({"one": single_module}, single_module.inducing)
    meta.set_optimal_posterior()
    mean, cov = unwhitened(meta)
    torch.testing.assert_close(mean, single_module.q_mean[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(cov, single_module.q_chol[0] @ single_module.q_chol[0].T,
                               rtol=0, atol=1e-6)
    assert float(meta.collapsed_bound()) == pytest.approx(0.0, abs=1e-6)


def test_adam_reaches_the_single_module(single_module):
    meta = fixed_meta({"one": single_module}, single_module.inducing)
    train(meta, config=TrainConfig(optimizer="adam", lr=0.1, steps=250, tol=None))
    target = MultivariateNormal(single_module.q_mean[0], scale_tril=single_module.q_chol[0])
    assert kl_divergence(MultivariateNormal(*unwhitened(meta)), target) < 1e-3


# Gaussian full-data identity ------------------------------------------------------------------
def test_modules_with_shared_inducing_inputs_reproduce_the_full_data_svgp():
    X, y = regression_data(40)
    Z = torch.linspace(0.0, 6.0, 9).unsqueeze(-1)
    partitions = torch.arange(40).reshape(4, 10)
    modules = titsias_modules(X, y, lambda k, X_k: Z, partitions)
    meta = fixed_meta(modules, Z)
    elbo_sum = sum(m.elbo for m in modules.values())
    for _ in range(3):
        set_random_q(meta)
        torch.testing.assert_close(elbo_sum + meta.bound().detach(),
                                   svgp_elbo(X, y, Z, *unwhitened(meta)), rtol=1e-6, atol=0)
    meta.set_optimal_posterior()
    mean, cov = unwhitened(meta)
    full_mean, full_cov = titsias_posterior(X, y, Z)
    assert (mean - full_mean).abs().max() < 1e-5
    assert (cov - full_cov).abs().max() < 1e-5
    torch.testing.assert_close(elbo_sum + meta.collapsed_bound(), titsias_bound(X, y, Z),
                               rtol=1e-6, atol=0)


def test_modules_at_their_data_recover_the_exact_gp():
    """Z_k = X_k, Z_* = X (a grid, so that K_XX is well conditioned and the jitter ε on K_**
    perturbs the predictive by far less than the tolerance)."""
    X = torch.linspace(0.0, 6.0, 16).unsqueeze(-1)
    y = torch.sin(2 * X[:, 0]) + 0.4 * torch.randn(16)
    partitions = torch.randperm(16, generator=torch.Generator().manual_seed(1)).reshape(4, 4)
    modules = titsias_modules(X, y, lambda k, X_k: X_k, partitions)
    module = fixed_meta(modules, X, collapsed=True).to_module()
    X_test = torch.linspace(-1.0, 7.0, 50).unsqueeze(-1)
    K_noisy = kern(X, X) + NOISE * torch.eye(16)
    exact_mean = kern(X_test, X) @ torch.linalg.solve(K_noisy, y)
    exact_var = VARIANCE - (kern(X_test, X) * torch.linalg.solve(K_noisy, kern(X, X_test)).T
                            ).sum(-1)
    mean, var = module.predict_f(X_test)
    assert (mean - exact_mean).abs().max() < 1e-5
    assert (var - exact_var).abs().max() < 1e-5
    evidence = MultivariateNormal(torch.zeros(16), K_noisy).log_prob(y)
    assert module.elbo == pytest.approx(float(evidence), rel=1e-6)


# Combined bound with raw data (eq. 19) ----------------------------------------------------------
def test_combined_bound_without_modules_is_the_svgp_elbo():
    X, y = regression_data(30)
    Z = torch.linspace(0.0, 6.0, 7).unsqueeze(-1)
    meta = fixed_meta(None, Z, likelihood=make_likelihood("gaussian", variance=NOISE),
                      raw_X=X, raw_y=y)
    set_random_q(meta)
    torch.testing.assert_close(meta.bound().detach(), svgp_elbo(X, y, Z, *unwhitened(meta)),
                               rtol=1e-10, atol=0)
    torch.testing.assert_close(meta.collapsed_bound().detach(), titsias_bound(X, y, Z),
                               rtol=1e-8, atol=0)


def test_combined_bound_with_bernoulli_raw_data_matches_the_batched_svgp():
    X, _ = regression_data(30)
    labels = (torch.sin(2 * X[:, 0]) > 0).double()
    Z = torch.linspace(0.0, 6.0, 7).unsqueeze(-1)
    meta = fixed_meta(None, Z, likelihood=make_likelihood("bernoulli"), raw_X=X, raw_y=labels)
    set_random_q(meta)
    svgp = BatchedSVGP(Z.unsqueeze(0), Stationary("rbf", 1, (1, 1), False, LENGTHSCALE, VARIANCE),
                       make_likelihood("bernoulli", (1,)), jitter=JITTER)
    with torch.no_grad():
        svgp.q_mean = meta.q_mean.reshape(1, 1, -1)
        svgp.q_sqrt = meta.q_sqrt.reshape(1, 1, 7, 7)
    expected = svgp.elbo(X.unsqueeze(0), labels.unsqueeze(0), torch.ones(1, 30, dtype=bool))
    torch.testing.assert_close(meta.bound().detach(), expected[0].detach(), rtol=1e-10, atol=0)


def test_module_plus_raw_data_equals_titsias_on_the_union():
    X, y = regression_data(40)
    Z = torch.linspace(0.0, 6.0, 9).unsqueeze(-1)
    first, second = torch.arange(0, 40, 2), torch.arange(1, 40, 2)
    modules = titsias_modules(X, y, lambda k, X_k: Z, [first])
    meta = fixed_meta(modules, Z, likelihood=make_likelihood("gaussian", variance=NOISE),
                      raw_X=X[second], raw_y=y[second], collapsed=True)
    meta.set_optimal_posterior()
    mean, cov = unwhitened(meta)
    full_mean, full_cov = titsias_posterior(X, y, Z)
    assert (mean - full_mean).abs().max() < 1e-5
    assert (cov - full_cov).abs().max() < 1e-5
    torch.testing.assert_close(modules["m0"].elbo + meta.collapsed_bound(),
                               titsias_bound(X, y, Z), rtol=1e-6, atol=0)


def test_combined_bound_learns_the_new_datas_noise():
    """Raw data with noise variance 0.04 (std 0.2); the module's noise is 0.2 (a wrong guess)."""
    X, y = regression_data(200, noise=0.04, seed=3)
    Z = torch.linspace(0.0, 6.0, 12).unsqueeze(-1)
    modules = titsias_modules(X, y, lambda k, X_k: Z, [torch.arange(0, 40)])
    raw = RawData(X[40:].numpy(), y[40:].numpy())
    config = TrainConfig(optimizer="lbfgs", lr=1.0, steps=8, window=4, tol=1e-9)
    module = recycle(modules, RecycleSpec(12, collapsed=True), config, raw).module
    assert module.info["likelihood_source"] == "raw data"
    assert 0.025 < float(module.likelihood_params["variance"]) < 0.06


def test_recycle_without_modules_fits_the_raw_data(tmp_path):
    X, y = regression_data(80, noise=0.01, seed=4)
    config = TrainConfig(optimizer="lbfgs", lr=1.0, steps=5, tol=None)
    module = recycle({}, RecycleSpec(15, collapsed=True), config,
                     RawData(X.numpy(), y.numpy())).module
    assert module.standardisation.x_mean == pytest.approx(X.mean(0).numpy())
    X_test = torch.linspace(0.5, 5.5, 40).unsqueeze(-1)
    mean, _ = module.predict_y(X_test)
    assert (mean - torch.sin(2 * X_test[:, 0])).abs().max() < 0.2
    assert module.num_data == 80 and module.info["likelihood_source"] == "raw data"
    reloaded = load_module(save_module(module, tmp_path / "meta"))
    torch.testing.assert_close(reloaded.predict_y(X_test)[0], mean, rtol=0, atol=1e-12)


# Invariances ------------------------------------------------------------------------------------
def overlapping_free_modules():
    X, y = regression_data(36)
    partitions = torch.arange(36).reshape(4, 9)
    sizes = [4, 5, 4, 6]
    return titsias_modules(X, y, lambda k, X_k: X_k[torch.linspace(0, 8, sizes[k]).long()],
                           partitions)


def test_module_order_does_not_change_the_bound():
    modules = overlapping_free_modules()
    Z = torch.linspace(0.0, 6.0, 10).unsqueeze(-1)
    meta = fixed_meta(modules, Z)
    set_random_q(meta)
    shuffled = fixed_meta({name: modules[name] for name in ["m3", "m1", "m0", "m2"]}, Z)
    with torch.no_grad():
        shuffled.q_mean, shuffled.q_sqrt = meta.q_mean.clone(), meta.q_sqrt.clone()
    torch.testing.assert_close(shuffled.bound(), meta.bound(), rtol=1e-10, atol=0)
    torch.testing.assert_close(shuffled.collapsed_bound(), meta.collapsed_bound(), rtol=1e-10,
                               atol=0)


def test_duplicated_module_doubles_its_contribution():
    module = overlapping_free_modules()["m1"]
    Z = torch.linspace(0.0, 6.0, 10).unsqueeze(-1)
    once, twice = fixed_meta({"a": module}, Z), fixed_meta({"a": module, "b": module}, Z)
    set_random_q(once)
    with torch.no_grad():
        twice.q_mean, twice.q_sqrt = once.q_mean.clone(), once.q_sqrt.clone()
    torch.testing.assert_close(twice.contrastive_terms().sum(),
                               2 * once.contrastive_terms().sum(), rtol=1e-12, atol=0)
    torch.testing.assert_close(twice.bound() + twice.kl(), 2 * (once.bound() + once.kl()),
                               rtol=1e-12, atol=0)


def test_translating_every_input_leaves_predictions_unchanged():
    modules = overlapping_free_modules()
    Z = torch.linspace(0.0, 6.0, 10).unsqueeze(-1)
    shift = 3.7
    moved = {name: make_module(name, m.inducing + shift, m.q_mean[0], m.q_chol[0] @ m.q_chol[0].T)
             for name, m in modules.items()}
    X_test = torch.linspace(-1.0, 7.0, 30).unsqueeze(-1)
    before = fixed_meta(modules, Z, collapsed=True).to_module().predict_f(X_test)
    after = fixed_meta(moved, Z + shift, collapsed=True).to_module().predict_f(X_test + shift)
    for a, b in zip(before, after, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-8)


# Pyramid: a recycled meta-GP recycled again -------------------------------------------------------
def test_a_recycled_meta_gp_recovers_itself(tmp_path):
    modules = overlapping_free_modules()
    Z = torch.linspace(0.0, 6.0, 10).unsqueeze(-1)
    level_one = fixed_meta(modules, Z, collapsed=True).to_module(name="level1")
    path = save_module(level_one, tmp_path / "level1")
    level_two = fixed_meta({"level1": load_module(path)}, Z)
    level_two.set_optimal_posterior()
    mean, cov = unwhitened(level_two)
    torch.testing.assert_close(mean, level_one.q_mean[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(cov, level_one.q_chol[0] @ level_one.q_chol[0].T, rtol=0,
                               atol=1e-6)
    assert level_one.num_data == sum(m.num_data for m in modules.values())


def test_a_second_start_caps_the_meta_gps_lengthscales_at_the_spread_of_the_modules_inputs():
    """Modules that saw only noise end at lengthscales far beyond their span; the meta-GP is then
    also fitted from a start at the spread of their inducing inputs (not from modules with short
    lengthscales, nor over a lengthscale the user gives, nor when kernels are not learned)."""
    from pyrogp_models.inference.recycling import global_kernel_starts, initial_global_kernel

    def modules_with(lengthscale):
        return {f"m{k}": make_module(f"m{k}", torch.linspace(k, k + 0.5, 4).unsqueeze(-1),
                                     torch.zeros(4), 0.5 * torch.eye(4),
                                     lengthscale=lengthscale)
                for k in range(6)}

    def starts(lengthscale, **spec):
        modules = modules_with(lengthscale)
        stack = ModuleStack.from_modules(modules)
        spec = RecycleSpec(**spec)
        median = initial_global_kernel(stack, spec, 1, IDENTITY, True)
        return [float(start.lengthscale.detach().reshape(-1)[0])
                for start in global_kernel_starts(median, stack, spec)]

    spread = float(torch.cat([make_module(f"m{k}", torch.linspace(k, k + 0.5, 4).unsqueeze(-1),
                                          torch.zeros(4), 0.5 * torch.eye(4)).inducing.reshape(-1)
                              for k in range(6)]).std(correction=0))
    assert starts(1e4) == pytest.approx([1e4, spread], rel=1e-12)
    assert starts(1e4, kernel="rbf")[1] == pytest.approx(spread, rel=1e-12)
    assert starts(0.3) == pytest.approx([0.3])
    assert starts(1e4, kernel="rbf(lengthscale=50)") == pytest.approx([50.0])
    assert starts(1e4, learn_kernel=False) == pytest.approx([1e4])


def test_the_meta_gp_keeps_the_start_with_the_higher_bound_and_skips_an_unbounded_one():
    """best_fit: the first start unless a later one ends higher by more than the restart margin;
    a start that leaves the bounded region or whose Cholesky fails is skipped with a warning; all
    unbounded: the error."""
    from pyrogp_models.inference.restarts import MARGIN, best_fit

    def fit_from(final_losses):
        def fit(start):
            if final_losses[start] is None:
                raise UnboundedBoundError(f"start {start} is unbounded")
            return f"model {start}", TrainResult(losses=[final_losses[start]], converged=True,
                                                 steps=1)
        return fit

    assert best_fit([0, 1], fit_from([100.0, 50.0]))[0] == "model 1"
    assert best_fit([0, 1], fit_from([50.0, 100.0]))[0] == "model 0"
    assert best_fit([0, 1], fit_from([100.0, 100.0 * (1 - MARGIN / 2)]))[0] == "model 0"
    assert best_fit([0, 1, 2], fit_from([100.0, 80.0, 60.0]))[0] == "model 2"
    with pytest.warns(UserWarning, match="start 0 is unbounded"):
        assert best_fit([0, 1], fit_from([None, 100.0]))[0] == "model 1"
    with pytest.raises(UnboundedBoundError, match="start 0"):
        best_fit([0, 1], fit_from([None, None]))

    def singular_first(start):
        if start == 0:
            raise CholeskyError("Cholesky of the inducing covariance K_zz failed")
        return fit_from([None, 100.0])(start)

    with pytest.warns(UserWarning, match="K_zz failed"):
        assert best_fit([0, 1], singular_first)[0] == "model 1"


def test_recycle_keeps_the_capped_start_when_the_modules_median_start_ends_lower(monkeypatch):
    """Modules of 200 narrow partitions of a noisy curve see only noise and end at lengthscales far
    beyond their span; recycle fits the meta-GP from both starts and returns the fit of the one
    that ends higher, the same as fitting from that start alone."""
    import pyrogp_models.inference.recycling as recycling

    rng = np.random.default_rng(0)
    X = np.linspace(0.0, 5.0, 4000)[:, None]
    y = (4.5 * np.cos(2 * np.pi * X[:, 0] + 1.5 * np.pi)
         - 3 * np.sin(4.3 * np.pi * X[:, 0] + 0.3 * np.pi) + 2 * rng.standard_normal(4000))
    modules = fit_local((X, y, partition_contiguous(X, 200)),
                        LocalFitSpec(3, learn_inducing=False)).modules
    spec = RecycleSpec(num_inducing=20)
    both = recycle(modules, spec)
    all_starts = recycling.global_kernel_starts
    alone = []
    for which in range(2):
        monkeypatch.setattr(recycling, "global_kernel_starts",
                            lambda *args, which=which: [all_starts(*args)[which]])
        alone.append(recycle(modules, spec).result.final_loss)
    assert alone[1] < alone[0] - 1.0
    assert both.result.final_loss == pytest.approx(alone[1], rel=1e-9)


# Boundedness guard --------------------------------------------------------------------------------
def overlapping_unit_modules():
    """5 overlapping modules with S_k = I and ψ = (0.3, 2): each is wider than its prior, so the
    ensemble bound (eq. 6) is unbounded above."""
    modules = {}
    for k in range(5):
        Z = torch.linspace(0.0, 1.0, 5).unsqueeze(-1) + 0.02 * k
        modules[f"o{k}"] = make_module(f"o{k}", Z, torch.randn(5), torch.eye(5),
                                       lengthscale=0.3, variance=2.0)
    return modules


def overlap_meta(**kwargs):
    return MetaGP(ModuleStack.from_modules(overlapping_unit_modules()),
                  torch.linspace(0.0, 1.1, 8).unsqueeze(-1),
                  Stationary("rbf", 1, (), False, 0.3, 2.0), **kwargs)


def test_overlapping_modules_make_the_bound_unbounded_above():
    meta = overlap_meta(on_unbounded="warn")
    precision = meta.bound_quadratic().precision.detach()
    eigenvalues, eigenvectors = torch.linalg.eigh(precision)
    assert eigenvalues[0] < 0
    direction = eigenvectors[:, 0]
    values = []
    for c in (1.0, 1e2, 1e4):
        with torch.no_grad():
            meta.q_mean = torch.zeros(8)
            meta.q_sqrt = torch.linalg.cholesky(0.01 * torch.eye(8)
                                                + c * torch.outer(direction, direction))
        values.append(float(meta.bound().detach()))
    assert values[0] < values[1] < values[2]
    assert values[2] - values[1] > 0.4 * abs(float(eigenvalues[0])) * (1e4 - 1e2)


def test_guard_raises_before_training():
    meta = overlap_meta()
    with pytest.raises(UnboundedBoundError, match="unbounded"):
        meta.check_bounded()
    with pytest.raises(UnboundedBoundError):
        train(meta, config=TrainConfig(steps=5))
    assert meta.evaluations == 0
    with pytest.raises(UnboundedBoundError):
        overlap_meta(collapsed=True, on_unbounded="warn").collapsed_bound()


def test_guard_can_warn_instead():
    meta = overlap_meta(on_unbounded="warn")
    with pytest.warns(UnboundedBoundWarning):
        assert meta.check_bounded() < 0


def test_guard_fires_during_training_when_the_kernel_drifts():
    """An under-fitted module (S = 1.5 I) is bounded under its own kernel, but learning ψ_* moves
    the global kernel into the unbounded region."""
    Z = torch.linspace(0.0, 1.0, 5).unsqueeze(-1)
    module = make_module("wide", Z, torch.randn(5), 1.5 * torch.eye(5), lengthscale=0.3,
                         variance=2.0)
    meta = MetaGP(ModuleStack.from_modules({"wide": module}), Z,
                  Stationary("rbf", 1, (), False, 0.3, 2.0), learn_inducing=False,
                  check_every=10)
    assert meta.check_bounded() > 0
    meta.set_optimal_posterior()
    with pytest.raises(UnboundedBoundError):
        train(meta, config=TrainConfig(lr=0.05, steps=2000, window=10, tol=None))
    assert meta.evaluations < 2000


def test_site_repair_makes_the_bound_bounded():
    stack = ModuleStack.from_modules(overlapping_unit_modules())
    assert stack.indefinite_sites() == stack.names
    repaired, clipped = clip_site_precisions(stack)
    assert all(count > 0 for count in clipped.values())
    assert repaired.indefinite_sites() == []
    for group in repaired.groups:
        _, chol, prior_chol, _ = group.first_latent()
        whitened = torch.linalg.solve_triangular(prior_chol, chol, upper=False)
        assert torch.linalg.matrix_norm(whitened, ord=2).max() <= 1 + 1e-9
    config = TrainConfig(optimizer="lbfgs", lr=1.0, steps=4, window=2)
    fit = recycle(overlapping_unit_modules(),
                  RecycleSpec(8, collapsed=False, repair_sites=True), config)
    meta, module, result = fit.model, fit.module, fit.result
    assert meta.min_precision_eigenvalue() >= 1 - 1e-9
    assert math.isfinite(result.final_loss) and math.isfinite(module.elbo)


def test_site_repair_leaves_positive_sites_alone(single_module):
    stack = ModuleStack.from_modules({"one": single_module})
    repaired, clipped = clip_site_precisions(stack)
    assert clipped == {"one": 0}
    assert torch.equal(repaired.groups[0].chol, stack.groups[0].chol)


def test_site_repair_keeps_the_site_linear_term():
    stack = ModuleStack.from_modules(overlapping_unit_modules())
    repaired, _ = clip_site_precisions(stack)
    before, after = stack.groups[0], repaired.groups[0]
    b = torch.cholesky_solve(before.mean.unsqueeze(-1), before.chol)
    b_repaired = torch.cholesky_solve(after.mean.unsqueeze(-1), after.chol)
    torch.testing.assert_close(b_repaired, b, rtol=1e-8, atol=1e-8)


# The quadratic form with cached site parameters ------------------------------------------------
def heterogeneous_modules():
    """Modules with M_k ∈ {3, 4}, three kernel families and their own hyperparameters."""
    generator = torch.Generator().manual_seed(3)
    modules = {}
    for k, (size, family) in enumerate([(3, "rbf"), (4, "matern32"), (3, "matern52"),
                                        (4, "rbf"), (3, "matern12")]):
        Z = 4.0 * torch.rand(size, 1, generator=generator)
        root = 0.3 * torch.randn(size, size, generator=generator)
        module = make_module(f"h{k}", Z, torch.randn(size, generator=generator),
                             root @ root.T + 0.05 * torch.eye(size),
                             lengthscale=0.5 + 0.2 * k, variance=1.0 + 0.3 * k)
        kernel = stationary_kernel(family, torch.tensor([[0.5 + 0.2 * k]]),
                                   torch.tensor([1.0 + 0.3 * k]), 1)
        modules[f"h{k}"] = replace(module, kernel=kernel)
    return modules


def test_quadratic_form_equals_the_module_by_module_scores():
    """The bound through the cached site parameters (one K_·*, no per-module solve) equals the
    sum of the per-module contrastive expectations (eq. 5), in value and in gradient."""
    stack = ModuleStack.from_modules(heterogeneous_modules())
    assert len(stack.groups) == 5  # one group per kernel family and M_k
    meta = MetaGP(stack, torch.linspace(-0.5, 4.5, 7).unsqueeze(-1),
                  Stationary("rbf", 1, (), False, 0.8, 1.5), on_unbounded="warn")
    set_random_q(meta)
    gradients = []
    for value in (lambda: meta.contrastive_sum(), lambda: meta.contrastive_terms().sum()):
        meta.zero_grad(set_to_none=True)
        total = value()
        total.backward()
        gradients.append((float(total.detach()), [p.grad.clone() for p in meta.parameters()]))
    (fast, fast_grads), (slow, slow_grads) = gradients
    assert fast == pytest.approx(slow, rel=1e-11)
    assert len(fast_grads) == 5  # Z_*, lengthscale, variance, m, L
    for a, b in zip(fast_grads, slow_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    quadratic = meta.bound_quadratic()
    torch.testing.assert_close(
        meta.bound().detach(),
        (meta.contrastive_terms().sum() - meta.kl()).detach(), rtol=1e-11, atol=0)
    precision = torch.eye(7)
    for group, projection, _ in meta._module_terms(meta.prior_cholesky()):
        _, chol, prior_chol, _ = group.first_latent()
        site, prior = chol @ chol.mT, prior_chol @ prior_chol.mT
        precision = precision + (projection @ (torch.linalg.inv(site) - torch.linalg.inv(prior))
                                 @ projection.mT).sum(0)
    torch.testing.assert_close(quadratic.precision.detach(), precision, rtol=1e-9, atol=1e-9)


def test_the_bound_does_not_depend_on_how_the_sites_are_blocked(monkeypatch):
    """Blocks of one module each (a single point per block would cut modules) and one block per
    group give the same bound and gradient."""
    import pyrogp_models.modules.stack as stack_module

    values = []
    for columns in (4096, 1):
        monkeypatch.setattr(stack_module, "SITE_BLOCK_COLUMNS", columns)
        stack = ModuleStack.from_modules(heterogeneous_modules())
        assert len(stack.sites.blocks) == (5 if columns > 1 else stack.num_modules)
        meta = MetaGP(stack, torch.linspace(-0.5, 4.5, 7).unsqueeze(-1),
                      Stationary("rbf", 1, (), False, 0.8, 1.5), on_unbounded="warn")
        values.append(bound_and_gradient(meta, MetaGP.bound))
    assert_same_value_and_gradient(*values)


def bound_and_gradient(meta, objective):
    """``objective(meta)`` and the gradients of the meta-GP's parameters at a seeded random q."""
    torch.manual_seed(0)
    set_random_q(meta)
    total = objective(meta)
    total.backward()
    return total.detach(), [p.grad for p in meta.parameters()]


def assert_same_value_and_gradient(first, second):
    """Two (value, gradients) pairs of :func:`bound_and_gradient` agree to rounding."""
    (first, first_grads), (second, second_grads) = first, second
    torch.testing.assert_close(first, second, rtol=1e-12, atol=0)
    for a, b in zip(first_grads, second_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def position_major(count, size):
    """The rows of ``count`` modules with ``size`` rows each (module after module) in the
    stacked layout: stacked[i] = rows[order[i]], point j of module g at j·count + g."""
    return torch.arange(count * size).reshape(count, size).mT.reshape(-1)


@pytest.mark.parametrize("size", [3, 20])
def test_block_diagonal_product_value_and_gradient(size):
    """blockdiag(A_g) X in the stacked layout (entry by entry up to M_k = 16, batched products
    above), against dense algebra and finite differences."""
    from pyrogp_models.gaussian.expectations import block_diagonal_product

    generator = torch.Generator().manual_seed(0)
    blocks = torch.randn(3, size, size, generator=generator, dtype=torch.float64)
    matrix = torch.randn(3 * size, 6, generator=generator, dtype=torch.float64)
    order = position_major(3, size)
    stacked_t = matrix[order].mT.contiguous().requires_grad_(True)
    by_position = blocks.permute(1, 2, 0)
    torch.testing.assert_close(block_diagonal_product(by_position, stacked_t),
                               (torch.block_diag(*blocks) @ matrix)[order].mT)
    assert torch.autograd.gradcheck(lambda m: block_diagonal_product(by_position, m),
                                    (stacked_t,))


def test_the_site_precision_stays_positive_semidefinite_when_badly_conditioned():
    """PSD sites P_k spanning eight decades (as modules on nearly constant data with lengthscales
    10⁸ times their inputs' spread give) and an ill-conditioned K_**: P_w is formed as a Gram
    matrix, so I + P_w keeps λ_min ≥ 1 up to rounding. Formed as L⁻¹(K_*·PK_·*)L⁻ᵀ the same
    matrix comes out indefinite (λ_min ≈ −14 here), and a bounded meta-GP looked unbounded."""
    from pyrogp_models.gaussian.expectations import site_quadratic

    generator = torch.Generator().manual_seed(0)
    count, size, num_inducing = 300, 3, 35
    inputs = (torch.arange(count, dtype=torch.float64)[:, None]
              + torch.rand(count, size, generator=generator, dtype=torch.float64).sort(-1).values
              ) / count
    global_inducing = torch.linspace(0, 1, num_inducing, dtype=torch.float64)[:, None]
    lengthscale = torch.tensor([0.3], dtype=torch.float64)
    variance = torch.tensor(1.0, dtype=torch.float64)
    prior = stationary_covariance("rbf", global_inducing, global_inducing, lengthscale, variance)
    prior_chol = torch.linalg.cholesky(prior + 1e-6 * torch.eye(num_inducing,
                                                                dtype=torch.float64))
    cross = stationary_covariance("rbf", inputs.reshape(-1, 1), global_inducing, lengthscale,
                                  variance)
    factors = torch.randn(count, size, size, generator=generator, dtype=torch.float64)
    scales = 10.0 ** (8 * torch.rand(count, 1, 1, generator=generator, dtype=torch.float64))
    values, vectors = torch.linalg.eigh(factors @ factors.mT * scales)
    roots = vectors * values.clamp_min(0).sqrt().unsqueeze(-2)
    zero = torch.zeros((), dtype=torch.float64)
    order = position_major(count, size)
    block = (cross[order].mT, roots.permute(1, 2, 0), torch.ones(count * size, dtype=torch.float64),
             torch.zeros(count * size, dtype=torch.float64))
    quadratic = site_quadratic([block], prior_chol, zero, zero)
    assert torch.linalg.eigvalsh(quadratic.precision).min() > -1e-5
    dense = torch.block_diag(*(root @ root.mT for root in roots))
    expected = torch.linalg.solve_triangular(prior_chol, torch.linalg.solve_triangular(
        prior_chol, cross.mT @ dense @ cross, upper=False).mT, upper=False)
    scale = expected.abs().max()
    torch.testing.assert_close(quadratic.precision / scale, expected / scale, rtol=0,
                               atol=1e-8)


def test_site_quadratic_value_and_gradient_against_dense_algebra():
    """P_w, η_w and c summed over blocks of the stacked sites (M_k = 3 and M_k = 20, entry by
    entry and batched; signs +1, 0 and −1) equal L⁻¹K_*·PK_·*L⁻ᵀ etc. formed densely, and the
    hand-written gradient with respect to K_*· and L_** passes finite differences."""
    from pyrogp_models.gaussian.expectations import site_quadratic

    generator = torch.Generator().manual_seed(1)
    num_inducing = 5
    groups = [torch.randn(4, 3, 3, generator=generator, dtype=torch.float64),
              torch.randn(2, 20, 20, generator=generator, dtype=torch.float64)]
    rows = sum(g.shape[0] * g.shape[1] for g in groups)
    signs = torch.randint(-1, 2, (rows,), generator=generator).to(torch.float64)
    shift = torch.randn(rows, generator=generator, dtype=torch.float64)
    cross = torch.randn(rows, num_inducing, generator=generator, dtype=torch.float64)
    root = torch.randn(num_inducing, num_inducing, generator=generator, dtype=torch.float64)
    prior_chol = torch.linalg.cholesky(root @ root.T + torch.eye(num_inducing,
                                                                  dtype=torch.float64))
    orders, start = [], 0
    for group in groups:
        orders.append(start + position_major(group.shape[0], group.shape[1]))
        start += group.shape[0] * group.shape[1]
    sizes = [len(order) for order in orders]
    order = torch.cat(orders)
    dense_roots = torch.block_diag(*(block for group in groups for block in group))
    trace, constant = (torch.tensor(value, dtype=torch.float64) for value in (0.7, -1.1))

    def stacked(cross_t, chol):
        blocks = [(part, group.permute(1, 2, 0), s, b) for part, group, s, b in zip(
            cross_t.split(sizes, -1), groups, signs[order].split(sizes),
            shift[order].split(sizes), strict=True)]
        return site_quadratic(blocks, chol, trace, constant)

    def dense(cross_t, chol):
        cross_rows = torch.empty_like(cross).index_copy(0, order, cross_t.mT)
        precision_blocks = dense_roots @ torch.diag(signs) @ dense_roots.mT
        half = torch.linalg.solve_triangular(chol, cross_rows.mT, upper=False)
        precision = half @ precision_blocks @ half.mT
        shift_w = half @ shift
        return precision, shift_w, -0.5 * (trace - precision.diagonal().sum() + constant)

    cross_t = cross[order].mT.contiguous().requires_grad_(True)
    chol = prior_chol.clone().requires_grad_(True)
    for fast, slow in zip(stacked(cross_t, chol), dense(cross_t, chol), strict=True):
        torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradcheck(lambda c, l: tuple(stacked(c, l.tril())), (cross_t, chol))


def test_site_quadratic_from_exponent_factors_against_dense_algebra():
    """Blocks given as factors of K_*b = exp(P Qᵀ) (the RBF's fused path, signs +1, 0 and −1)
    give L⁻¹K_*·PK_·*L⁻ᵀ, L⁻¹K_*·b and c formed densely from the RBF kernel matrix, and the
    hand-written gradient with respect to P, Q and L_** passes finite differences."""
    from pyrogp_models.gaussian.expectations import ExpFactors, site_quadratic

    generator = torch.Generator().manual_seed(2)
    count, size, num_inducing = 4, 3, 5
    kernel = Stationary("rbf", 1, (), False, 0.7, 1.3)
    global_inducing = torch.randn(num_inducing, 1, generator=generator, dtype=torch.float64)
    inputs = torch.randn(count * size, 1, generator=generator, dtype=torch.float64)
    roots = torch.randn(count, size, size, generator=generator, dtype=torch.float64)
    signs = torch.randint(-1, 2, (count * size,), generator=generator).to(torch.float64)
    shift = torch.randn(count * size, generator=generator, dtype=torch.float64)
    root = torch.randn(num_inducing, num_inducing, generator=generator, dtype=torch.float64)
    prior_chol = torch.linalg.cholesky(root @ root.T + torch.eye(num_inducing,
                                                                  dtype=torch.float64))
    order = torch.cat([position_major(2, size), 2 * size + position_major(2, size)])  # 2 blocks
    trace, constant = (torch.tensor(value, dtype=torch.float64) for value in (0.4, 0.9))
    with torch.no_grad():
        left, right = kernel.exponent_factors(global_inducing, inputs[order])
        cross = stationary_covariance("rbf", inputs, global_inducing, kernel.lengthscale,
                                      kernel.variance)  # [N, M], module after module

    def stacked(left, right, chol):
        blocks = [(ExpFactors(left, part), roots[part_rows].permute(1, 2, 0), s, b)
                  for part, part_rows, s, b in zip(right.split([6, 6]), ([0, 1], [2, 3]),
                                                   signs[order].split([6, 6]),
                                                   shift[order].split([6, 6]), strict=True)]
        return site_quadratic(blocks, chol, trace, constant)

    dense_sites = torch.block_diag(*roots) @ torch.diag(signs) @ torch.block_diag(*roots).mT
    half = torch.linalg.solve_triangular(prior_chol, cross.mT, upper=False)  # L⁻¹K_*·
    precision = half @ dense_sites @ half.mT
    expected = (precision, half @ shift, -0.5 * (trace - precision.diagonal().sum() + constant))
    for fast, slow in zip(stacked(left, right, prior_chol), expected, strict=True):
        torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)
    arguments = (left.clone().requires_grad_(True), right.clone().requires_grad_(True),
                 prior_chol.clone().requires_grad_(True))
    assert torch.autograd.gradcheck(lambda p, q, l: tuple(stacked(p, q, l.tril())), arguments)


@pytest.mark.parametrize("kind", ["rbf", "periodic"])
def test_the_exponent_factor_path_gives_the_bound_and_gradient_of_the_kernel_matrices(
        monkeypatch, kind):
    """The meta-GP's bound through the kernel's exponent factors (the RBF's, the periodic
    kernel's; all blocks' factors at once, split) equals the bound through each block's kernel
    matrix, value and gradient."""
    stack = ModuleStack.from_modules(heterogeneous_modules())
    results = []
    for fused in (True, False):
        kernel = Stationary("rbf", 1, (), False, 0.8, 1.5) if kind == "rbf" else Periodic(
            1, period=6.0, lengthscale=0.9, variance=1.5, dtype=torch.float64)
        meta = MetaGP(stack, torch.linspace(-0.5, 4.5, 7).unsqueeze(-1), kernel,
                      on_unbounded="warn")
        assert meta.kernel.exponent_factors(meta.inducing, meta.inducing) is not None
        if not fused:
            monkeypatch.setattr(meta.kernel, "exponent_factors", lambda X, Z: None)
        # (the periodic kernel is unlike these modules' RBF: its collapsed bound is unbounded)
        results.append(bound_and_gradient(meta, lambda m: m.bound() + (
            m.collapsed_bound() if kind == "rbf" else 0.0)))
    assert_same_value_and_gradient(*results)


def test_unbounded_error_lives_in_errors_and_carries_its_findings():
    from pyrogp_models import errors

    assert issubclass(errors.UnboundedBoundError, errors.PyrogpError)
    with pytest.raises(UnboundedBoundError) as caught:
        overlap_meta().check_bounded()
    assert caught.value.smallest < 0
    assert caught.value.modules == [f"o{k}" for k in range(5)]
    assert "repair_sites=True" in str(caught.value)
    with pytest.warns(UnboundedBoundWarning) as recorded:
        overlap_meta(on_unbounded="warn").check_bounded()
    assert recorded[0].message.smallest == caught.value.smallest
    assert recorded[0].message.modules == caught.value.modules


# Compatibility and export ---------------------------------------------------------------------
def test_incompatible_modules_are_named(single_module):
    renamed = replace(single_module, columns=Columns(["z"]))
    with pytest.raises(IncompatibleModulesError, match="'renamed'.*features"):
        ModuleStack.from_modules({"one": single_module, "renamed": renamed})
    wide = make_module("wide", torch.zeros(5, 2), torch.zeros(5), torch.eye(5),
                       standardisation=Standardisation(np.zeros(2), np.ones(2), 0.0, 1.0))
    with pytest.raises(IncompatibleModulesError, match="'wide'.*input dimension"):
        ModuleStack.from_modules({"one": single_module, "wide": wide})
    two_latents = replace(single_module, q_mean=single_module.q_mean.expand(2, -1),
                          q_chol=single_module.q_chol.expand(2, -1, -1),
                          kernel=single_module.kernel.batched((2,)))
    with pytest.raises(IncompatibleModulesError, match="'two'.*single-latent"):
        ModuleStack.from_modules({"one": single_module, "two": two_latents})


def test_exported_likelihood_rule(single_module):
    noisy = replace(single_module, likelihood_params={"variance": torch.tensor(0.5)},
                    num_data=30)
    meta = fixed_meta({"a": single_module, "b": noisy}, single_module.inducing)
    module = meta.to_module()
    assert module.info["likelihood_source"] == "modules"
    expected = (10 * NOISE + 30 * 0.5) / 40
    assert float(module.likelihood_params["variance"]) == pytest.approx(expected)
    assert float(meta.to_module(likelihood_params={"variance": 0.3}).likelihood_params[
        "variance"]) == pytest.approx(0.3)
    classifier = replace(single_module, likelihood_name="bernoulli",
                         likelihood_options={"link": "probit"}, likelihood_params={})
    mixed = fixed_meta({"a": single_module, "c": classifier}, single_module.inducing)
    with pytest.raises(IncompatibleModulesError, match="different likelihoods"):
        mixed.to_module()
    exported = mixed.to_module(likelihood="bernoulli")
    assert exported.likelihood_options == {"link": "probit"}
    assert exported.info["likelihood_source"] == "user"


def test_recycling_mixed_likelihoods_is_refused_before_training(single_module, monkeypatch):
    import pyrogp_models.inference.recycling as recycling

    classifier = replace(single_module, likelihood_name="bernoulli",
                         likelihood_options={"link": "probit"}, likelihood_params={})
    monkeypatch.setattr(recycling, "_train_if_trainable", lambda *args: pytest.fail("trained"))
    with pytest.raises(MixedLikelihoodsError, match="different likelihoods") as error:
        recycling.recycle({"a": single_module, "c": classifier}, RecycleSpec(num_inducing=4))
    assert error.value.found == "bernoulli, gaussian"


# Heterogeneous modules ----------------------------------------------------------------------------
def fit_modules(X, y, likelihood, num_inducing, steps=5):
    """One module on (X, y) in model units = data units, with its hyperparameters learned."""
    partition = Partition(np.zeros(len(X), dtype=np.int64), {"kind": "random",
                                                             "num_partitions": 1})
    model = LocalGPs(X, y, partition, num_inducing, likelihood,
                     collapsed=likelihood == "gaussian",
                     generator=torch.Generator().manual_seed(0))
    train(model, config=TrainConfig(optimizer="lbfgs", lr=1.0, steps=steps, tol=None))
    standardisation = Standardisation(np.zeros(1), np.ones(1), 0.0, 1.0)
    return model.to_modules(standardisation, [likelihood])[likelihood]


def test_gaussian_and_bernoulli_modules_share_one_latent_function():
    """Gaussian observations of f on [0, 3], labels from σ(f) on [3, 6]: the meta-GP's single
    latent function follows f on both halves, and the exported classifier predicts the labels."""
    generator = torch.Generator().manual_seed(5)
    truth = lambda x: 2.5 * torch.sin(1.5 * x)  # noqa: E731
    X_reg = 3.0 * torch.rand(150, 1, generator=generator)
    y_reg = truth(X_reg[:, 0]) + 0.3 * torch.randn(150, generator=generator)
    X_cls = 3.0 + 3.0 * torch.rand(400, 1, generator=generator)
    labels = (torch.rand(400, generator=generator) < torch.sigmoid(truth(X_cls[:, 0]))).double()
    modules = {"reg": fit_modules(X_reg, y_reg, "gaussian", 10),
               "cls": fit_modules(X_cls, labels, "bernoulli", 10)}
    config = TrainConfig(optimizer="lbfgs", lr=1.0, steps=8, window=4)
    fit = recycle(modules, RecycleSpec(20, likelihood="bernoulli"), config)
    meta, classifier = fit.model, fit.module
    regressor = meta.to_module(likelihood="gaussian")
    grid_reg = torch.linspace(0.2, 2.8, 50).unsqueeze(-1)
    grid_cls = torch.linspace(3.2, 5.8, 50).unsqueeze(-1)
    error_reg = (regressor.predict_f(grid_reg)[0] - truth(grid_reg[:, 0])).abs().max()
    own_reg = (modules["reg"].predict_f(grid_reg)[0] - truth(grid_reg[:, 0])).abs().max()
    assert error_reg < max(2 * own_reg, 0.3)
    prior_error = truth(grid_cls[:, 0]).square().mean().sqrt()
    cls_error = (classifier.predict_f(grid_cls)[0] - truth(grid_cls[:, 0])).square().mean().sqrt()
    assert cls_error < 0.6 * prior_error
    y_test = (torch.rand(50, generator=generator) < torch.sigmoid(truth(grid_cls[:, 0]))).double()
    nlpd = -classifier.log_predictive(grid_cls, y_test).mean()
    own_nlpd = -modules["cls"].log_predictive(grid_cls, y_test).mean()
    assert nlpd < math.log(2) and nlpd < own_nlpd + 0.1


# End to end ---------------------------------------------------------------------------------------
def f_bias(x):
    return (4.5 * np.cos(2 * np.pi * x + 1.5 * np.pi) - 3 * np.sin(4.3 * np.pi * x + 0.3 * np.pi)
            + 3 * x - 7.5)


@pytest.fixture(scope="module")
def toy_concatenation():
    """Spec experiment (i): K = 5 segments of [0, 5.5], N_k = 500, noise std 2; modules with
    M_k = 15 and a full-data SVGP with M = 35, both fitted with the defaults (the collapsed
    bound by L-BFGS), and so is the meta-GP (``config`` None)."""
    rng = np.random.default_rng(0)
    X = np.sort(rng.uniform(0.0, 5.5, 2500))[:, None]
    y = f_bias(X[:, 0]) + 2.0 * rng.standard_normal(2500)
    config = None
    local = fit_local((X, y, partition_contiguous(X, 5)), LocalFitSpec(15, collapsed=True), config)
    one = Partition(np.zeros(2500, dtype=np.int64), {"kind": "random", "num_partitions": 1})
    full = fit_local((X, y, one), LocalFitSpec(35, collapsed=True), config).modules["part000"]
    X_test = np.linspace(0.0, 5.5, 400)[:, None]
    y_test = f_bias(X_test[:, 0]) + 2.0 * rng.standard_normal(400)
    return local.modules, full, config, X_test, y_test


@pytest.mark.parametrize("collapsed", [False, True])
def test_toy_concatenation_matches_a_full_data_svgp(toy_concatenation, collapsed):
    modules, full, config, X_test, y_test = toy_concatenation
    module = recycle(modules, RecycleSpec(35, collapsed=collapsed), config).module

    def rmse_and_nlpd(module):
        mean, _ = module.predict_y(X_test)
        rmse = float(np.sqrt(np.mean((mean.numpy() - f_bias(X_test[:, 0])) ** 2)))
        return rmse, -float(module.log_predictive(X_test, y_test).mean())

    meta_rmse, meta_nlpd = rmse_and_nlpd(module)
    full_rmse, full_nlpd = rmse_and_nlpd(full)
    assert module.info["likelihood_source"] == "modules"
    assert meta_rmse <= 1.5 * full_rmse
    assert abs(meta_nlpd - full_nlpd) < 0.1


def test_two_level_pyramid_matches_the_flat_meta_gp(toy_concatenation):
    """Recycle modules 1–3 and 4–5 separately, then recycle the two meta-GPs: the top level
    predicts like the flat meta-GP and its exported ELBO (Σ lower ELBOs + bound) estimates the
    same evidence."""
    modules, full, config, X_test, y_test = toy_concatenation
    names = list(modules)
    lower = {name: recycle({n: modules[n] for n in group},
                           RecycleSpec(size, collapsed=True, name=name), config).module
             for name, group, size in [("left", names[:3], 25), ("right", names[3:], 20)]}
    top = recycle(lower, RecycleSpec(35, collapsed=True), config).module
    flat = recycle(modules, RecycleSpec(35, collapsed=True), config).module
    grid = torch.as_tensor(X_test)
    torch.testing.assert_close(top.predict_y(grid)[0], flat.predict_y(grid)[0], rtol=0,
                               atol=0.05)
    assert top.num_data == flat.num_data == 2500
    assert top.elbo == pytest.approx(flat.elbo, rel=1e-2)
    assert -float(top.log_predictive(X_test, y_test).mean()) < -float(
        full.log_predictive(X_test, y_test).mean()) + 0.1


def test_solar_meta_gp_beats_the_zero_predictor():
    table = load_sunspots()
    y_all = np.log(table.column("sunspots") + 1.0)
    y_all = y_all - y_all.mean()
    X_all = np.linspace(0.0, 100.0, len(y_all))[:, None]
    rng = np.random.default_rng(42)
    test = rng.random(len(y_all)) < 0.2
    X, y = X_all[~test], y_all[~test]
    config = TrainConfig(optimizer="lbfgs", lr=1.0, steps=5, window=5, tol=1e-6)
    local = fit_local((X, y, partition_contiguous(X, 50)), LocalFitSpec(6, collapsed=True), config)
    module = recycle(local.modules, RecycleSpec(90, collapsed=True), config).module
    mean, _ = module.predict_y(X_all[test])
    rmse = float(np.sqrt(np.mean((mean.numpy() - y_all[test]) ** 2)))
    zero_rmse = float(np.sqrt(np.mean(y_all[test] ** 2)))
    assert zero_rmse == pytest.approx(1.187, abs=0.03)
    assert rmse < 0.6 * zero_rmse
