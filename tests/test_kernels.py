"""Batched kernels against direct per-element formulas and against pyro.contrib.gp."""

import math

import pytest
import torch
from pyro.contrib.gp import kernels as pyro_kernels

from pyrogp_models.kernels import PROFILES, Stationary, stationary_covariance


def direct(family, x, z, lengthscale, variance):
    r = math.sqrt(sum(((a - b) / l) ** 2 for a, b, l in zip(x, z, lengthscale, strict=True)))
    if family == "rbf":
        return variance * math.exp(-0.5 * r * r)
    if family == "matern12":
        return variance * math.exp(-r)
    if family == "matern32":
        return variance * (1 + math.sqrt(3) * r) * math.exp(-math.sqrt(3) * r)
    return variance * (1 + math.sqrt(5) * r + 5 * r * r / 3) * math.exp(-math.sqrt(5) * r)


@pytest.mark.parametrize("family", sorted(PROFILES))
@pytest.mark.parametrize("ard", [False, True])
def test_batched_kernel_matches_elementwise_formula(family, ard):
    K, N, M, D = 3, 4, 5, 2
    lengthscale = torch.rand(K, D if ard else 1) + 0.5
    variance = torch.rand(K) + 0.5
    kernel = Stationary(family, D, (K,), ard, lengthscale, variance)
    X, Z = torch.randn(K, N, D), torch.randn(K, M, D)
    values = kernel(X, Z)
    assert values.shape == (K, N, M)
    for k in range(K):
        ls = lengthscale[k].expand(D).tolist()
        for n in range(N):
            for m in range(M):
                expected = direct(family, X[k, n].tolist(), Z[k, m].tolist(), ls,
                                  variance[k].item())
                assert values[k, n, m].item() == pytest.approx(expected, rel=1e-12, abs=1e-14)
    assert torch.allclose(kernel.diag(X), torch.diagonal(kernel(X), dim1=-2, dim2=-1))


@pytest.mark.parametrize("family,pyro_class", [("rbf", pyro_kernels.RBF),
                                               ("matern32", pyro_kernels.Matern32),
                                               ("matern52", pyro_kernels.Matern52),
                                               ("matern12", pyro_kernels.Exponential)])
def test_agrees_with_pyro_contrib_gp(family, pyro_class):
    X = torch.randn(7, 3)
    ours = Stationary(family, 3, (), True, torch.tensor([0.5, 1.0, 2.0]), 1.7)
    reference = pyro_class(3, variance=torch.tensor(1.7),
                           lengthscale=torch.tensor([0.5, 1.0, 2.0]))
    assert torch.allclose(ours(X), reference(X), atol=1e-12)


@pytest.mark.parametrize("family", [*sorted(PROFILES), "rq"])
@pytest.mark.parametrize("dims", [1, 3])
def test_covariance_gradients_match_finite_differences(family, dims):
    """The one-step profile's hand-written backward, with r² from differences (D = 1) and
    expanded (D = 3): inputs with batch dimensions that broadcast (X [1, N, D] against
    Z [3, M, D]), ARD lengthscales, variances, row weights and the rational quadratic's α; and
    k(X, X) with its zero distances where the profile is smooth there."""
    generator = torch.Generator().manual_seed(dims)
    X = torch.randn(1, 5, dims, dtype=torch.float64, generator=generator)
    Z = torch.randn(3, 4, dims, dtype=torch.float64, generator=generator)
    lengthscale = torch.rand(3, dims, dtype=torch.float64, generator=generator) + 0.5
    variance = torch.rand(3, dtype=torch.float64, generator=generator) + 0.5
    weights = torch.rand(3, 5, dtype=torch.float64, generator=generator) + 0.5
    alpha = torch.rand(3, dtype=torch.float64, generator=generator) + 0.3
    inputs = tuple(t.requires_grad_() for t in (X, Z, lengthscale, variance, weights, alpha))
    if family != "rq":
        inputs, alpha = inputs[:-1], None
    assert torch.autograd.gradcheck(
        lambda *args: stationary_covariance(family, *args), inputs)
    if family != "matern12":  # e^{−r} has a kink at r = 0
        assert torch.autograd.gradcheck(
            lambda a, b, c: stationary_covariance(family, a, a, b, c, shape=alpha),
            (Z, lengthscale, variance))


def test_gradients_are_finite_at_zero_distance():
    kernel = Stationary("matern12", 1, (), False, 1.0, 1.0)
    X = torch.zeros(3, 1)
    kernel(X).sum().backward()
    for p in kernel.parameters():
        assert torch.isfinite(p.grad).all()


