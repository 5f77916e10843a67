"""Wasserstein barycenters of Gaussians (Cohen et al., ICML 2020, §3), float64.

References are computed independently with numpy/scipy (scipy.linalg.sqrtm, the "naive"
fixed-point iteration), not with the library.
"""

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import linalg

from pyrogp_models.models.experts import (
    barycenter_full,
    barycenter_paper,
    barycenter_w2,
    combine,
    fixed_point_residual,
    sqrtm_psd,
    w2_squared,
    w2_squared_1d,
)

D = torch.float64


def t(x):
    return torch.as_tensor(np.asarray(x), dtype=D)


def close(a, b, rtol=1e-12, atol=0.0):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def np_w2sq(m1, K1, m2, K2):
    r = np.real(linalg.sqrtm(K1))
    return np.sum((m1 - m2) ** 2) + np.trace(K1 + K2 - 2 * np.real(linalg.sqrtm(r @ K2 @ r)))


def np_naive_barycenter(Ks, w, iters=2000):
    """S ← Σ w_j (S^{1/2} K_j S^{1/2})^{1/2}: the slower iteration, written independently."""
    S = sum(wj * K for wj, K in zip(w, Ks, strict=True))
    for _ in range(iters):
        r = np.real(linalg.sqrtm(S))
        S = sum(wj * np.real(linalg.sqrtm(r @ K @ r)) for wj, K in zip(w, Ks, strict=True))
    return S


def random_spd(rng, n, d):
    a = rng.normal(size=(n, d, d))
    return a @ a.transpose(0, 2, 1) + 0.1 * np.eye(d)


# ---------------------------------------------------------------- 1-D


def test_w2_distance_closed_forms():
    assert w2_squared_1d(1.0, 4.0, -1.0, 1.0).item() == pytest.approx(5.0, abs=1e-12)
    rng = np.random.default_rng(0)
    m1, m2 = rng.normal(size=(2, 4, 3))
    K1, K2 = random_spd(rng, 4, 3), random_spd(rng, 4, 3)
    ref = [np_w2sq(m1[i], K1[i], m2[i], K2[i]) for i in range(4)]
    close(w2_squared(t(m1), t(K1), t(m2), t(K2)), ref, rtol=1e-9)
    close(sqrtm_psd(t(K1)), np.stack([np.real(linalg.sqrtm(k)) for k in K1]), rtol=1e-10)


def test_1d_barycenters_closed_forms():
    rng = np.random.default_rng(1)
    J, N = 7, 11
    m = rng.normal(size=(J, N))
    v = rng.uniform(0.01, 2.0, (J, N))
    w = rng.dirichlet(np.ones(J), N).T
    bm, bv = barycenter_w2(t(m), t(v), t(w))
    close(bm, (w * m).sum(0), atol=1e-14)
    close(bv, ((w * np.sqrt(v)).sum(0)) ** 2, rtol=1e-12)
    pm, pv = barycenter_paper(t(m), t(v), t(w))
    close(pm, (w * m).sum(0), atol=1e-14)
    close(pv, (w * v).sum(0))
    assert np.all(bv.numpy() <= pv.numpy() + 1e-15)  # Jensen: W2 variance ≤ eq. (12)
    assert np.all(pv.numpy() - bv.numpy() > 1e-6)  # and strictly here (unequal σ_j)
    # unnormalised weights are normalised (a barycenter needs simplex weights)
    bm2, bv2 = barycenter_w2(t(m), t(v), t(3.0 * w))
    close(bm2, bm), close(bv2, bv)


