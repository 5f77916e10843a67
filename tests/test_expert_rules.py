"""Product-of-experts rules and weights (Cohen et al., ICML 2020), checked in float64.

Reference values are recomputed here with plain numpy, written independently of the library.
"""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from pyrogp_models.likelihoods import make_likelihood
from pyrogp_models.models.experts import (
    PRESETS,
    bcm,
    combine,
    combine_in_y_space,
    differential_entropy,
    gpoe,
    grbcm,
    normalise_weights,
    poe,
    rbcm,
    softmax_entropy,
    softmax_variance,
    softmax_w2,
    tempered_softmax,
    uniform,
)

D = torch.float64
RTOL = 1e-12


def t(x, dtype=D):
    return torch.as_tensor(np.asarray(x), dtype=dtype)


def experts(J, N=7, prior_var=None, seed=0):
    """Random experts: m_j in [-2, 2], var_j in [0.01, 0.99] * prior_var."""
    rng = np.random.default_rng(seed)
    pv = rng.uniform(0.5, 2.0, N) if prior_var is None else np.broadcast_to(prior_var, N)
    m = rng.uniform(-2, 2, (J, N))
    v = rng.uniform(0.01, 0.99, (J, N)) * pv
    return m, v, np.array(pv, dtype=float)


def close(a, b, rtol=RTOL, atol=0.0):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


# ---------------------------------------------------------------- numpy reference rules


def np_gpoe(m, v, b):
    prec = (b / v).sum(0)
    return (b * m / v).sum(0) / prec, 1 / prec


def np_rbcm(m, v, b, pv, mu0=0.0):
    """Eq. (4) with the prior-mean term: σ⁻² = Σβσ_j⁻² + (1−Σβ)σ*⁻², written out directly."""
    prec = (b / v).sum(0) + (1 - b.sum(0)) / pv
    return ((b * m / v).sum(0) + (1 - b.sum(0)) * mu0 / pv) / prec, 1 / prec


def np_softmax(logits):
    z = logits - logits.max(0)
    e = np.exp(z)
    return e / e.sum(0)


# ---------------------------------------------------------------- one expert (Prop. 3)


@pytest.mark.parametrize("mu0", [0.0, 0.7])
def test_one_expert_every_normalised_rule_returns_it(mu0):
    m, v, pv = experts(1)
    M, V, PV = t(m), t(v), t(pv)
    cases = {
        "poe": {},
        "bcm": {},
        "gpoe": {"weights": "uniform"},
        "gpoe-var": {"weights": "softmax-var", "temperature": 100.0},
        "rbcm": {"weights": torch.ones_like(M)},
        "rbcm-var": {"weights": "softmax-var", "temperature": 15.0},
        "barycenter": {},
        "barycenter-paper": {"weights": "softmax-var", "temperature": 100.0},
        "grbcm": {"communication": (t(np.full(7, mu0)), PV)},
    }
    for name, kw in cases.items():
        rule = name.split("-var")[0]
        mean, var = combine(rule, M, V, prior_var=PV, prior_mean=mu0, **kw)
        close(mean, m[0]), close(var, v[0])


def test_rbcm_entropy_one_expert_is_not_the_expert_prop3():
    m, v, pv = experts(1)
    mean, var = combine("rbcm", t(m), t(v), prior_var=t(pv), weights="entropy")
    beta = 0.5 * (np.log(pv) - np.log(v[0]))
    prec = beta / v[0] + (1 - beta) / pv  # Prop. 3
    close(var, 1 / prec)
    close(mean, m[0] * beta / v[0] / prec)
    assert np.all(np.abs(var.numpy() - v[0]) > 1e-3)


# ---------------------------------------------------------------- identical experts (eqs. 3–4)