def test_parameters_are_constrained_positive():
    kernel = Stationary("rbf", 2, (4,), True, 0.3, 2.0)
    names = dict(kernel.named_parameters())
    assert set(names) == {"lengthscale_unconstrained", "variance_unconstrained"}
    with torch.no_grad():
        for p in kernel.parameters():
            p.fill_(-50.0)
    assert (kernel.lengthscale > 0).all() and (kernel.variance > 0).all()


def test_unknown_family_is_rejected():
    with pytest.raises(ValueError, match="unknown kernel family"):
        Stationary("cosine", 1)


@pytest.mark.parametrize("family", ["rbf", "matern52"])
def test_weighted_cross_covariance_is_root_weight_times_kernel(family):
    """√w k(X, Z) from the fused RBF product (or the plain kernel) equals the direct formula,
    with padding at most twice the smallest normal number, and its gradients pass a
    finite-difference check."""
    torch.manual_seed(2)
    kernel = Stationary(family, 2, (3, 2), ard=True, lengthscale=torch.rand(3, 2, 2) + 0.3,
                        variance=torch.rand(3, 2) + 0.5)
    X, Z = torch.randn(3, 1, 7, 2) * 3 + 10.0, torch.randn(3, 1, 4, 2) + 10.0
    weights = torch.rand(3, 1, 7)
    weights[0, 0, 3] = 0.0
    weighted = kernel.weighted_cross(X, Z, weights)
    assert torch.allclose(weighted, kernel(X, Z) * weights.sqrt().unsqueeze(-1), rtol=1e-13,
                          atol=1e-15)
    assert float(weighted[0, :, 3].abs().max()) <= 2 * torch.finfo(weighted.dtype).tiny
    assert torch.allclose(kernel.weighted_cross(X, Z), kernel(X, Z), rtol=1e-13, atol=1e-15)
    assert torch.autograd.gradcheck(lambda a, b: kernel.weighted_cross(a, b, weights),
                                    (X.clone().requires_grad_(), Z.clone().requires_grad_()))


@pytest.mark.parametrize("family", ["rbf", "matern32"])
def test_weighted_gram_statistics(family):
    """Ψ₂ = K_zxWK_xz and Ψ₁ = K_zxWy against the direct products; gradients by finite
    differences (the RBF's are hand-written)."""
    torch.manual_seed(3)
    kernel = Stationary(family, 2, (3, 1), ard=True, lengthscale=torch.rand(3, 1, 2) + 0.5)
    X, Z = torch.randn(3, 1, 9, 2), torch.randn(3, 1, 4, 2)
    weights, y = torch.rand(3, 1, 9), torch.randn(3, 1, 9)
    weights[1, 0, :2] = 0.0
    gram, projected = kernel.weighted_gram(X, Z, weights, y)
    cross = kernel(X, Z)
    assert torch.allclose(gram, cross.mT @ (weights.unsqueeze(-1) * cross), rtol=1e-12)
    assert torch.allclose(projected, (cross.mT @ (weights * y).unsqueeze(-1)).squeeze(-1),
                          rtol=1e-12)
    assert torch.autograd.gradcheck(
        lambda a, b, c: kernel.weighted_gram(a, b, weights, c),
        (X.clone().requires_grad_(), Z.clone().requires_grad_(), y.clone().requires_grad_()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_far_pairs_never_give_subnormal_covariances(dtype):
    """The fused RBF product floors its exponent: pairs hundreds of lengthscales apart give the
    dtype's smallest normal numbers (or more), never subnormals, which the exponential computes
    several times more slowly; the Gram statistics of such pairs stay at that scale."""
    kernel = Stationary("rbf", 1, (1,), lengthscale=torch.full((1, 1), 0.01, dtype=dtype),
                        variance=torch.ones(1, dtype=dtype))
    X = torch.linspace(0.0, 100.0, 50, dtype=dtype).reshape(1, 50, 1)
    Z = torch.tensor([[[0.0], [100.0]]], dtype=dtype)
    tiny = torch.finfo(dtype).tiny
    weighted = kernel.weighted_cross(X, Z, torch.ones(1, 50, dtype=dtype))
    assert bool((weighted >= tiny).all()) and float(weighted[0, 0, 0]) == 1.0
    assert float(weighted[0, 25, 0]) <= 2 * tiny
    gram, _ = kernel.weighted_gram(X, Z, torch.ones(1, 50, dtype=dtype),
                                   torch.zeros(1, 50, dtype=dtype))
    assert float(gram[0, 0, 1]) <= 100 * tiny and float(gram[0, 0, 0]) == 1.0
