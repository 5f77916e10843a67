"""The ArviZ shim, checked against a conjugate Gaussian model whose LOO quantities are exact.

Model: y_i ~ N(μ, σ²) with σ known and prior μ ~ N(0, τ²). The posterior is
μ | y ~ N(m, s²), s² = 1/(1/τ² + N/σ²), m = s² Σy/σ², and leaving y_i out gives the same
formulas on y_−i, so p(y_i | y_−i) = N(y_i | m_−i, s²_−i + σ²) is known exactly.
"""

import math

import numpy as np
import pytest
import torch
import xarray as xr
from scipy.special import logsumexp
from scipy.stats import norm

from pyrogp_models import arviz_bridge as ab

SIGMA, TAU, N, S = 1.0, 2.0, 20, 4000


def _posterior(y: np.ndarray) -> tuple[float, float]:
    """Posterior mean and variance of μ given observations y."""
    var = 1.0 / (1.0 / TAU**2 + y.size / SIGMA**2)
    return var * y.sum() / SIGMA**2, var


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(1234)
    y = rng.normal(1.0, SIGMA, N)
    m, s2 = _posterior(y)
    mu = rng.normal(m, math.sqrt(s2), S)
    loglik = norm.logpdf(y[None, :], loc=mu[:, None], scale=SIGMA)  # [S, N]
    y_rep = mu[:, None] + SIGMA * rng.normal(size=(S, N))  # [S, N]
    idata = ab.to_inference_data(
        # torch with grad, as an SVI guide would hand it over
        posterior={"mu": torch.tensor(mu, requires_grad=True)},
        posterior_predictive={"y": torch.from_numpy(y_rep)},
        log_likelihood={"y": loglik},
        observed_data={"y": y},
        dims={"y": ["obs"]},
        coords={"obs": np.arange(100, 100 + N)},
    )
    return {"y": y, "m": m, "s2": s2, "mu": mu, "loglik": loglik, "idata": idata}


def _exact_loo(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-point log p(y_i | y_−i) and LOO-PIT P(ỹ_i ≤ y_i | y_−i)."""
    logp, pit = np.empty(y.size), np.empty(y.size)
    for i in range(y.size):
        m, s2 = _posterior(np.delete(y, i))
        sd = math.sqrt(s2 + SIGMA**2)
        logp[i] = norm.logpdf(y[i], m, sd)
        pit[i] = norm.cdf(y[i], m, sd)
    return logp, pit


def test_arviz_major_matches_installed_version():
    import arviz as az

    assert ab.ARVIZ_MAJOR == int(az.__version__.split(".")[0])


def test_groups_shapes_and_container_type(model):
    idata = model["idata"]
    if ab.ARVIZ_MAJOR >= 1:
        assert isinstance(idata, xr.DataTree)
    else:
        import arviz as az

        assert isinstance(idata, az.InferenceData)
    post = ab.group(idata, "posterior")
    assert isinstance(post, xr.Dataset)
    assert post["mu"].shape == (1, S)
    assert post["mu"].dims == ("chain", "draw")
    np.testing.assert_array_equal(post["mu"].values[0], model["mu"])
    for name in ("log_likelihood", "posterior_predictive"):
        da = ab.group(idata, name)["y"]
        assert da.shape == (1, S, N)
        assert da.dims == ("chain", "draw", "obs")
        np.testing.assert_array_equal(da["obs"].values, np.arange(100, 100 + N))
    np.testing.assert_array_equal(ab.group(idata, "log_likelihood")["y"].values[0], model["loglik"])
    obs = ab.group(idata, "observed_data")["y"]
    assert obs.dims == ("obs",)
    np.testing.assert_array_equal(obs.values, model["y"])
    with pytest.raises(KeyError):
        ab.group(idata, "prior")


def test_mismatched_draw_counts_and_scalars_are_rejected():
    with pytest.raises(ValueError, match="same number of draws"):
        ab.to_inference_data(posterior={"a": np.zeros(10)}, log_likelihood={"y": np.zeros((9, 3))})
    with pytest.raises(ValueError, match="leading draw axis"):
        ab.to_inference_data(posterior={"a": np.float64(1.0)})


def test_group_reads_a_datatree_node():
    ds = xr.Dataset({"mu": (("chain", "draw"), np.ones((1, 5)))})
    tree = xr.DataTree.from_dict({"posterior": ds})
    out = ab.group(tree, "posterior")
    assert isinstance(out, xr.Dataset)
    xr.testing.assert_identical(out, ds)


def test_summary_mean_matches_samples_and_posterior(model):
    table = ab.summary(model["idata"], var_names=["mu"])
    mean = float(table.loc["mu", "mean"])
    assert mean == pytest.approx(model["mu"].mean(), abs=1e-12)
    assert float(table.loc["mu", "sd"]) == pytest.approx(model["mu"].std(ddof=0), rel=1e-3)
    # the draws really come from the conjugate posterior (5 Monte Carlo standard errors)
    assert abs(mean - model["m"]) < 5 * math.sqrt(model["s2"] / S)


def test_loo_matches_hand_lppd_and_exact_loo(model):
    res = ab.loo(model["idata"])
    assert math.isfinite(res.elpd_loo) and math.isfinite(res.se) and res.se > 0
    lppd = float(np.sum(logsumexp(model["loglik"], axis=0) - math.log(S)))
    assert res.elpd_loo + res.p_loo == pytest.approx(lppd, abs=1e-6)
    assert res.loo_i.shape == (N,) and res.pareto_k.shape == (N,)
    assert res.loo_i.sum() == pytest.approx(res.elpd_loo, abs=1e-9)
    assert np.all(res.pareto_k < 0.7) and not res.warning
    # PSIS-LOO against the exact leave-one-out predictive densities
    exact_logp, _ = _exact_loo(model["y"])
    np.testing.assert_allclose(res.loo_i, exact_logp, atol=0.05)
    assert res.elpd_loo == pytest.approx(exact_logp.sum(), abs=0.1)
    m, s2 = model["m"], model["s2"]
    exact_lppd = norm.logpdf(model["y"], m, math.sqrt(s2 + SIGMA**2)).sum()
    assert res.p_loo == pytest.approx(exact_lppd - exact_logp.sum(), abs=0.05)


def test_loo_pit_in_unit_interval_and_matches_exact(model):
    pit = ab.loo_pit(model["idata"], "y")
    assert isinstance(pit, np.ndarray)
    assert pit.shape == (N,)
    assert np.all((pit >= 0) & (pit <= 1))
    _, exact_pit = _exact_loo(model["y"])
    np.testing.assert_allclose(pit, exact_pit, atol=0.03)