@pytest.mark.parametrize("J", [3, 50])
def test_identical_experts(J):
    m1, v1, pv = experts(1)
    m, v = np.repeat(m1, J, 0), np.repeat(v1, J, 0)
    M, V, PV = t(m), t(v), t(pv)
    mean, var = poe(M, V)
    close(1 / var, J / v1[0]), close(mean, m1[0])
    mean, var = gpoe(M, V, uniform(V))
    close(var, v1[0]), close(mean, m1[0])
    for rule in ("barycenter", "barycenter-paper"):
        mean, var = combine(rule, M, V, weights="softmax-var", temperature=3.0)
        close(var, v1[0]), close(mean, m1[0])
    mean, var = bcm(M, V, prior_var=PV)
    prec = J / v1[0] - (J - 1) / pv
    close(1 / var, prec)
    # Eq. (4) with β ≡ 1 gives the mean m·Jσ⁻²/(Jσ⁻² − (J−1)σ*⁻²), which equals m only for
    # m = 0: the effective weights sum to more than one.
    close(mean, m1[0] * (J / v1[0]) / prec)
    assert np.all(np.abs(mean.numpy()) > np.abs(m1[0]))
    beta = t(np.random.default_rng(1).dirichlet(np.ones(J), 7).T)
    a, b = rbcm(M, V, beta, prior_var=PV), gpoe(M, V, beta)
    close(a[0], b[0]), close(a[1], b[1])


# ---------------------------------------------------------------- gPoE as a geometric mean (eq. 3)


def test_gpoe_uniform_is_normalised_geometric_mean():
    J = 5
    m, v, pv = experts(J, N=1)
    mean, var = gpoe(t(m), t(v), uniform(t(v)))
    f = np.linspace(-4, 4, 41)[:, None]
    lhs = np.mean(stats.norm.logpdf(f, m[:, 0], np.sqrt(v[:, 0])), axis=1)
    rhs = stats.norm.logpdf(f[:, 0], mean.item(), math.sqrt(var.item()))
    assert np.ptp(lhs - rhs) < 1e-9
    pm, pvar = poe(t(m), t(v))
    close(mean, pm), close(var, J * pvar)


# ---------------------------------------------------------------- Prop. 2


@pytest.mark.parametrize("J", [1, 3, 50])
@pytest.mark.parametrize("mu0", [0.0, -1.3])
def test_normalised_weights_make_rbcm_equal_gpoe_prop2(J, mu0):
    m, v, pv = experts(J)
    beta = np.random.default_rng(2).dirichlet(np.ones(J), 7).T
    a = rbcm(t(m), t(v), t(beta), prior_var=t(pv), prior_mean=mu0)
    b = gpoe(t(m), t(v), t(beta))
    ref = np_gpoe(m, v, beta)
    close(a[0], ref[0], atol=1e-12), close(a[1], ref[1])
    close(b[0], ref[0], atol=1e-12), close(b[1], ref[1])
    for w in ("softmax-var", "softmax-entropy", "softmax-w2", "uniform"):
        kw = {"prior_var": t(pv), "prior_mean": mu0, "weights": w, "temperature": 7.0}
        a, b = combine("rbcm", t(m), t(v), **kw), combine("gpoe", t(m), t(v), **kw)
        close(a[0], b[0], atol=1e-12), close(a[1], b[1])


def test_rbcm_matches_independent_formula_with_prior_mean():
    J = 6
    m, v, pv = experts(J)
    mu0 = np.linspace(-1, 1, 7)
    beta = np.random.default_rng(3).uniform(0, 2, (J, 7))  # unnormalised
    mean, var = rbcm(t(m), t(v), t(beta), prior_var=t(pv), prior_mean=t(mu0))
    ref = np_rbcm(m, v, beta, pv, mu0)
    close(mean, ref[0], rtol=1e-11), close(var, ref[1], rtol=1e-11)
    # entropy weights through combine
    be = 0.5 * (np.log(pv) - np.log(v))
    mean, var = combine("rbcm", t(m), t(v), prior_var=t(pv), prior_mean=t(mu0))
    ref = np_rbcm(m, v, be, pv, mu0)
    close(mean, ref[0], rtol=1e-11), close(var, ref[1], rtol=1e-11)


# ---------------------------------------------------------------- BCM exactness (eq. 4)


def test_bcm_is_exact_for_conditionally_independent_experts():
    J, pv, sn2 = 4, 1.3, 0.2
    y = np.array([0.3, -0.1, 0.5, 0.2])
    vj = 1 / (1 / pv + 1 / sn2)  # each expert saw one observation at x*
    m, v = (vj * y / sn2)[:, None], np.full((J, 1), vj)
    mean, var = bcm(t(m), t(v), prior_var=pv)
    close(1 / var, 1 / pv + J / sn2)
    close(mean, (y.sum() / sn2) / (1 / pv + J / sn2))
    _, var_poe = poe(t(m), t(v))
    close(1 / var_poe, J / pv + J / sn2)