def test_1d_w2_barycenter_minimises_the_objective_and_eq12_does_not():
    rng = np.random.default_rng(2)
    m = rng.normal(size=(5, 1))
    v = rng.uniform(0.05, 3.0, (5, 1))
    w = rng.dirichlet(np.ones(5))[:, None]

    def objective(mu, s2):
        return float(
            np.sum(w[:, 0] * ((m[:, 0] - mu) ** 2 + (np.sqrt(v[:, 0]) - np.sqrt(s2)) ** 2))
        )

    bm, bv = (x.item() for x in barycenter_w2(t(m), t(v), t(w)))
    best = objective(bm, bv)
    for dm, ds in [(1e-3, 0), (-1e-3, 0), (0, 1e-3), (0, -1e-3)]:
        assert objective(bm + dm, (math.sqrt(bv) + ds) ** 2) > best
    _, pv = barycenter_paper(t(m), t(v), t(w))
    assert objective(bm, pv.item()) > best


def test_identical_gaussians_are_returned():
    rng = np.random.default_rng(3)
    m1, v1 = rng.normal(size=(1, 6)), rng.uniform(0.1, 2, (1, 6))
    m, v = np.repeat(m1, 4, 0), np.repeat(v1, 4, 0)
    w = rng.dirichlet(np.ones(4), 6).T
    for fn in (barycenter_w2, barycenter_paper):
        bm, bv = fn(t(m), t(v), t(w))
        close(bm, m1[0]), close(bv, v1[0])
    K = random_spd(rng, 1, 3)[0]
    mean, cov, info = barycenter_full(
        t(np.tile(m1[0, :3], (4, 1))), t(np.tile(K, (4, 1, 1))), t(w[:, 0]), return_info=True
    )
    close(mean, m1[0, :3]), close(cov, K, rtol=1e-11)
    assert info["converged"] and info["iterations"] <= 2


def test_combine_barycenter_rules_and_prior_fallback():
    rng = np.random.default_rng(4)
    m, v = rng.normal(size=(5, 8)), rng.uniform(0.05, 1.0, (5, 8))
    T = 15.0
    w = np.exp(-T * v) / np.exp(-T * v).sum(0)
    a = combine("barycenter", t(m), t(v), weights="softmax-var", temperature=T)
    b = combine("barycenter-paper", t(m), t(v), weights="softmax-var", temperature=T)
    close(a[1], ((w * np.sqrt(v)).sum(0)) ** 2), close(b[1], (w * v).sum(0))
    close(a[0], (w * m).sum(0), atol=1e-14), close(b[0], (w * m).sum(0), atol=1e-14)
    # experts at the prior N(μ0, σ*²) give the prior, with any weights
    mu0, pv = rng.normal(size=8), rng.uniform(0.5, 2, 8)
    for rule in ("barycenter", "barycenter-paper"):
        for wt in ("uniform", "entropy", "softmax-var", "softmax-w2"):
            mean, var = combine(
                rule,
                t(np.tile(mu0, (5, 1))),
                t(np.tile(pv, (5, 1))),
                prior_var=t(pv),
                prior_mean=t(mu0),
                weights=wt,
                temperature=T,
            )
            close(mean, mu0, atol=1e-14), close(var, pv)


# ---------------------------------------------------------------- full covariance


def test_commuting_covariances_spec_case():
    K1 = [[4.0, -2.0], [-2.0, 4.0]]
    K2 = [[4.0, 2.0], [2.0, 4.0]]
    mean, cov, info = barycenter_full(
        t([[1.0, 0.0], [0.0, 1.0]]), t([K1, K2]), t([0.5, 0.5]), return_info=True
    )
    close(cov, (2 + math.sqrt(3)) * np.eye(2), atol=1e-8)
    assert cov[0, 0].item() == pytest.approx(3.7320508076, abs=1e-8)
    close(mean, [0.5, 0.5])
    assert info["converged"] and info["iterations"] <= 3


