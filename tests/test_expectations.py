"""Closed-form Gaussian cross-entropy and contrastive expectations: closed form against Monte
Carlo, and the whitened q_C against the unwhitened one."""

import numpy as np
import torch
from torch.distributions import MultivariateNormal, kl_divergence

from pyrogp_models.data import Standardisation
from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.expectations import (
    contrastive_expectation,
    contrastive_quadratic,
    gaussian_cross_entropy,
)
from pyrogp_models.kernels import Stationary, stationary_covariance, stationary_kernel
from pyrogp_models.models.meta.meta_gp import MetaGP
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.stack import ModuleStack


def random_chol(size, *batch, scale=1.0):
    A = torch.randn(*batch, size, size)
    return torch.linalg.cholesky(scale * (A @ A.mT / size + 0.5 * torch.eye(size)))


def random_module(name, Z, lengthscale=0.6, variance=1.5, jitter=1e-6, family="rbf"):
    """A module with a random q(u) narrower than its prior."""
    M = Z.shape[0]
    prior = stationary_covariance(family, Z, Z, torch.tensor([lengthscale]),
                                  torch.tensor(variance))
    prior = prior + jitter * prior.diagonal().mean() * torch.eye(M)
    site = torch.randn(M, M)
    covariance = torch.linalg.inv(torch.linalg.inv(prior) + site @ site.T)
    kernel = stationary_kernel(family, torch.tensor([[lengthscale]]), torch.tensor([variance]), 1)
    return Module(kernel, "gaussian", {},
                  {"variance": torch.tensor(0.1)}, Z, torch.randn(1, M),
                  torch.linalg.cholesky(covariance).unsqueeze(0), 50, -10.0,
                  Standardisation(np.zeros(1), np.ones(1), 0.0, 1.0), jitter, {"name": name})


def random_meta(modules, num_inducing=9, lengthscale=0.8, variance=1.2):
    Z = torch.linspace(-1.0, 4.0, num_inducing).unsqueeze(-1)
    meta = MetaGP(ModuleStack.from_modules(modules), Z,
                  Stationary("rbf", 1, (), False, lengthscale, variance), on_unbounded="warn")
    with torch.no_grad():
        meta.q_mean = torch.randn(num_inducing)
        meta.q_sqrt = random_chol(num_inducing, scale=0.5)
    return meta


# T1 -------------------------------------------------------------------------------------------
def test_cross_entropy_equals_minus_kl_minus_entropy():
    d = 5
    mean, target_mean = torch.randn(3, d), torch.randn(3, d)
    chol, target_chol = random_chol(d, 3), random_chol(d, 3)
    q = MultivariateNormal(mean, scale_tril=chol)
    p = MultivariateNormal(target_mean, scale_tril=target_chol)
    expected = -kl_divergence(q, p) - q.entropy()
    ours = gaussian_cross_entropy(mean, chol @ chol.mT, target_mean, target_chol)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)


def test_cross_entropy_matches_monte_carlo():
    d = 4
    mean, target_mean = torch.randn(d), torch.randn(d)
    chol, target_chol = random_chol(d), random_chol(d)
    draws = MultivariateNormal(mean, scale_tril=chol).sample((400_000,))
    log_p = MultivariateNormal(target_mean, scale_tril=target_chol).log_prob(draws)
    standard_error = log_p.std() / len(log_p) ** 0.5
    ours = gaussian_cross_entropy(mean, chol @ chol.mT, target_mean, target_chol)
    assert abs(ours - log_p.mean()) < 4 * standard_error


def test_contrastive_expectation_matches_monte_carlo_log_ratio():
    d = 3
    mean_c, chol_c = torch.randn(d), random_chol(d)
    module_mean, module_chol, prior_chol = torch.randn(d), random_chol(d), random_chol(d, scale=3)
    draws = MultivariateNormal(mean_c, scale_tril=chol_c).sample((400_000,))
    ratio = (MultivariateNormal(module_mean, scale_tril=module_chol).log_prob(draws)
             - MultivariateNormal(torch.zeros(d), scale_tril=prior_chol).log_prob(draws))
    ours = contrastive_expectation(mean_c, chol_c @ chol_c.mT, module_mean, module_chol,
                                   prior_chol)
    assert abs(ours - ratio.mean()) < 4 * ratio.std() / len(ratio) ** 0.5


