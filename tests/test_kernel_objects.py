"""Kernel objects: every kind against closed-form NumPy and against scikit-learn and
pyro.contrib.gp; sums and products positive semi-definite; batches; JSON trees; unit conversion;
kernel expressions."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pytest
import torch

from pyrogp_models.kernels import (
    KINDS,
    Constant,
    KernelExpressionError,
    Linear,
    Periodic,
    Product,
    RationalQuadratic,
    Stationary,
    Sum,
    White,
    kernel_from_tree,
    parse_kernel,
)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(7, 2))
Z = RNG.normal(size=(5, 2))


def t(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64)


def distances(A, B, lengthscale):
    return np.sqrt((((A[:, None, :] - B[None, :, :]) / lengthscale) ** 2).sum(-1))


# Closed forms, written out in NumPy (Rasmussen & Williams 2006, ch. 4) -------------------------
LENGTHSCALES, CENTRE = np.array([0.8, 1.3]), np.array([0.2, -0.4])


def numpy_reference(kind: str, A, B, v=1.7, ls=LENGTHSCALES, alpha=0.6, period=1.9, pls=0.7,
                    centre=CENTRE):
    r = distances(A, B, ls)
    if kind == "rbf":
        return v * np.exp(-0.5 * r**2)
    if kind == "matern12":
        return v * np.exp(-r)
    if kind == "matern32":
        return v * (1 + math.sqrt(3) * r) * np.exp(-math.sqrt(3) * r)
    if kind == "matern52":
        return v * (1 + math.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-math.sqrt(5) * r)
    if kind == "rq":
        return v * (1 + r**2 / (2 * alpha)) ** (-alpha)
    if kind == "periodic":
        d = A[:, None, :] - B[None, :, :]
        return v * np.exp(-2 * ((np.sin(np.pi * d / period) / pls) ** 2).sum(-1))
    if kind == "linear":
        return ((A - centre) * ls) @ (B - centre).T
    if kind == "constant":
        return np.full((len(A), len(B)), v)
    raise ValueError(kind)


def build(kind: str, **extra):
    values = {"rbf": dict(lengthscale=[0.8, 1.3], variance=1.7),
              "rq": dict(lengthscale=[0.8, 1.3], variance=1.7, alpha=0.6),
              "periodic": dict(period=1.9, lengthscale=0.7, variance=1.7),
              "linear": dict(variance=[0.8, 1.3], centre=[0.2, -0.4]),
              "constant": dict(variance=1.7), "white": dict(variance=1.7)}
    values = values.get(kind, values["rbf"])
    ard = kind not in ("periodic", "constant", "white")
    return KINDS[kind](2, ard=ard, dtype=torch.float64, **values, **extra)


@pytest.mark.parametrize("kind", ["rbf", "matern12", "matern32", "matern52", "rq", "periodic",
                                  "linear", "constant"])
def test_every_kind_matches_its_closed_form(kind):
    kernel = build(kind)
    np.testing.assert_allclose(kernel(t(X), t(Z)).detach().numpy(),
                               numpy_reference(kind, X, Z), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kernel(t(X), diag=True).detach().numpy(),
                               np.diag(numpy_reference(kind, X, X)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["rbf", "matern12", "matern32", "matern52", "rq", "periodic",
                                  "linear", "constant", "white"])
def test_paired_evaluation_is_the_diagonal_of_the_cross_covariance(kind):
    """k(x_n, z_n) row by row (batched over a leading dimension, an active dimension sliced)
    equals the diagonal of k(X, Z): the elementwise stationary path and the general one."""
    sliced = Stationary("matern32", 1, active_dims=[1], lengthscale=0.5, dtype=torch.float64)
    rng = np.random.default_rng(1)
    A, B = t(rng.normal(size=(3, 6, 2))), t(rng.normal(size=(3, 6, 2)))
    for each in (build(kind), build(kind) * sliced, sliced):
        expected = torch.diagonal(each(A, B), dim1=-2, dim2=-1)
        torch.testing.assert_close(each.paired(A, B), expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", ["matern12", "matern32", "rq", "periodic", "linear",
                                  "composite"])
def test_weighted_cross_covariance_and_gram_statistics_by_each_kinds_own_path(kind):
    """√w_n k(x_n, z_m) by each kind's own path (weights folded into a factor or the profile's
    one step) against the covariance times √w, the Gram statistics Ψ₂ = GᵀG, Ψ₁ = Gᵀ√w y
    against their products, and the gradients of both against finite differences."""
    kernel = random_composite(0) if kind == "composite" else build(kind)
    weights = t(np.random.default_rng(2).uniform(0.2, 2.0, size=7))
    expected = weights.sqrt()[:, None] * kernel(t(X), t(Z))
    torch.testing.assert_close(kernel.weighted_cross(t(X), t(Z), weights), expected,
                               rtol=1e-12, atol=1e-14)
    assert torch.autograd.gradcheck(lambda a, b: kernel.weighted_cross(a, b, weights),
                                    (t(X).requires_grad_(), t(Z).requires_grad_()))
    y = t(np.random.default_rng(3).normal(size=7))
    gram, projected = kernel.weighted_gram(t(X), t(Z), weights, y)
    torch.testing.assert_close(gram, expected.mT @ expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(projected, expected.mT @ (weights.sqrt() * y), rtol=1e-12,
                               atol=1e-14)
    assert torch.autograd.gradcheck(lambda a, b, c: kernel.weighted_gram(a, b, weights, c),
                                    (t(X).requires_grad_(), t(Z).requires_grad_(),
                                     y.requires_grad_()))


def test_white_noise_counts_only_within_one_set_of_inputs():
    kernel = build("white")
    np.testing.assert_allclose(kernel(t(X)).detach().numpy(), 1.7 * np.eye(7))
    assert float(kernel(t(X), t(Z)).abs().max()) == 0.0
    np.testing.assert_allclose(kernel(t(X), diag=True).detach().numpy(), np.full(7, 1.7))


def test_kinds_agree_with_scikit_learn():
    gp = pytest.importorskip("sklearn.gaussian_process.kernels")
    pairs = [
        (build("rbf"), 1.7 * gp.RBF([0.8, 1.3])),
        (build("matern12"), 1.7 * gp.Matern([0.8, 1.3], nu=0.5)),
        (build("matern32"), 1.7 * gp.Matern([0.8, 1.3], nu=1.5)),
        (build("matern52"), 1.7 * gp.Matern([0.8, 1.3], nu=2.5)),
        (RationalQuadratic(2, lengthscale=0.8, variance=1.7, alpha=0.6, dtype=torch.float64),
         1.7 * gp.RationalQuadratic(length_scale=0.8, alpha=0.6)),
        (Linear(2, variance=1.0, centre=0.0, dtype=torch.float64) + Constant(
            2, variance=0.3, dtype=torch.float64), gp.DotProduct(sigma_0=math.sqrt(0.3))),
        (White(2, variance=1.7, dtype=torch.float64), gp.WhiteKernel(1.7)),
    ]
    for ours, theirs in pairs:
        np.testing.assert_allclose(ours(t(X), t(Z)).detach().numpy(), theirs(X, Z),
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(ours(t(X)).detach().numpy(), theirs(X), rtol=1e-10,
                                   atol=1e-12)
    x1, z1 = X[:, :1], Z[:, :1]  # scikit-learn's ExpSineSquared is for a distance in 1-D
    ours = Periodic(1, period=1.9, lengthscale=0.7, variance=1.7, dtype=torch.float64)
    theirs = 1.7 * gp.ExpSineSquared(length_scale=0.7, periodicity=1.9)
    np.testing.assert_allclose(ours(t(x1), t(z1)).detach().numpy(), theirs(x1, z1), rtol=1e-10)


@pytest.mark.parametrize("alpha", [1e6, 1e12, 1e15])
def test_a_rational_quadratic_of_large_alpha_is_the_rbf_it_tends_to(alpha):
    """σ²(1 + r²/2α)^(−α) → σ² exp(−r²/2) as α → ∞; fits that prefer the RBF drive α to
    10¹¹–10¹³, where the power of a rounded 1 + r²/2α was off by 10⁻⁴ (relative) and its Gram
    matrices were not positive semi-definite."""
    rq = RationalQuadratic(2, lengthscale=0.8, variance=1.7, alpha=alpha, dtype=torch.float64)
    rbf = KINDS["rbf"](2, lengthscale=0.8, variance=1.7, dtype=torch.float64)
    rbf_limit = rbf(t(X), t(Z)).detach().numpy()
    half_r2 = -np.log(rbf_limit / 1.7)  # the RQ's relative distance from it: ≈ (r²/2)²/(2α)
    np.testing.assert_allclose(rq(t(X), t(Z)).detach().numpy(), rbf_limit,
                               rtol=1e-12 + half_r2.max() ** 2 / alpha, atol=1e-14)


def test_kinds_agree_with_pyro_contrib_gp():
    from pyro.contrib.gp import kernels as pk

    def pyro_kernel(cls, **values):
        return cls(2, **{k: t(v) for k, v in values.items()})

    pairs = [
        (build("rbf"), pyro_kernel(pk.RBF, variance=1.7, lengthscale=[0.8, 1.3])),
        (build("matern12"), pyro_kernel(pk.Exponential, variance=1.7, lengthscale=[0.8, 1.3])),
        (build("matern32"), pyro_kernel(pk.Matern32, variance=1.7, lengthscale=[0.8, 1.3])),
        (build("matern52"), pyro_kernel(pk.Matern52, variance=1.7, lengthscale=[0.8, 1.3])),
        (build("rq"), pyro_kernel(pk.RationalQuadratic, variance=1.7, lengthscale=[0.8, 1.3],
                                  scale_mixture=0.6)),
        (build("periodic"), pyro_kernel(pk.Periodic, variance=1.7, lengthscale=0.7,
                                        period=1.9)),
        (Linear(2, variance=1.7, centre=0.0, dtype=torch.float64),
         pyro_kernel(pk.Linear, variance=1.7)),
        (build("constant"), pyro_kernel(pk.Constant, variance=1.7)),
        (build("white"), pyro_kernel(pk.WhiteNoise, variance=1.7)),
    ]
    for ours, theirs in pairs:
        pyro.clear_param_store()  # Pyro's unnamed kernels share one "lengthscale" in the store
        np.testing.assert_allclose(ours(t(X), t(Z)).detach().numpy(),
                                   theirs(t(X), t(Z)).detach().numpy(), rtol=1e-10, atol=1e-12)
        # at r = 0 Pyro takes √(r² + 1e-12), so its Matérn diagonals are off by ~1e-6
        np.testing.assert_allclose(ours(t(X)).detach().numpy(), theirs(t(X)).detach().numpy(),
                                   rtol=2e-6, atol=1e-12)


def random_composite(seed: int):
    rng = np.random.default_rng(seed)
    kinds = ["rbf", "matern32", "rq", "periodic", "linear", "constant", "white"]
    leaves = [build(str(kind)) for kind in rng.choice(kinds, 4)]
    return (leaves[0] + leaves[1]) * leaves[2] + leaves[3]


@pytest.mark.parametrize("seed", range(6))
def test_sums_and_products_are_positive_semi_definite(seed):
    kernel = random_composite(seed)
    inputs = t(np.random.default_rng(seed).normal(size=(40, 2)))
    K = kernel(inputs).detach()
    assert torch.allclose(K, K.mT)
    eigenvalues = torch.linalg.eigvalsh(K)
    assert float(eigenvalues.min()) >= -1e-10 * float(eigenvalues.abs().max())
    leaves = [leaf for _, leaf in kernel.parts()]
    first, second, third, fourth = (leaf(inputs).detach() for leaf in leaves)
    torch.testing.assert_close(K, (first + second) * third + fourth)


def test_a_batch_evaluates_every_member_with_its_own_values():
    lengthscales = t([[[0.5]], [[1.0]], [[2.0]]])  # [K=3, L=1, 1]
    batch = Stationary("rbf", 2, (3, 1), lengthscale=lengthscales, variance=t([[1.0], [2.0],
                                                                              [3.0]]))
    kernel = batch * Periodic(2, batch_shape=(3, 1), period=1.5, dtype=torch.float64)
    out = kernel(t(X).expand(3, 1, 7, 2), t(Z).expand(3, 1, 5, 2))
    assert out.shape == (3, 1, 7, 5)
    for k in range(3):
        single = Stationary("rbf", 2, lengthscale=lengthscales[k, 0], variance=float(k + 1),
                            dtype=torch.float64) * Periodic(2, period=1.5, dtype=torch.float64)
        torch.testing.assert_close(out[k, 0], single(t(X), t(Z)))


def test_active_dims_select_input_columns():
    first = Stationary("rbf", 1, active_dims=[0], lengthscale=0.8, dtype=torch.float64)
    second = Periodic(1, active_dims=[1], period=1.9, lengthscale=0.7, dtype=torch.float64)
    K = (first * second)(t(X), t(Z))
    expected = (numpy_reference("rbf", X[:, :1], Z[:, :1], v=1.0, ls=np.array([0.8]))
                * numpy_reference("periodic", X[:, 1:], Z[:, 1:], v=1.0))
    np.testing.assert_allclose(K.detach().numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_a_tree_and_its_tensors_rebuild_the_same_kernel(seed):
    kernel = random_composite(seed)
    rebuilt = kernel_from_tree(kernel.tree(), kernel.named_values())
    assert rebuilt.tree() == kernel.tree()
    torch.testing.assert_close(rebuilt(t(X), t(Z)), kernel(t(X), t(Z)))


def test_a_fixed_value_is_not_trained_and_survives_the_tree():
    kernel = Periodic(1, period=2.0, fixed=["period"], dtype=torch.float64)
    assert "period" not in dict(kernel.named_parameters())
    rebuilt = kernel_from_tree(kernel.tree(), kernel.named_values())
    assert rebuilt.fixed == ("period",) and "period" not in dict(rebuilt.named_parameters())


@pytest.mark.parametrize("seed", range(4))
def test_converted_kernels_give_the_same_covariance_in_other_units(seed):
    """k'((x − μ)/s, (z − μ)/s) = a² k(x, z) for every kind and composite, with per-dimension
    scales that differ (an isotropic kernel becomes ARD)."""
    kernel = random_composite(seed) + Linear(2, variance=0.5, centre=[0.3, 0.1],
                                             dtype=torch.float64)
    scale, shift, a = t([2.0, 0.5]), t([1.0, -3.0]), 0.7
    converted = kernel.converted(scale, shift, a)
    moved_X, moved_Z = (t(X) - shift) / scale, (t(Z) - shift) / scale
    torch.testing.assert_close(converted(moved_X, moved_Z), a**2 * kernel(t(X), t(Z)).detach())
    torch.testing.assert_close(converted(moved_X, diag=True), a**2 * kernel(t(X), diag=True)
                               .detach())


def test_expressions_build_the_kernel_they_name():
    kernel = parse_kernel("rbf + periodic(period=1.5, lengthscale=fixed(0.9)) * rbf(ard) + "
                          "rq(dims=[1]) + white", 2)
    assert isinstance(kernel, Sum) and len(kernel.kernels) == 4
    assert isinstance(kernel.kernels[1], Product)
    periodic = kernel.kernels[1].kernels[0]
    assert float(periodic.period) == 1.5 and periodic.fixed == ("lengthscale",)
    assert periodic.given == ("period", "lengthscale")
    assert kernel.kernels[1].kernels[1].ard
    assert kernel.kernels[2].active_dims == [1] and kernel.kernels[3].kind == "white"
    grouped = parse_kernel("(rbf + linear) * periodic", 1)
    assert isinstance(grouped, Product) and isinstance(grouped.kernels[0], Sum)


@pytest.mark.parametrize("text, fragment", [
    ("rbf + peridic", "unknown kernel 'peridic' (known: constant, linear, matern12"),
    ("rbf + ", "expected a kernel name, the expression ended"),
    ("rbf(period=1)", "'rbf' has no 'period'"),
    ("periodic(period=one)", "expected a number, found 'one' at character 17"),
    ("rbf(dims=[3])", "uses input column 3, but the data have 2"),
    ("(rbf + rq", "expected ')'"),
    ("rbf $ rq", "unexpected character '$' at character 5"),
])
def test_expression_errors_point_at_the_token(text, fragment):
    with pytest.raises(KernelExpressionError) as error:
        parse_kernel(text, 2)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_kernels_follow_the_dtype_and_device_of_their_values():
    for kind in KINDS:
        kernel = build(kind).to(torch.float32)
        out = kernel(t(X).float(), t(Z).float())
        assert out.dtype == torch.float32 and torch.isfinite(out).all()
        meta = build(kind).to("meta")
        assert meta(t(X).to("meta"), t(Z).to("meta")).device.type == "meta"
        assert meta(t(X).to("meta"), diag=True).device.type == "meta"