@pytest.mark.parametrize("kind", ["diagonal", "codiagonal"])
def test_commuting_covariances_batched_closed_form(kind):
    rng = np.random.default_rng(5)
    J, B, d = 4, 3, 5
    lam = rng.uniform(0.05, 4.0, (J, B, d))
    Q = (
        np.eye(d)[None].repeat(B, 0)
        if kind == "diagonal"
        else np.linalg.qr(rng.normal(size=(B, d, d)))[0]
    )
    Ks = np.einsum("bik,jbk,blk->jbil", Q, lam, Q)
    w = rng.dirichlet(np.ones(J), B).T  # [J, B]
    means = rng.normal(size=(J, B, d))
    mean, cov, info = barycenter_full(t(means), t(Ks), t(w), return_info=True)
    ref = np.einsum("bik,bk,blk->bil", Q, (w[..., None] * np.sqrt(lam)).sum(0) ** 2, Q)
    close(cov, ref, rtol=1e-10, atol=1e-12)
    close(mean, (w[..., None] * means).sum(0), atol=1e-14)
    assert info["converged"] and info["iterations"] <= 3


def test_non_commuting_spec_case_and_fixed_point():
    KA = [[2.0, 0.5], [0.5, 1.0]]
    KB = [[1.0, -0.3], [-0.3, 3.0]]
    KC = [[0.5, 0.0], [0.0, 0.2]]
    w = [0.2, 0.3, 0.5]
    Ks = np.array([KA, KB, KC])
    _, cov, info = barycenter_full(t(np.zeros((3, 2))), t(Ks), t(w), return_info=True)
    expected = [[0.8672494832, 0.0179800132], [0.0179800132, 0.8797341541]]
    close(cov, expected, atol=1e-8)
    close(cov, np_naive_barycenter(Ks, w), atol=1e-10)  # independent slow iteration
    assert info["converged"]
    # the fixed-point equation (9) holds at the result, checked with scipy
    r = np.real(linalg.sqrtm(cov.numpy()))
    rhs = sum(wj * np.real(linalg.sqrtm(r @ K @ r)) for wj, K in zip(w, Ks, strict=True))
    close(cov, rhs, atol=1e-11)
    assert info["residual"].item() < 1e-11

    def objective(S):
        return sum(
            wj * np_w2sq(np.zeros(2), K, np.zeros(2), S) for wj, K in zip(w, Ks, strict=True)
        )

    best = objective(cov.numpy())
    assert best == pytest.approx(0.4030163627, abs=1e-9)
    for delta in (1e-3, -1e-3):
        assert objective(cov.numpy() + delta * np.eye(2)) > best


def test_non_commuting_random_batch_converges():
    rng = np.random.default_rng(6)
    J, B, d = 6, 4, 4
    Ks = random_spd(rng, J * B, d).reshape(J, B, d, d)
    w = rng.dirichlet(np.ones(J))
    _, cov, info = barycenter_full(t(np.zeros((J, B, d))), t(Ks), t(w), return_info=True)
    assert info["converged"]
    assert (info["residual"] < 1e-10).all()
    for b in range(B):
        close(cov[b], np_naive_barycenter(Ks[:, b], w, iters=3000), rtol=1e-8, atol=1e-10)
    close(fixed_point_residual(cov, t(Ks), t(w)), info["residual"].numpy())


def test_one_by_one_full_cov_reduces_to_1d_w2():
    rng = np.random.default_rng(7)
    m, v = rng.normal(size=(5, 9)), rng.uniform(0.1, 2, (5, 9))
    w = rng.dirichlet(np.ones(5), 9).T
    mean, cov = barycenter_full(t(m[..., None]), t(v[..., None, None]), t(w))
    bm, bv = barycenter_w2(t(m), t(v), t(w))
    close(mean[..., 0], bm, atol=1e-14), close(cov[..., 0, 0], bv, rtol=1e-11)


def test_non_convergence_warns_and_bad_shapes_raise():
    Ks = t([[[2.0, 0.5], [0.5, 1.0]], [[1.0, -0.3], [-0.3, 3.0]]])
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        _, _, info = barycenter_full(
            t(np.zeros((2, 2))), Ks, t([0.5, 0.5]), max_iter=1, tol=1e-15, return_info=True
        )
    assert not info["converged"] and any("did not converge" in str(r.message) for r in rec)
    with pytest.raises(ValueError, match="expected means"):
        barycenter_full(t(np.zeros((2, 3))), Ks, t([0.5, 0.5]))