def test_quadratic_form_reproduces_the_contrastive_sum():
    modules = {f"m{k}": random_module(f"m{k}", torch.rand(4 + k % 2, 1) * 3) for k in range(5)}
    meta = random_meta(modules)
    precision, shift, constant = meta.bound_quadratic()
    m, S = meta.q_mean, meta.q_sqrt @ meta.q_sqrt.mT
    contrastive = (-0.5 * torch.trace((precision - torch.eye(len(m))) @ S)
                   - 0.5 * m @ (precision - torch.eye(len(m))) @ m + shift @ m + constant)
    torch.testing.assert_close(contrastive, meta.contrastive_terms().sum(), rtol=1e-10, atol=0)


def test_quadratic_form_sums_over_its_batch():
    B, prior_cov = torch.randn(3, 6, 4), random_chol(4, 3) @ random_chol(4, 3).mT
    means, chols, prior_chols = torch.randn(3, 4), random_chol(4, 3), random_chol(4, 3)
    whole = contrastive_quadratic(B, prior_cov, means, chols, prior_chols)
    parts = [contrastive_quadratic(B[k:k + 1], prior_cov[k:k + 1], means[k:k + 1],
                                   chols[k:k + 1], prior_chols[k:k + 1]) for k in range(3)]
    for index in range(3):
        torch.testing.assert_close(whole[index], sum(part[index] for part in parts))


# T2 -------------------------------------------------------------------------------------------
def unwhitened_contrastive(meta, Z_k):
    """Eq. (17) with the main-text sign, by dense solves: m_C = K_k*K_**⁻¹μ_*,
    S_C = K_kk + K_k*K_**⁻¹(S_* − K_**)K_**⁻¹K_*k, with q(u_*) unwhitened."""
    L = meta.prior_cholesky()
    K_ss = L @ L.mT
    mean_s, chol_s = conditionals.unwhiten(L, meta.q_mean, meta.q_sqrt)
    K_sk, K_kk = meta.kernel(meta.inducing, Z_k), meta.kernel(Z_k)
    A = torch.linalg.solve(K_ss, K_sk)
    return A.mT @ mean_s, K_kk + A.mT @ (chol_s @ chol_s.mT - K_ss) @ A


def test_whitened_contrastive_predictive_equals_unwhitened_formula():
    modules = {f"m{k}": random_module(f"m{k}", torch.rand(5, 1) * 3) for k in range(3)}
    meta = random_meta(modules)
    (mean_c, cov_c), = meta.contrastive_predictives()
    for k, name in enumerate(modules):
        mean_ref, cov_ref = unwhitened_contrastive(meta, modules[name].inducing)
        torch.testing.assert_close(mean_c[k], mean_ref, rtol=0, atol=1e-8)
        torch.testing.assert_close(cov_c[k], cov_ref, rtol=0, atol=1e-8)