def test_expert_above_prior_variance_is_clamped_to_the_prior():
    """σ_j² > σ*² (SVGP experts, jitter) must not lower the (r)BCM precision of eq. (4)."""
    m, v, pv = experts(3)
    m_bad = np.vstack([m, np.full((1, 7), 5.0)])
    v_bad = np.vstack([v, 1.5 * pv[None]])
    a = bcm(t(m_bad), t(v_bad), prior_var=t(pv))
    ref = np_rbcm(m_bad, np.minimum(v_bad, pv), np.ones_like(v_bad), pv)
    close(a[0], ref[0], rtol=1e-11), close(a[1], ref[1], rtol=1e-11)
    # clamped to the prior, an expert with the prior mean has no effect at all
    m_bad[-1] = 0.0
    a, b = bcm(t(m_bad), t(v_bad), prior_var=t(pv)), bcm(t(m), t(v), prior_var=t(pv))
    close(a[0], b[0], rtol=1e-11), close(a[1], b[1], rtol=1e-11)
    be = differential_entropy(t(v_bad), t(pv))
    assert (be[-1] == 0).all() and (be[:-1] > 0).all()


# ---------------------------------------------------------------- prior fallback (§2.2)


@pytest.mark.parametrize("shape", ["JN", "JNC"])
def test_far_from_data_rules_return_prior(shape):
    J, N, C = 8, 5, 3
    rng = np.random.default_rng(4)
    pv = rng.uniform(0.5, 2.0, N)
    mu0 = rng.uniform(-1, 1, N)
    if shape == "JN":
        m, v, ref_m, ref_v = np.tile(mu0, (J, 1)), np.tile(pv, (J, 1)), mu0, pv
    else:
        m = np.tile(mu0[:, None], (J, 1, C))
        v = np.tile(pv[:, None], (J, 1, C))
        ref_m, ref_v = m[0], v[0]
    M, V, PV, MU = t(m), t(v), t(pv), t(mu0)
    kw = {"prior_var": PV, "prior_mean": MU}
    runs = [
        ("gpoe", {"weights": "uniform"}),
        ("gpoe", {"weights": "softmax-var", "temperature": 100.0}),
        ("bcm", {}),
        ("rbcm", {}),
        ("rbcm", {"weights": "softmax-var", "temperature": 100.0, "normalise": False}),
        ("rbcm", {"weights": t(rng.uniform(0, 3, (J, N)))}),
        ("barycenter", {"weights": "entropy"}),
        ("barycenter-paper", {"weights": "softmax-var", "temperature": 100.0}),
    ]
    for rule, extra in runs:
        mean, var = combine(rule, M, V, **kw, **extra)
        close(mean, ref_m, atol=1e-14), close(var, ref_v)
    mean, var = poe(M, V)
    close(var, ref_v / J)


# ---------------------------------------------------------------- softmax limits (eq. 13, Prop. 1)


def test_temperature_zero_is_uniform_and_infinite_is_argmin_prop1():
    J = 6
    m, v, pv = experts(J)
    V = t(v)
    close(softmax_variance(V, 0.0), np.full((J, 7), 1 / J))
    best = v.argmin(0)
    onehot = np.zeros_like(v)
    onehot[best, np.arange(7)] = 1
    close(softmax_variance(V, math.inf), onehot)
    close(softmax_variance(V, 1e8), onehot)
    for T in (1e8, math.inf):
        outs = [
            combine("gpoe", t(m), V, weights="softmax-var", temperature=T),
            combine("rbcm", t(m), V, weights="softmax-var", temperature=T, prior_var=t(pv)),
            combine("barycenter", t(m), V, weights="softmax-var", temperature=T),
            combine("barycenter-paper", t(m), V, weights="softmax-var", temperature=T),
        ]
        for mean, var in outs:
            close(mean, m[best, np.arange(7)], rtol=1e-10)
            close(var, v[best, np.arange(7)], rtol=1e-10)


