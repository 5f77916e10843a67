"""Local kernels of the distributed SE kernel: exact decomposition, PSD, windows, regions.

References are written independently: the SE kernel in numpy, the feature integral by
``scipy.integrate.quad``, normal tail masses with mpmath at 50 digits.
"""

import math

import mpmath
import numpy as np
import pytest
import torch
from scipy import integrate, stats

from pyrogp_models.errors import DataError
from pyrogp_models.kernels import RBF, Matern32
from pyrogp_models.models.distributed_kernel.local_kernels import LocalKernels
from pyrogp_models.models.distributed_kernel.regions import Regions, default_regions, quantile_cuts
from pyrogp_models.models.distributed_kernel.windows import (
    erfc_window,
    halo_radius,
    interval_mass,
    window,
)

INF = math.inf




def se_numpy(X, Z, lengthscale, variance):
    """σ² exp(−½ Σ_d (x_d − z_d)²/ℓ_d²) by explicit differences."""
    X, Z = np.asarray(X), np.asarray(Z)
    diff = (X[:, None, :] - Z[None, :, :]) / np.asarray(lengthscale)
    return variance * np.exp(-0.5 * (diff**2).sum(-1))


def slide_regions():
    return Regions.from_cuts([-10.0, -5.0, 0.0, 5.0, 10.0])


def three_leaf_tree():
    """Split x0 at 0.3; the right half splits x1 at −0.4."""
    lower = torch.tensor([[-INF, -INF], [0.3, -INF], [0.3, -0.4]])
    upper = torch.tensor([[0.3, INF], [INF, -0.4], [INF, INF]])
    return Regions.from_boxes(lower, upper)


def random_tree(generator, depth=3):
    """Boxes of a random axis-aligned tree on R² (split leaves at random inner points)."""
    lower = torch.full((1, 2), -INF)
    upper = torch.full((1, 2), INF)
    for _ in range(depth):
        leaf = int(torch.randint(lower.shape[0], (1,), generator=generator))
        d = int(torch.randint(2, (1,), generator=generator))
        lo = max(float(lower[leaf, d]), -3.0)
        hi = min(float(upper[leaf, d]), 3.0)
        cut = lo + (hi - lo) * float(torch.rand(1, generator=generator) * 0.8 + 0.1)
        new_lower = torch.cat([lower, lower[leaf:leaf + 1]])
        new_upper = torch.cat([upper, upper[leaf:leaf + 1]])
        new_upper[leaf, d] = cut
        new_lower[-1, d] = cut
        lower, upper = new_lower, new_upper
    return Regions.from_boxes(lower, upper)


# Σ_j k_j = k and PSD ------------------------------------------------------------------------------
def test_slide_split_sums_to_se_kernel_and_is_psd():
    """The slides' example: 401 points in [−20, 20], cuts −10, −5, 0, 5, 10."""
    kernel = RBF(1, lengthscale=1.0, variance=1.0)
    x = torch.linspace(-20, 20, 401).unsqueeze(-1)
    K_j = LocalKernels(kernel, slide_regions())(x).detach()
    assert K_j.shape == (6, 401, 401)
    reference = se_numpy(x.numpy(), x.numpy(), [1.0], 1.0)
    assert np.abs(K_j.sum(0).numpy() - reference).max() <= 1e-12
    eigenvalues = torch.linalg.eigvalsh(K_j)
    assert bool((eigenvalues.min(-1).values >= -1e-10 * eigenvalues.max(-1).values).all())


@pytest.mark.parametrize("ard", [False, True])
def test_random_1d_cuts_sum_to_se_kernel(ard):
    generator = torch.Generator().manual_seed(1)
    cuts = torch.sort(torch.rand(7, generator=generator) * 16 - 8).values
    regions = Regions.from_cuts(cuts, input_dim=2, dim=1)
    ell = torch.tensor([0.6, 1.7]) if ard else torch.tensor([1.3])
    kernel = RBF(2, ard=ard, lengthscale=ell, variance=2.3)
    X = torch.randn(150, 2, generator=generator) * 5
    Z = torch.randn(40, 2, generator=generator) * 5
    K_j = LocalKernels(kernel, regions)(X, Z).detach()
    reference = se_numpy(X.numpy(), Z.numpy(), ell.expand(2).numpy(), 2.3)
    assert np.abs(K_j.sum(0).numpy() - reference).max() <= 1e-12 * 2.3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_2d_trees_sum_to_se_kernel_and_are_psd(seed):
    generator = torch.Generator().manual_seed(seed)
    regions = random_tree(generator, depth=4) if seed else three_leaf_tree()
    ell = torch.tensor([0.7, 1.9])
    kernel = RBF(2, ard=True, lengthscale=ell, variance=1.7)
    X = torch.randn(200, 2, generator=generator) * 2
    K_j = LocalKernels(kernel, regions)(X).detach()
    reference = se_numpy(X.numpy(), X.numpy(), ell.numpy(), 1.7)
    assert np.abs(K_j.sum(0).numpy() - reference).max() <= 1e-12 * 1.7
    eigenvalues = torch.linalg.eigvalsh(K_j)
    assert bool((eigenvalues.min(-1).values >= -1e-10 * eigenvalues.max(-1).values).all())