def test_contrastive_predictive_matches_joint_gaussian_monte_carlo():
    """Draw u_* ~ q(u_*), then u_k ~ p(u_k | u_*) under the global kernel: the main-text "+"
    sign of eq. (17) matches, the appendix "−" sign does not."""
    Z_k = torch.tensor([[0.3], [1.1], [2.0]])
    meta = random_meta({"m": random_module("m", Z_k)}, num_inducing=5)
    (mean_c, cov_c), = meta.contrastive_predictives()
    L = meta.prior_cholesky()
    K_ss = L @ L.mT
    K_sk, K_kk = meta.kernel(meta.inducing, Z_k), meta.kernel(Z_k)
    A = torch.linalg.solve(K_ss, K_sk)
    conditional_chol = torch.linalg.cholesky(K_kk - A.mT @ K_sk + 1e-9 * torch.eye(3))
    mean_s, chol_s = conditionals.unwhiten(L, meta.q_mean.detach(), meta.q_sqrt.detach())
    u_star = MultivariateNormal(mean_s, scale_tril=chol_s).sample((200_000,))
    u_k = u_star @ A + torch.randn(200_000, 3) @ conditional_chol.mT
    sample_cov = torch.cov(u_k.T)
    variance = sample_cov.diagonal()
    mean_error = (u_k.mean(0) - mean_c.detach()[0]).abs()
    cov_error = (sample_cov - cov_c.detach()[0]).abs()
    cov_standard_error = ((torch.outer(variance, variance) + sample_cov ** 2) / len(u_k)).sqrt()
    assert (mean_error < 5 * (variance / len(u_k)).sqrt()).all()
    assert (cov_error < 5 * cov_standard_error).all()
    assert cov_error.max() < 1e-2
    appendix_sign = K_kk - A.mT @ (chol_s @ chol_s.mT - K_ss) @ A
    assert ((sample_cov - appendix_sign).abs() > 20 * cov_standard_error).any()


# T3 -------------------------------------------------------------------------------------------
def test_contrastive_predictive_degenerates_to_q_at_shared_inputs():
    """Q_k = K_kk − K_k*(K_** + εI)⁻¹K_*k vanishes up to the jitter ε (error ~ ε/λ_min(K))."""
    Z = torch.linspace(0.0, 3.0, 6).unsqueeze(-1)
    module = random_module("m", Z, lengthscale=0.7, variance=1.3, jitter=1e-9)
    meta = MetaGP(ModuleStack.from_modules({"m": module}), Z,
                  Stationary("rbf", 1, (), False, 0.7, 1.3), learn_inducing=False, jitter=1e-9)
    with torch.no_grad():
        meta.q_mean = torch.randn(6)
        meta.q_sqrt = random_chol(6)
    (mean_c, cov_c), = meta.contrastive_predictives()
    mean_s, chol_s = conditionals.unwhiten(meta.prior_cholesky(), meta.q_mean, meta.q_sqrt)
    torch.testing.assert_close(mean_c[0], mean_s, rtol=0, atol=1e-6)
    torch.testing.assert_close(cov_c[0], chol_s @ chol_s.mT, rtol=0, atol=1e-6)


def test_each_module_is_scored_under_its_own_kernel_in_stack_order():
    """Modules of different kernel families, hyperparameters and sizes, grouped by M_k: each
    term equals the module scored on its own."""
    families = ["rbf", "matern32", "matern52", "matern12"]
    modules = {f"m{k}": random_module(f"m{k}", torch.rand(4 + k % 2, 1) * 3, 0.4 + 0.3 * k,
                                      1.0 + k, family=families[k]) for k in range(4)}
    meta = random_meta(modules)
    terms = meta.contrastive_terms()
    for k, name in enumerate(modules):
        (mean_c, cov_c), = random_meta_single(meta, modules[name])
        expected = contrastive_expectation(mean_c[0], cov_c[0], modules[name].q_mean[0],
                                           modules[name].q_chol[0],
                                           modules[name].prior_cholesky()[0])
        torch.testing.assert_close(terms[k], expected, rtol=1e-12, atol=0)


def random_meta_single(meta, module):
    """q_C of ``meta`` evaluated for one module on its own."""
    single = MetaGP(ModuleStack.from_modules({"x": module}), meta.inducing.detach(), meta.kernel)
    with torch.no_grad():
        single.q_mean, single.q_sqrt = meta.q_mean.detach(), meta.q_sqrt.detach()
    return single.contrastive_predictives()


def test_unequal_module_sizes_form_groups_in_stack_order():
    modules = {"a": random_module("a", torch.rand(3, 1)), "b": random_module("b", torch.rand(5, 1)),
               "c": random_module("c", torch.rand(3, 1))}
    stack = ModuleStack.from_modules(modules)
    assert [g.names for g in stack.groups] == [("a", "c"), ("b",)]
    assert [g.indices.tolist() for g in stack.groups] == [[0, 2], [1]]
