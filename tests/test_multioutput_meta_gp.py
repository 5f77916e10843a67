"""The LMC multi-output meta-GP: reductions to the single-output meta-GP, decoupling, the
boundedness guard and transfer between correlated outputs."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.recycling import RecycleSpec, recycle_multioutput
from pyrogp_models.inference.trainer import TrainConfig
from torch.distributions import MultivariateNormal, kl_divergence

from pyrogp_models.data import Standardisation
from pyrogp_models.data.partitioners import partition_by_label
from pyrogp_models.errors import UnboundedBoundError
from pyrogp_models.gaussian import conditionals
from pyrogp_models.kernels import Stationary, stationary_covariance, stationary_kernel
from pyrogp_models.models.meta.boundedness import UnboundedBoundWarning
from pyrogp_models.models.meta.meta_gp import MetaGP
from pyrogp_models.models.meta.multioutput import MultiOutputMetaGP
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.stack import ModuleStack

JITTER = 1e-9




def posterior_module(name, Z, lengthscale, variance=1.0, y_scale=1.0):
    """A module whose q(u) is a Gaussian-likelihood posterior from 20 random observations."""
    X = Z.min() + (Z.max() - Z.min()) * torch.rand(20, 1)
    y = torch.sin(3 * X[:, 0]) + 0.1 * torch.randn(20)
    K = stationary_covariance("rbf", Z, Z, torch.tensor([lengthscale]), torch.tensor(variance))
    K = K + JITTER * K.diagonal().mean() * torch.eye(len(Z))
    K_uf = stationary_covariance("rbf", Z, X, torch.tensor([lengthscale]),
                                 torch.tensor(variance))
    sigma = K + K_uf @ K_uf.T / 0.05
    mean, cov = K @ torch.linalg.solve(sigma, K_uf @ y) / 0.05, K @ torch.linalg.solve(sigma, K)
    kernel = stationary_kernel("rbf", torch.tensor([[lengthscale]]), torch.tensor([variance]), 1)
    return Module(kernel, "gaussian", {},
                  {"variance": torch.tensor(0.05)}, Z, mean.unsqueeze(0),
                  torch.linalg.cholesky(cov).unsqueeze(0), 20, 0.0,
                  Standardisation(np.zeros(1), np.ones(1), 0.0, y_scale), JITTER,
                  {"name": name})


def random_modules():
    return {f"m{k}": posterior_module(f"m{k}", torch.rand(5, 1) * 2 + k, 0.5 + 0.2 * k)
            for k in range(3)}


def set_random_q(model, scale=0.3):
    with torch.no_grad():
        model.q_mean = torch.randn_like(model.q_mean)
        model.q_sqrt = (torch.tril(scale * torch.randn_like(model.q_sqrt), -1)
                        + torch.diag_embed(0.3 + 0.5 * torch.rand(model.q_mean.shape)))


# Reductions -------------------------------------------------------------------------------------
def test_one_latent_with_equal_weights_is_the_single_output_meta_gp():
    """f_k = w v with unit-variance k_v equals the meta-GP with kernel variance w²."""
    modules, weight = random_modules(), 1.7
    Z = torch.linspace(0.0, 4.0, 8).unsqueeze(-1)
    multi = MultiOutputMetaGP(ModuleStack.from_modules(modules, "recycle-outputs"),
                              Z.unsqueeze(0), "rbf", torch.tensor([[0.6]]),
                              torch.full((3, 1), weight), jitter=JITTER)
    single = MetaGP(ModuleStack.from_modules(modules), Z,
                    Stationary("rbf", 1, (), False, 0.6, weight ** 2), jitter=JITTER)
    set_random_q(multi)
    with torch.no_grad():
        single.q_mean, single.q_sqrt = multi.q_mean[0].clone(), multi.q_sqrt[0].clone()
    torch.testing.assert_close(multi.bound(), single.bound(), rtol=1e-10, atol=0)
    for (mean_a, cov_a), (mean_b, cov_b) in zip(multi.contrastive_predictives(),
                                                single.contrastive_predictives(), strict=True):
        torch.testing.assert_close(mean_a, mean_b)
        torch.testing.assert_close(cov_a, cov_b)


def test_identity_mixing_decouples_the_outputs():
    """W = I, Z_q = Z_k and k_q = the module's kernel: L^MO = −Σ_k KL[q(v_k) ‖ q_k], so the
    optimum is every module itself."""
    Z = torch.linspace(0.0, 2.0, 5).unsqueeze(-1)
    modules = {"a": posterior_module("a", Z, 0.5), "b": posterior_module("b", Z + 3.0, 0.8)}
    multi = MultiOutputMetaGP(ModuleStack.from_modules(modules, "recycle-outputs"),
                              torch.stack([Z, Z + 3.0]), "rbf", torch.tensor([[0.5], [0.8]]),
                              torch.eye(2), learn_inducing=False, jitter=JITTER)

    def unwhitened():
        mean, chol = conditionals.unwhiten(multi.prior_cholesky(), multi.q_mean, multi.q_sqrt)
        return mean.detach(), chol.detach()

    set_random_q(multi)
    mean, chol = unwhitened()
    expected = -sum(kl_divergence(MultivariateNormal(mean[q], scale_tril=chol[q]),
                                  MultivariateNormal(m.q_mean[0], scale_tril=m.q_chol[0]))
                    for q, m in enumerate(modules.values()))
    torch.testing.assert_close(multi.bound().detach(), expected, rtol=1e-5, atol=0)
    multi.set_optimal_posterior()
    mean, chol = unwhitened()
    for q, module in enumerate(modules.values()):
        torch.testing.assert_close(mean[q], module.q_mean[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(chol[q] @ chol[q].T, module.q_chol[0] @ module.q_chol[0].T,
                                   rtol=0, atol=1e-6)


def test_quadratic_form_reproduces_the_contrastive_sum():
    modules = random_modules()
    Z = torch.rand(2, 6, 1) * 4
    multi = MultiOutputMetaGP(ModuleStack.from_modules(modules, "recycle-outputs"), Z, "rbf",
                              torch.tensor([[0.6], [1.1]]), torch.randn(3, 2) * 0.5)
    set_random_q(multi)
    precision, shift, constant = multi.bound_quadratic()
    m = multi.q_mean.reshape(-1)
    S = torch.block_diag(*(L @ L.T for L in multi.q_sqrt))
    site = precision - torch.eye(12)
    contrastive = -0.5 * torch.trace(site @ S) - 0.5 * m @ site @ m + shift @ m + constant
    torch.testing.assert_close(contrastive, multi.contrastive_terms().sum(), rtol=1e-10, atol=0)


def test_large_mixing_weights_on_under_fitted_modules_trigger_the_guard():
    """Modules wider than their prior (S_k = 1.5 I) have indefinite sites: harmless while the
    LMC's amplitudes are small, unbounded once W outgrows the modules' amplitudes."""
    Z = torch.linspace(0.0, 1.0, 5).unsqueeze(-1)
    wide = {name: replace(posterior_module(name, Z, 0.3, variance=2.0),
                          q_chol=1.5 ** 0.5 * torch.eye(5).unsqueeze(0)) for name in "ab"}
    stack = ModuleStack.from_modules(wide, "recycle-outputs")
    inducing = Z.expand(2, -1, -1)
    small = MultiOutputMetaGP(stack, inducing, "rbf", torch.tensor([[0.3], [0.3]]),
                              torch.full((2, 2), 0.5))
    assert small.check_bounded() > 0
    large = MultiOutputMetaGP(stack, inducing, "rbf", torch.tensor([[0.3], [0.3]]),
                              torch.full((2, 2), 3.0))
    with pytest.raises(UnboundedBoundError):
        large.check_bounded()
    large.on_unbounded = "warn"
    with pytest.warns(UnboundedBoundWarning):
        large.check_bounded()


def test_outputs_may_have_their_own_output_standardisation():
    Z = torch.linspace(0.0, 2.0, 5).unsqueeze(-1)
    modules = {"a": posterior_module("a", Z, 0.5), "b": posterior_module("b", Z, 0.5, y_scale=3)}
    stack = ModuleStack.from_modules(modules, "recycle-outputs")
    assert stack.modules["b"].standardisation.y_scale == 3  # each output keeps its units
    multi = MultiOutputMetaGP(stack, Z.unsqueeze(0), "rbf", torch.tensor([[0.5]]),
                              torch.ones(2, 1))
    X = torch.linspace(0.0, 2.0, 7).unsqueeze(-1)
    mean_a, var_a = multi.predictor("a").predict_y(X)
    mean_b, var_b = multi.predictor("b").predict_y(X)
    torch.testing.assert_close(mean_b, 3 * mean_a)
    torch.testing.assert_close(var_b - 9 * 0.05, 9 * (var_a - 0.05))
    with pytest.raises(KeyError, match="no output 'c'"):
        multi.predictor("c")


# Transfer learning ------------------------------------------------------------------------------
def test_correlated_outputs_transfer_to_an_unobserved_range():
    """Three outputs mix two latent functions; output 2 is observed only on [0, 0.5]. The LMC
    meta-GP predicts it on (0.5, 1] from the other outputs, far better than its own module."""
    rng = np.random.default_rng(0)
    mixing = np.array([[1.0, 0.5], [0.8, -1.0], [1.0, 1.0]])

    def truth(k, x):
        return mixing[k, 0] * np.sin(6 * x) + mixing[k, 1] * np.cos(3 * x)

    ranges = [(0.0, 1.0), (0.0, 1.0), (0.0, 0.5)]
    inputs = [rng.uniform(low, high, 150) for low, high in ranges]
    targets = [truth(k, x) + 0.1 * rng.standard_normal(150) for k, x in enumerate(inputs)]
    labels = np.repeat(np.arange(3), 150)
    config = TrainConfig(optimizer="lbfgs", lr=1.0, steps=5, tol=None)
    local = fit_local((np.concatenate(inputs)[:, None], np.concatenate(targets),
                      partition_by_label(labels, "output")), LocalFitSpec(10, collapsed=True),
                      config)
    fit = recycle_multioutput(local.modules, 2, RecycleSpec(15), config)
    meta, result = fit.model, fit.result
    assert result.losses[-1] < result.losses[0]
    grid = np.linspace(0.0, 1.0, 100)
    unseen = grid > 0.5

    def rmse(values, k, where):
        return float(np.sqrt(np.mean((values.numpy()[where] - truth(k, grid)[where]) ** 2)))

    for k, name in enumerate(local.modules):
        meta_mean, _ = meta.predictor(name).predict_y(grid[:, None])
        own_mean, _ = local.modules[name].predict_y(grid[:, None])
        observed = ~unseen if k == 2 else np.ones_like(unseen)
        assert rmse(meta_mean, k, observed) < 1.5 * rmse(own_mean, k, observed) + 0.02
    meta_mean, _ = meta.predictor("part002").predict_y(grid[:, None])
    own_mean, _ = local.modules["part002"].predict_y(grid[:, None])
    assert rmse(meta_mean, 2, unseen) < 0.4 * rmse(own_mean, 2, unseen)


def test_the_lmc_meta_gps_capped_start_is_the_same_in_float32():
    """Modules with lengthscales far beyond their inputs' spread: the LMC meta-GP's starts (the
    modules' median and that capped at the spread) come out alike from a float32 stack."""
    from pyrogp_models.inference.recycling import global_kernel_starts, initial_global_kernel

    torch.manual_seed(0)
    modules = {f"m{k}": posterior_module(f"m{k}", torch.rand(5, 1) * 2 + k, 50.0)
               for k in range(3)}

    def starts(dtype):
        spec = RecycleSpec(6, dtype=dtype)
        stack = ModuleStack.from_modules(modules, "recycle-outputs", dtype=dtype)
        kernel = initial_global_kernel(stack, spec, 1, stack.standardisation, True)
        return [start.lengthscale.detach().reshape(-1) for start in
                global_kernel_starts(kernel, stack, spec)]

    (median64, capped64), (median32, capped32) = starts(torch.float64), starts(torch.float32)
    assert capped32.dtype == median32.dtype == torch.float32
    assert float(capped64) < 0.1 * float(median64)
    assert float(median32) == pytest.approx(float(median64), rel=1e-6)
    assert float(capped32) == pytest.approx(float(capped64), rel=1e-6)