def test_windows_of_a_partition_sum_to_one_far_out():
    regions = random_tree(torch.Generator().manual_seed(5), depth=5)
    lower, upper = regions.full_bounds()
    points = torch.randn(500, 2) * 30
    w = window(points, lower, upper, torch.tensor([0.5, 2.0])).detach()
    assert bool((w >= 0).all())
    assert (w.sum(-1) - 1).abs().max() <= 1e-13


def test_other_kernel_families_refuse_to_split():
    with pytest.raises(NotImplementedError, match="squared-exponential"):
        LocalKernels(Matern32(1), slide_regions())


# closed forms -------------------------------------------------------------------------------------
def test_slide_erfc_form_equals_normal_cdf_form():
    """½[erfc(s_j) − erfc(s_{j+1})] = Φ((a_{j+1} − x̄)/(ℓ/2)) − Φ((a_j − x̄)/(ℓ/2))."""
    regions = slide_regions()
    lower, upper = regions.bounds()
    ell = torch.tensor([1.0])
    points = torch.linspace(-15, 15, 301).unsqueeze(-1)
    stable = window(points, lower, upper, ell)
    slide = erfc_window(points, lower, upper, ell)
    assert (stable - slide).abs().max() <= 1e-14


def test_local_kernel_is_the_feature_integral():
    """k_j(x, x') = ∫_a^b φ(x, z) φ(x', z) dz, φ = σ_f (πℓ²/2)^(−1/4) exp(−(x − z)²/ℓ²)."""
    generator = np.random.default_rng(3)
    for _ in range(6):
        x, x2 = generator.uniform(-3, 3, size=2)
        a, b = np.sort(generator.uniform(-4, 4, size=2))
        ell, sf = generator.uniform(0.4, 2.0), generator.uniform(0.5, 2.0)

        def phi(z, x=x, ell=ell, sf=sf):
            return sf / (math.pi * ell**2 / 2) ** 0.25 * math.exp(-((x - z) ** 2) / ell**2)

        def integrand(z, x2=x2):
            return phi(z) * phi(z, x=x2)

        integral, _ = integrate.quad(integrand, a, b, epsabs=0, epsrel=1e-12)
        regions = Regions.from_cuts([a, b])
        kernel = RBF(1, lengthscale=ell, variance=sf**2)
        value = LocalKernels(kernel, regions)(torch.tensor([[x]]), torch.tensor([[x2]]))
        value = value[1, 0, 0].detach()
        assert abs(float(value) - integral) <= 1e-8 * abs(integral)


def test_locality_of_the_marginal_variance():
    """σ²/2 at a finite cut, σ²Φ(−2) one ℓ outside, ≥ (1 − 1e−6)σ² mid-way in a 5ℓ region."""
    ell, sf2 = 1.3, 2.0
    regions = Regions.from_cuts([0.0, 5 * ell])
    kernel = RBF(1, lengthscale=ell, variance=sf2)
    points = torch.tensor([[0.0], [-ell], [2.5 * ell]])
    diag = LocalKernels(kernel, regions).diag(points)[1].detach()
    assert abs(float(diag[0]) - sf2 / 2) <= 1e-12
    assert abs(float(diag[1]) - sf2 * stats.norm.cdf(-2.0)) <= 1e-12
    assert float(diag[2]) >= (1 - 1e-6) * sf2


# numerical behaviour ------------------------------------------------------------------------------
@pytest.mark.parametrize("lo,hi,centre", [(5.0, 6.0, 0.0), (-6.0, -5.0, 0.0), (30.0, 30.5, 0.0),
                                          (-30.5, -30.0, 0.0), (20.0, INF, 0.0),
                                          (-INF, -20.0, 0.0), (-1.0, 1.0, 0.2),
                                          (-INF, 0.5, 0.0), (1.0, 1.001, 0.0)])
def test_window_is_accurate_in_the_far_tails(lo, hi, centre):
    """Relative accuracy 1e−12 down to masses of 1e−198 (float64)."""
    mpmath.mp.dps = 50

    def cdf(t):
        return mpmath.ncdf(mpmath.mpf(t)) if math.isfinite(t) else (1 if t > 0 else 0)

    a, b = lo - centre, hi - centre
    # mirror so that the mass is computed as a difference of small upper tails
    exact = float((cdf(-a) - cdf(-b)) if a > 0 else (cdf(b) - cdf(a)))
    value = float(interval_mass(torch.tensor(lo), torch.tensor(hi), torch.tensor(centre),
                                torch.tensor(1.0)))
    assert abs(value - exact) <= 1e-12 * exact


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_windows_past_underflow_are_zero_with_finite_gradients(dtype):
    """Far enough out a window underflows (Φ(−a) below the smallest number: a ≈ 14 in float32,
    38 in float64); it is then 0 — never NaN — and so are its gradients, in either dtype."""
    distance = torch.tensor([1.0, 10.0, 20.0, 60.0, 1e4], dtype=dtype)
    lo = (distance * 0.5).requires_grad_()            # scale 1/2: a = 2·distance·…
    centre = torch.zeros(5, dtype=dtype, requires_grad=True)
    scale = torch.tensor(0.5, dtype=dtype, requires_grad=True)
    mass = interval_mass(lo, torch.full_like(lo, INF), centre, scale)
    mass.sum().backward()
    assert mass.dtype == dtype and float(mass[-1]) == 0.0
    for value in (mass, lo.grad, centre.grad, scale.grad):
        assert bool(torch.isfinite(value).all())
    reference = [stats.norm.sf(2 * d / 2) for d in distance.tolist()]   # a = lo/scale
    for value, exact in zip(mass.tolist(), reference, strict=True):
        assert abs(value - exact) <= 64 * torch.finfo(dtype).eps * exact + torch.finfo(dtype).tiny


