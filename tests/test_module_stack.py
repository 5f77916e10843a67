"""The cached tensors of a module stack: batched prior factors, site parameters, conversions and
the vectorised compatibility checks."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.data.columns import Columns
from pyrogp_models.errors import CholeskyError, IncompatibleModulesError
from pyrogp_models.kernels import stationary_kernel
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.stack import ModuleStack, check_compatible, clip_site_precisions

IDENTITY = Standardisation(np.zeros(2), np.ones(2), 0.0, 1.0)


def random_module(name, size, family="rbf", ard=False, jitter=1e-6, seed=0, scale=0.3,
                  standardisation=IDENTITY, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    Z = torch.rand(size, 2, generator=generator, dtype=torch.float64) * 3.0
    lengthscale = (0.5 + torch.rand(1, 2 if ard else 1, generator=generator,
                                    dtype=torch.float64))
    root = scale * torch.randn(size, size, generator=generator, dtype=torch.float64)
    chol = torch.linalg.cholesky(root @ root.T + 0.05 * torch.eye(size, dtype=torch.float64))
    kernel = stationary_kernel(family, lengthscale,
                               torch.tensor([1.0 + seed / 10], dtype=torch.float64), 2)
    return Module(kernel, "gaussian", {}, {"variance": torch.tensor(0.1, dtype=torch.float64)},
                  Z, torch.randn(1, size, generator=generator, dtype=torch.float64),
                  chol.unsqueeze(0), 10, 0.0, standardisation, jitter, {"name": name}).to(dtype)


def mixed_modules():
    """Two M_k-groups; families, ARD, jitter and hyperparameters differ within a group."""
    spec = [("a", 3, "rbf", False, 1e-6), ("b", 4, "matern32", True, 1e-6),
            ("c", 3, "matern52", False, 1e-5), ("d", 3, "rbf", True, 1e-6),
            ("e", 4, "matern12", False, 1e-6), ("f", 3, "rbf", False, 1e-6)]
    return {name: random_module(name, size, family, ard, jitter, seed=k)
            for k, (name, size, family, ard, jitter) in enumerate(spec)}


def test_batched_prior_factors_equal_the_modules_own():
    modules = mixed_modules()
    stack = ModuleStack.from_modules(modules)
    groups = sorted((g.kernel.kind, g.kernel.ard, g.num_inducing, len(g.names))
                    for g in stack.groups)  # one group per kernel structure and M_k
    assert groups == [("matern12", False, 4, 1), ("matern32", True, 4, 1),
                      ("matern52", False, 3, 1), ("rbf", False, 3, 2), ("rbf", True, 3, 1)]
    assert sorted(name for g in stack.groups for name in g.names) == sorted(modules)
    for group in stack.groups:
        for name, chol in zip(group.names, group.prior_chol, strict=True):
            torch.testing.assert_close(chol, modules[name].prior_cholesky(), rtol=1e-12,
                                       atol=1e-12)


def test_site_parameters_are_the_dense_site():
    modules = mixed_modules()
    stack = ModuleStack.from_modules(modules)
    for group in stack.groups:
        for k, name in enumerate(group.names):
            assert_dense_site(group.sites, k, modules[name])
        assert torch.equal(group.sites.precision, group.sites.precision.mT)


def assert_dense_site(sites, k, module):
    """Site k equals the site computed from the module's own S and K_zz by dense numpy inverses:
    P = S⁻¹ − K⁻¹, b = S⁻¹μ, constant = μᵀS⁻¹μ + log|S| − log|K|."""
    S = (module.q_chol[0] @ module.q_chol[0].mT).numpy()
    K = (module.prior_cholesky()[0] @ module.prior_cholesky()[0].mT).numpy()
    mu = module.q_mean[0].numpy()
    shift = np.linalg.inv(S) @ mu
    constant = mu @ shift + np.linalg.slogdet(S)[1] - np.linalg.slogdet(K)[1]
    np.testing.assert_allclose(sites.precision[k].numpy(), np.linalg.inv(S) - np.linalg.inv(K),
                               rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(sites.shift[k].numpy(), shift, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(sites.constant[k].item(), constant, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("variance", [1.0, 1e-80])
def test_a_module_at_its_prior_has_a_zero_site_whatever_its_scale(variance):
    """S_k = K_kk^{(k)} to within 10⁻¹² has the site S_k⁻¹ − K_kk^{(k)−1} ≈ 0 (a module that
    learned nothing: on pure noise its signal variance goes to 10⁻⁸²). Taken at face value, the
    rounding-level σ⁻² − 1 is multiplied by the inverse of the prior's scale (10⁴⁰ at a variance
    of 10⁻⁸⁰): site entries of 10⁶⁰ and more, and an unbounded meta-GP. It must be zero, and the
    informative module beside it keeps its dense site."""
    informative = random_module("a", 3, seed=0)
    base = random_module("b", 3, seed=1)
    kernel = stationary_kernel("rbf", torch.tensor([[0.7]], dtype=torch.float64),
                               torch.tensor([variance], dtype=torch.float64), 2)
    prior_chol = replace(base, kernel=kernel).prior_cholesky()
    at_prior = replace(base, kernel=kernel, q_mean=torch.zeros_like(base.q_mean),
                       q_chol=prior_chol * (1.0 - 1e-12))
    stack = ModuleStack.from_modules({"a": informative, "b": at_prior})
    (group,) = stack.groups
    roots, signs = group.site_roots
    position = group.names.index("b")
    assert bool((roots[position] == 0).all()) and bool((signs[position] == 0).all())
    assert bool((group.sites.precision[position] == 0).all())
    assert_dense_site(group.sites, group.names.index("a"), stack.modules["a"])


def test_repaired_groups_carry_repaired_site_parameters():
    """``dataclasses.replace`` (the site repair) recomputes the cached site parameters."""
    wide = {f"w{k}": random_module(f"w{k}", 3, seed=k, scale=3.0) for k in range(3)}
    stack = ModuleStack.from_modules(wide)
    assert stack.indefinite_sites()
    repaired, _ = clip_site_precisions(stack)
    for group in repaired.groups:
        for k, name in enumerate(group.names):
            mean, chol, _, _ = group.first_latent()
            repaired_module = replace(wide[name], q_mean=mean[k:k + 1], q_chol=chol[k:k + 1])
            assert_dense_site(group.sites, k, repaired_module)
        assert torch.linalg.eigvalsh(group.sites.precision).min() > -1e-8


def test_modules_are_converted_only_when_needed():
    modules = mixed_modules()
    stack = ModuleStack.from_modules(modules)
    assert all(stack.modules[name] is module for name, module in modules.items())
    single = {name: module.to(torch.float32) for name, module in modules.items()}
    converted = ModuleStack.from_modules(single)
    assert all(m.q_chol.dtype == torch.float64 for m in converted.modules.values())
    assert converted.groups[0].sites.precision.dtype == torch.float64


def test_a_failing_prior_factor_names_its_module():
    modules = mixed_modules()
    broken = modules["c"].inducing.clone()
    broken[0, 0] = math.nan  # no jitter on the ladder makes K_zz positive definite
    modules["c"] = replace(modules["c"], inducing=broken)
    with pytest.raises(CholeskyError, match="module 'c'"):
        ModuleStack.from_modules(modules)


def test_compatibility_checks_name_the_odd_modules():
    modules = {f"m{k}": random_module(f"m{k}", 3, seed=k) for k in range(40)}
    # standardisations may differ: the stack converts the modules
    shifted = Standardisation(np.array([0.0, 1.0]), np.ones(2) * 2.0, 0.5, 3.0)
    modules["m17"] = random_module("m17", 3, seed=17, standardisation=shifted)
    check_compatible(modules)
    for name in ("m3", "m30"):
        modules[name] = replace(modules[name], columns=Columns(["a"]))
    with pytest.raises(IncompatibleModulesError, match="'m3', 'm30' differ.*features"):
        check_compatible(modules)
    modules["m3"] = replace(modules["m3"], likelihood_name="poisson", likelihood_params={})
    with pytest.raises(IncompatibleModulesError, match="'m3' differ.*likelihood"):
        check_compatible(modules, "combine")