def test_infinite_temperature_splits_ties_equally():
    v = t([[0.1, 0.5], [0.1, 0.2], [0.3, 0.2]])
    close(tempered_softmax(v, math.inf), [[0.5, 0], [0.5, 0.5], [0, 0.5]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_high_temperature_far_from_data_has_no_nan(dtype):
    J, N = 50, 4
    m = torch.zeros(J, N, dtype=dtype)
    v = torch.ones(J, N, dtype=dtype)
    close(softmax_variance(v, 1e4), np.full((J, N), 1 / J), rtol=1e-6)
    # experts at the prior (up to float32 rounding on either side)
    v = v * (1 + 1e-7 * torch.linspace(-1, 1, J, dtype=dtype))[:, None]
    pv = torch.ones(N, dtype=dtype)
    for T in (100.0, 1e4):
        for name, kw in PRESETS.items():
            if name == "grBCM":
                kw = {**kw, "communication": (torch.zeros(N, dtype=dtype), pv)}
            mean, var = _run(kw, m, v, pv, T)
            assert mean.dtype == dtype and var.dtype == dtype
            assert torch.isfinite(mean).all() and torch.isfinite(var).all(), name
            assert (var > 0).all(), name
        # naive normalisation underflows to 0/0 in float32 at T = 1e4; ours does not
        w = softmax_variance(v, T)
        assert torch.isfinite(w).all()
        close(w.sum(0).double(), np.ones(N), rtol=1e-5)


def _run(kw, m, v, pv, T):
    kw = dict(kw)
    rule = kw.pop("rule")
    return combine(rule, m, v, prior_var=pv, temperature=T, **kw)


def test_temperature_gradient_is_finite_in_float32():
    J, N = 20, 3
    m = torch.randn(J, N, generator=torch.Generator().manual_seed(0))
    v = torch.full((J, N), 1.0)
    v[0] = 0.01
    T = torch.tensor(100.0, requires_grad=True)
    mean, var = combine("gpoe", m, v, weights="softmax-var", temperature=T)
    (mean.sum() + var.sum()).backward()
    assert torch.isfinite(T.grad)


# ---------------------------------------------------------------- convex hull of the expert means


def test_normalised_means_stay_in_convex_hull():
    m, v, pv = experts(50, N=200, seed=5)
    lo, hi = m.min(0), m.max(0)
    for rule, w in [
        ("gpoe", "uniform"),
        ("gpoe", "softmax-var"),
        ("gpoe", "entropy"),
        ("barycenter", "softmax-var"),
        ("barycenter-paper", "entropy"),
    ]:
        mean, _ = combine(rule, t(m), t(v), prior_var=t(pv), weights=w, temperature=15.0)
        mean = mean.numpy()
        assert np.all(mean >= lo - 1e-12) and np.all(mean <= hi + 1e-12), (rule, w)


# ---------------------------------------------------------------- weights


def test_weight_sign_conventions():
    pv = t([1.0])
    v = t([[0.1], [0.5], [1.0], [1.2]])
    be = differential_entropy(v, pv)
    close(be[:, 0], [0.5 * math.log(10), 0.5 * math.log(2), 0.0, 0.0])  # clamped at 0
    se = softmax_entropy(v, pv, 2.0)
    # β ∝ (σ*²/σ_j²)^{T/2}: the confident expert gets the largest weight
    ref = np.array([10.0, 2.0, 1.0, 1.0])
    close(se[:, 0], ref / ref.sum())
    m = t([[0.0], [0.0], [0.0], [0.0]])
    sw = softmax_w2(m, v, pv, 1.0)
    w2 = (1 - np.sqrt([0.1, 0.5, 1.0, 1.2])) ** 2
    close(sw[:, 0], np.exp(w2) / np.exp(w2).sum())
    assert sw[0, 0] > sw[1, 0] > sw[2, 0]
    sv = softmax_variance(v, 3.0, normalise=False)
    close(sv[:, 0], np.exp(-3 * np.array([0.1, 0.5, 1.0, 1.2])))


def test_softmax_matches_naive_and_is_invariant_to_noise():
    m, v, pv = experts(9)
    T = 15.0
    ref = np_softmax(-T * v)
    close(softmax_variance(t(v), T), ref)
    close(softmax_variance(t(v) + 0.3, T), ref)  # same weights in f- and y-space
    close(softmax_variance(t(v), T, log=True), np.log(ref))
    close(softmax_variance(t(v), T, relative_to=t(pv)), np_softmax(-T * v / pv))


def test_normalise_weights_falls_back_to_uniform():
    w = t([[0.0, 1.0], [0.0, 3.0]])
    close(normalise_weights(w), [[0.5, 0.25], [0.5, 0.75]])
    with pytest.raises(ValueError, match="non-negative"):
        normalise_weights(t([[-1.0], [2.0]]))


# ---------------------------------------------------------------- grBCM


def test_grbcm_matches_eq5_and_liu_weights():
    J = 5
    m, v, pv = experts(J, seed=6)
    mc = np.random.default_rng(7).uniform(-1, 1, 7)
    vc = v.max(0) * 1.1  # the communication expert is less informed than each +j
    mean, var = grbcm(t(m), t(v), (t(mc), t(vc)))
    beta = 0.5 * (np.log(vc) - np.log(v))
    beta[0] = 1.0
    prec = (beta * (1 / v - 1 / vc)).sum(0) + 1 / vc
    ref_m = ((beta * m / v).sum(0) - (beta.sum(0) - 1) * mc / vc) / prec
    close(var, 1 / prec), close(mean, ref_m, rtol=1e-11)
    same = combine("grbcm", t(m), t(v), communication=(t(mc), t(vc)), weights="entropy")
    close(same[0], mean), close(same[1], var)
    # all augmented experts equal the communication expert -> returns it
    mean, var = grbcm(t(np.tile(mc, (J, 1))), t(np.tile(vc, (J, 1))), (t(mc), t(vc)))
    close(mean, mc), close(var, vc)


# ---------------------------------------------------------------- shapes, dtypes, errors


def test_multiclass_equals_per_class_and_keeps_dtype():
    J, N, C = 4, 6, 3
    rng = np.random.default_rng(8)
    pv = rng.uniform(0.5, 2, N)
    m = rng.normal(size=(J, N, C))
    v = rng.uniform(0.01, 0.99, (J, N, C)) * pv[:, None]
    for rule in ("gpoe", "rbcm", "barycenter", "bcm"):
        w = None if rule == "bcm" else "softmax-var"
        mean, var = combine(rule, t(m), t(v), prior_var=t(pv), weights=w, temperature=10.0)
        assert mean.shape == (N, C)
        for c in range(C):
            mc, vc = combine(
                rule, t(m[..., c]), t(v[..., c]), prior_var=t(pv), weights=w, temperature=10.0
            )
            close(mean[:, c], mc), close(var[:, c], vc)
    m32, v32 = t(m, torch.float32), t(v, torch.float32)
    mean, var = combine("gpoe", m32, v32, weights="softmax-var", temperature=10.0)
    assert mean.dtype == torch.float32 and var.dtype == torch.float32


def test_combine_errors_are_clear():
    m, v, pv = experts(3)
    M, V = t(m), t(v)
    with pytest.raises(ValueError, match="unknown combination rule 'nope'"):
        combine("nope", M, V)
    with pytest.raises(ValueError, match="unknown weighting 'bogus'"):
        combine("gpoe", M, V, weights="bogus")
    with pytest.raises(ValueError, match="temperature"):
        combine("gpoe", M, V, weights="softmax-var")
    with pytest.raises(ValueError, match="prior_var"):
        combine("bcm", M, V)
    with pytest.raises(ValueError, match="fixed weights"):
        combine("poe", M, V, weights="uniform")
    with pytest.raises(ValueError, match="simplex"):
        combine("barycenter", M, V, weights="uniform", normalise=False)
    with pytest.raises(ValueError, match="non-negative"):
        combine("gpoe", M, V, weights=-torch.ones(3))
    with pytest.raises(ValueError, match="communication"):
        combine("grbcm", M, V)
    with pytest.raises(ValueError, match="differ in shape"):
        combine("poe", M, V[:2])
    with pytest.raises(ValueError, match="not positive"):
        rbcm(M, 2 * t(np.tile(pv, (3, 1))), torch.full((3,), 2.0), prior_var=t(pv), clamp=False)


# ---------------------------------------------------------------- 1-D study of Fig. 1


def liu_f(x):
    """Liu et al. (2018) toy function (their demo_toy.m)."""
    return 5 * x**2 * np.sin(12 * x) + (x**3 - 0.5) * np.sin(3 * x - 0.5) + 4 * np.cos(2 * x)


def _liu_toy():
    """Fig. 1 setting: 300 noise-free points of Liu et al.'s function, 100 experts of 3
    consecutive points, fixed hyperparameters; numpy only."""
    x = np.linspace(0, 1, 300)
    y = liu_f(x)
    y = (y - y.mean()) / y.std()
    ell, sf2, sn2 = 0.1, 1.0, 0.03

    def k(a, b):
        return sf2 * np.exp(-0.5 * (a[..., :, None] - b[..., None, :]) ** 2 / ell**2)

    xt = np.linspace(-0.5, 1.5, 2001)
    K = k(x, x) + sn2 * np.eye(300)
    A = np.linalg.solve(K, np.c_[y, k(x, xt)])
    full = (k(x, xt).T @ A[:, 0], sf2 - np.sum(k(x, xt) * A[:, 1:], 0))
    xj, yj = x.reshape(100, 3), y.reshape(100, 3)
    Kj = k(xj, xj) + sn2 * np.eye(3)
    Ksj = sf2 * np.exp(-0.5 * (xj[:, :, None] - xt[None, None, :]) ** 2 / ell**2)
    Aj = np.linalg.solve(Kj, np.concatenate([yj[:, :, None], Ksj], 2))
    m = np.einsum("jin,ji->jn", Ksj, Aj[:, :, 0])
    v = sf2 - np.sum(Ksj * Aj[:, :, 1:], 1)
    return xt, m, v, full


GOLDEN_X = [-0.1, 0.5, 1.05, 1.1, 1.5]
# Latent (mean, var) at GOLDEN_X from an independent float64 numpy computation (atol 5e-4);
# the numpy rules below reproduce them.
GOLDEN = {
    "full": [(0.6364, 0.3854), (0.0502, 0.0013), (-1.2176, 0.0928), (-0.5876, 0.3854), (0, 1)],
    "PoE": [(0.0480, 0.0098), (0.0569, 0.0025), (-0.2871, 0.0090), (-0.1003, 0.0098), (0, 0.01)],
    "gPoE_unif": [(0.0480, 0.9792), (0.0569, 0.2514), (-0.2871, 0.9028), (-0.1003, 0.9792), (0, 1)],
    "BCM": [(1.5679, 0.3200), (0.0758, 0.0033), (-2.7021, 0.0850), (-3.2774, 0.3200), (0, 1)],
    "rBCM_entr": [(0.4271, 0.7681), (0.0572, 0.0019), (-2.0776, 0.1644), (-0.8495, 0.7681), (0, 1)],
    "gPoE_var15": [
        (0.4728, 0.7179),
        (0.0522, 0.0219),
        (-1.6100, 0.2647),
        (-0.8901, 0.7179),
        (0, 1),
    ],
    "gPoE_var": [(0.5850, 0.6341), (0.0503, 0.0134), (-1.6126, 0.2401), (-1.0643, 0.6341), (0, 1)],
    "BAR_var": [(0.5850, 0.6341), (0.0507, 0.0150), (-1.6126, 0.2401), (-1.0643, 0.6341), (0, 1)],
    "BAR_var_w2": [
        (0.5850, 0.6341),
        (0.0507, 0.0144),
        (-1.6126, 0.2401),
        (-1.0643, 0.6341),
        (0, 1),
    ],
    "rBCM_var_u15": [
        (0.0001, 0.9999),
        (0.0531, 0.0053),
        (-0.2152, 0.9017),
        (-0.0002, 0.9999),
        (0, 1),
    ],
}


def _np_golden_rules(m, v):
    """Every rule of the table, in plain numpy (prior variance 1, prior mean 0)."""
    J, ones = m.shape[0], np.ones_like(v)
    sm100, sm15 = np_softmax(-100 * v), np_softmax(-15 * v)
    return {
        "PoE": np_gpoe(m, v, ones),
        "gPoE_unif": np_gpoe(m, v, ones / J),
        "BCM": np_rbcm(m, v, ones, 1.0),
        "rBCM_entr": np_rbcm(m, v, -0.5 * np.log(v), 1.0),
        "gPoE_var15": np_gpoe(m, v, sm15),
        "gPoE_var": np_gpoe(m, v, sm100),
        "BAR_var": ((sm100 * m).sum(0), (sm100 * v).sum(0)),
        "BAR_var_w2": ((sm100 * m).sum(0), (sm100 * np.sqrt(v)).sum(0) ** 2),
        "rBCM_var_u15": np_rbcm(m, v, np.exp(-15 * v), 1.0),
    }


def _torch_golden_rules(m, v):
    M, V, pv = t(m), t(v), torch.ones(m.shape[1], dtype=D)

    def run(preset, T=100.0):
        kw = dict(PRESETS[preset])
        return combine(kw.pop("rule"), M, V, prior_var=pv, temperature=T, **kw)

    return {
        "PoE": run("PoE"),
        "gPoE_unif": run("gPoE_unif"),
        "BCM": run("BCM"),
        "rBCM_entr": run("rBCM_entr"),
        "gPoE_var15": run("gPoE_var", 15.0),
        "gPoE_var": run("gPoE_var"),
        "BAR_var": run("BAR_var"),
        "BAR_var_w2": run("BAR_var_w2"),
        "rBCM_var_u15": run("rBCM_var_u", 15.0),
    }


@pytest.fixture(scope="module")
def golden():
    xt, m, v, full = _liu_toy()
    return xt, m, v, full, _np_golden_rules(m, v), _torch_golden_rules(m, v)


def test_golden_toy_matches_table_and_numpy(golden):
    xt, m, v, full, ref, ours = golden
    idx = [int(np.argmin(np.abs(xt - x))) for x in GOLDEN_X]
    for name, rows in GOLDEN.items():
        got = full if name == "full" else ref[name]
        np.testing.assert_allclose(got[0][idx], [r[0] for r in rows], atol=5e-4, err_msg=name)
        np.testing.assert_allclose(got[1][idx], [r[1] for r in rows], atol=5e-4, err_msg=name)
        if name != "full":  # library == independent numpy on the whole grid
            np.testing.assert_allclose(ours[name][0].numpy(), ref[name][0], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(ours[name][1].numpy(), ref[name][1], rtol=1e-9)


def test_golden_toy_erratic_mean_leaves_the_hull(golden):
    xt, m, v, full, ref, ours = golden
    i = int(np.argmin(np.abs(xt - 1.05)))
    lo, hi = m[:, i].min(), m[:, i].max()
    np.testing.assert_allclose([lo, hi], [-1.6165, 0.0007], atol=5e-4)
    for name in ("BCM", "rBCM_entr"):
        assert ours[name][0][i] < lo - 0.4, name
    for name in ("gPoE_var", "gPoE_var15", "BAR_var", "BAR_var_w2"):
        assert lo <= ours[name][0][i] <= hi, name
    # largest hull violation over the whole grid
    lo_all, hi_all = m.min(0), m.max(0)

    def violation(name):
        mean = ours[name][0].numpy()
        return np.maximum(np.maximum(lo_all - mean, mean - hi_all), 0).max()

    expected = {"BCM": 2.379, "rBCM_entr": 0.467, "rBCM_var_u15": 0.015}
    for name, val in expected.items():
        assert violation(name) == pytest.approx(val, abs=1e-3), name
    for name in ("PoE", "gPoE_unif", "gPoE_var", "gPoE_var15", "BAR_var", "BAR_var_w2"):
        assert violation(name) <= 1e-12, name
    # error against the full GP in the transition regions
    region = ((xt >= -0.2) & (xt <= 0)) | ((xt >= 1.0) & (xt <= 1.2))

    def err(name):
        return np.abs(ours[name][0].numpy() - full[0])[region].max()

    expected = {
        "BCM": 2.817,
        "PoE": 1.017,
        "gPoE_unif": 1.017,
        "rBCM_entr": 0.886,
        "gPoE_var15": 0.450,
        "gPoE_var": 0.484,
        "BAR_var": 0.484,
    }
    for name, val in expected.items():
        assert err(name) == pytest.approx(val, abs=1e-3), name
    assert err("gPoE_var") < 0.6 * err("rBCM_entr")
    assert err("gPoE_var15") < 0.6 * err("rBCM_entr")


# ---------------------------------------------------------------- f- vs y-space (§6, Figs. 5–6)


@pytest.mark.parametrize("seed", [0, 1])
def test_y_space_collapses_entropy_rbcm_but_not_softmax(seed):
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 1, 500)
    y = liu_f(x) + 0.5 * rng.normal(size=500)
    xt = np.linspace(-0.2, 1.2, 500)
    yt = liu_f(xt) + 0.5 * rng.normal(size=500)
    mu, sd = y.mean(), y.std()
    y, yt = (y - mu) / sd, (yt - mu) / sd
    ell, sn2 = 0.1, (0.5 / sd) ** 2
    parts = rng.permutation(500).reshape(10, 50)
    xj, yj = x[parts], y[parts]
    Kj = np.exp(-0.5 * (xj[:, :, None] - xj[:, None, :]) ** 2 / ell**2) + sn2 * np.eye(50)
    Ks = np.exp(-0.5 * (xj[:, :, None] - xt[None, None, :]) ** 2 / ell**2)
    A = np.linalg.solve(Kj, np.concatenate([yj[:, :, None], Ks], 2))
    m = t(np.einsum("jin,ji->jn", Ks, A[:, :, 0]))
    v = t(1.0 - np.sum(Ks * A[:, :, 1:], 1))
    pv, Y = torch.ones(500, dtype=D), t(yt)
    gaussian = make_likelihood("gaussian", dtype=D, variance=sn2)

    def nlpd(mean, var):
        return -gaussian.log_predictive(Y, mean, var).mean().item()

    def nlpd_y(mean, y_var):  # a y-space combination already holds the noise
        return nlpd(mean, y_var - sn2)

    kw_e = {"weights": "entropy", "prior_var": pv}
    kw_v = {"weights": "softmax-var", "temperature": 100.0, "prior_var": pv}
    f_e = nlpd(*combine("rbcm", m, v, **kw_e))
    y_e = nlpd_y(*combine_in_y_space("rbcm", m, v, noise_var=sn2, **kw_e))
    f_v = nlpd(*combine("gpoe", m, v, **kw_v))
    y_v = nlpd_y(*combine_in_y_space("gpoe", m, v, noise_var=sn2, **kw_v))
    assert y_e > f_e + 2
    assert abs(y_v - f_v) < 0.02 and f_v < 0.25 and y_v < 0.25


# ---------------------------------------------------------------- predictive


def test_y_space_combine_adds_noise_before_combining():
    m, v, pv = experts(4)
    a = combine_in_y_space("rbcm", t(m), t(v), noise_var=0.1, prior_var=t(pv))
    b = combine("rbcm", t(m), t(v) + 0.1, prior_var=t(pv) + 0.1)
    close(a[0], b[0]), close(a[1], b[1])


@pytest.mark.parametrize("link", ["probit", "logit"])
def test_binary_probabilities_of_a_combined_latent(link):
    """Eq. (6): p(y=1) = ∫ φ(f) N(f | m, σ²) df under the combined latent, as applied by the
    experts' Bernoulli likelihood."""
    m, v = np.array([-1.5, 0.0, 0.7, 2.0]), np.array([0.3, 1.0, 2.5, 0.01])
    phi = stats.norm.cdf if link == "probit" else special.expit
    ref = [
        integrate.quad(lambda f, a=a, b=b: phi(f) * stats.norm.pdf(f, a, np.sqrt(b)),
                       -np.inf, np.inf)[0]
        for a, b in zip(m, v, strict=True)
    ]
    probs, _ = make_likelihood("bernoulli", dtype=D, link=link).predictive_moments(t(m), t(v))
    close(probs, ref, rtol=1e-9 if link == "probit" else 1e-6)


def _robustmax_reference(m, v, eps):
    C = len(m)
    p = []
    for c in range(C):

        def g(x, c=c):
            others = [stats.norm.cdf((x - m[j]) / np.sqrt(v[j])) for j in range(C) if j != c]
            return stats.norm.pdf(x, m[c], np.sqrt(v[c])) * np.prod(others)

        p.append(integrate.quad(g, -np.inf, np.inf, epsabs=1e-13)[0])
    p = np.array(p)
    return (1 - eps) * p + eps / (C - 1) * (1 - p)


def test_multiclass_probabilities_of_a_combined_latent():
    """Eq. (6) for C classes, per class on the combined diagonal Gaussian: robust-max (ε = 1e-3,
    as GPflow's RobustMax in the paper) by quadrature and softmax by Monte Carlo."""
    rng = np.random.default_rng(9)
    m = rng.normal(size=(3, 4))
    v = rng.uniform(0.2, 1.5, (3, 4))
    robustmax = make_likelihood("categorical", dtype=D, num_classes=4, link="robustmax",
                                epsilon=1e-3)
    rm, _ = robustmax.predictive_moments(t(m), t(v))
    ref = np.stack([_robustmax_reference(m[n], v[n], 1e-3) for n in range(3)])
    close(rm, ref, atol=1e-6)
    close(rm.sum(-1), np.ones(3), atol=1e-6)
    softmax = make_likelihood("categorical", dtype=D, num_classes=4, link="softmax",
                              num_samples=20000)
    torch.manual_seed(3)
    p, _ = softmax.predictive_moments(t(m), t(v))
    close(p.sum(-1), np.ones(3))
    s = m[None] + np.sqrt(v)[None] * np.random.default_rng(0).normal(size=(200000, 3, 4))
    e = np.exp(s - s.max(-1, keepdims=True))
    close(p, (e / e.sum(-1, keepdims=True)).mean(0), atol=1e-2)