def test_window_gradients_are_finite_with_infinite_ends_and_far_points():
    regions = Regions.from_cuts([-1.0, 2.0], learn_cuts=True)
    kernel = RBF(1, lengthscale=0.8, variance=1.0)
    x = torch.tensor([[-300.0], [-2.0], [0.0], [2.0], [50.0], [1e4]], requires_grad=True)
    K = LocalKernels(kernel, regions)(x)
    K.sum().backward()
    grads = [regions.cut_start_unconstrained.grad, regions.cut_increments_unconstrained.grad,
             kernel.lengthscale_unconstrained.grad, x.grad]
    assert all(bool(torch.isfinite(g).all()) for g in grads)


def test_learned_cuts_stay_ordered_for_any_raw_values():
    regions = Regions.from_cuts([-3.0, 0.0, 4.0, 5.0], learn_cuts=True)
    with torch.no_grad():
        regions.cut_increments_unconstrained.copy_(torch.tensor([[-50.0, 3.0, -700.0]]))
        regions.cut_start_unconstrained.fill_(-2.0)
    cuts = regions.cut_values()[0]
    assert bool((cuts.diff() > 0).all())
    lower, upper = regions.bounds()
    assert bool((upper[:-1, 0] == lower[1:, 0]).all())


def test_quantile_cuts_balance_counts_and_respect_the_minimum_width():
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(10000, generator=generator) * 100
    cuts = quantile_cuts(x, 8, min_width=2.0)
    counts = torch.bincount(torch.searchsorted(cuts, x), minlength=8)
    assert int(counts.max() - counts.min()) <= 2
    # clustered data: quantile cuts would be too close; they are pushed apart to 5 units
    clustered = torch.cat([torch.zeros(900), torch.rand(100, generator=generator) * 40])
    cuts = quantile_cuts(clustered, 6, min_width=5.0)
    edges = torch.cat([clustered.min().reshape(1), cuts, clustered.max().reshape(1)])
    assert float(edges.diff().min()) >= 5.0 - 1e-12
    with pytest.raises(DataError, match="do not fit"):
        quantile_cuts(clustered, 9, min_width=5.0)


def test_default_regions_split_the_dimension_with_most_lengthscales():
    X = torch.stack([torch.linspace(0, 10, 500), torch.linspace(0, 40, 500)], -1)
    regions = default_regions(X, 4, torch.tensor([0.5, 4.0]))
    assert regions.active_dims == [0]
    counts = torch.bincount(regions.owner(X), minlength=4)
    assert int(counts.min()) >= 124


def test_owner_and_halo_radius():
    regions = three_leaf_tree()
    X = torch.tensor([[0.0, 5.0], [0.3, -0.4], [0.5, -1.0], [1.0, 2.0]])
    assert regions.owner(X).tolist() == [0, 2, 1, 2]
    radius = halo_radius(torch.tensor([2.0]), 1e-12)
    assert abs(float(radius) - stats.norm.isf(1e-12)) <= 1e-9


def test_window_gradient_is_the_derivative_of_the_window():
    generator = torch.Generator().manual_seed(4)
    lo = (torch.randn(3, 1, 1, generator=generator) * 3).requires_grad_()
    hi = (lo.detach() + torch.rand(3, 1, 1, generator=generator) * 4 + 0.1).requires_grad_()
    centre = (torch.randn(3, 4, 5, generator=generator) * 6).requires_grad_()
    scale = torch.tensor(0.7, requires_grad=True)
    assert torch.autograd.gradcheck(interval_mass, (lo, hi, centre, scale))


@pytest.mark.parametrize("distance", [6.0, 9.0, 12.0, 18.0, 24.0])
def test_moderate_tails_keep_relative_accuracy(distance):
    """A 1-wide interval `distance` standard deviations away: relative error ≤ 1e−12."""
    mpmath.mp.dps = 50
    exact = mpmath.ncdf(-distance) - mpmath.ncdf(-distance - 1)
    for lo, hi in ((distance, distance + 1), (-distance - 1, -distance)):
        value = float(interval_mass(torch.tensor(lo), torch.tensor(hi), torch.tensor(0.0),
                                    torch.tensor(1.0)))
        assert abs(value - float(exact)) <= 1e-12 * float(exact)
