import math

import numpy as np
import pytest
import torch
from pyrogp_models.inference import metrics as M
from scipy.stats import kstest
from sklearn.metrics import roc_auc_score


def _bernoulli_log_density(y: np.ndarray, p: np.ndarray) -> np.ndarray:
    """log p(y_t) = y_t log p_t + (1 − y_t) log(1 − p_t)."""
    return y * np.log(p) + (1 - y) * np.log1p(-p)


# ---------------------------------------------------------------- NLPD


@pytest.mark.parametrize("n", [10, 1000, 100_000])
def test_nlpd_of_coin_flip_classifier_is_log2_not_log_n(n):
    rng = np.random.default_rng(n)
    y = rng.integers(0, 2, n).astype(float)
    p = np.full(n, 0.5)
    value = M.nlpd(_bernoulli_log_density(y, p))
    assert value == pytest.approx(math.log(2), abs=1e-12)
    # the log-of-summed-probabilities bug: ±log Σ p = ±log(N/2), or log N
    for wrong in (math.log(n / 2), -math.log(n / 2), math.log(n)):
        assert abs(value - wrong) > 0.5


def test_nlpd_of_random_guesses_around_half_is_log2():
    rng = np.random.default_rng(0)
    n = 20_000
    y = rng.integers(0, 2, n).astype(float)
    p = rng.uniform(0.4, 0.6, n)  # uninformative: independent of y
    value = M.nlpd(torch.from_numpy(_bernoulli_log_density(y, p)))
    assert isinstance(value, float)
    assert value == pytest.approx(math.log(2), abs=0.02)
    assert abs(value - math.log(n)) > 5


def test_nlpd_is_mean_of_negated_values_and_rejects_empty():
    assert M.nlpd([-1.0, -2.0, -6.0]) == pytest.approx(3.0)
    assert M.nlpd(np.array([[0.5], [-1.5]])) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        M.nlpd([])


# ---------------------------------------------------------------- point errors


def test_rmse_and_mae_constant_offset():
    y = torch.linspace(-3, 3, 101)
    assert M.rmse(y, y + 0.7) == pytest.approx(0.7)
    assert M.mae(y, y - 0.7) == pytest.approx(0.7)
    assert M.rmse(y, y) == 0.0


def test_rmse_and_mae_differ_on_mixed_offsets():
    y = np.zeros(4)
    mean = np.array([1.0, -1.0, 3.0, -3.0])
    assert M.rmse(y, mean) == pytest.approx(math.sqrt(5.0))  # √((1+1+9+9)/4)
    assert M.mae(y, mean) == pytest.approx(2.0)  # (1+1+3+3)/4
    assert isinstance(M.rmse(torch.tensor(y), torch.tensor(mean)), float)


def test_shape_mismatch_is_not_broadcast():
    with pytest.raises(ValueError, match="shapes must match"):
        M.rmse(np.zeros(5), np.zeros((5, 1)))


# ---------------------------------------------------------------- classification


def test_accuracy_binary_and_multiclass():
    y = np.array([1, 0, 1, 0, 1])
    prob = torch.tensor([0.9, 0.2, 0.4, 0.6, 0.51])
    assert M.accuracy(y, prob) == pytest.approx(3 / 5)
    y3 = torch.tensor([2, 0, 1, 1])
    prob3 = np.array(
        [[0.1, 0.2, 0.7], [0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3]],
    )
    assert M.accuracy(y3, prob3) == pytest.approx(3 / 4)
    with pytest.raises(ValueError):
        M.accuracy(y3, prob3[:, :1])


@pytest.mark.parametrize("seed", range(5))
def test_roc_auc_matches_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = 400
    y = rng.integers(0, 2, n)
    score = np.round(rng.normal(size=n) + 0.8 * y, 1)  # rounding creates many ties
    assert len(np.unique(score)) < n / 2
    expected = roc_auc_score(y, score)
    assert M.roc_auc(y, score) == pytest.approx(expected, abs=1e-12)
    assert M.roc_auc(torch.from_numpy(y), torch.from_numpy(score)) == pytest.approx(expected)


def test_roc_auc_edge_cases():
    y = np.array([0, 0, 1, 1])
    assert M.roc_auc(y, [0.1, 0.2, 0.8, 0.9]) == 1.0
    assert M.roc_auc(y, [0.9, 0.8, 0.2, 0.1]) == 0.0
    assert M.roc_auc(y, [0.3, 0.3, 0.3, 0.3]) == 0.5
    with pytest.raises(ValueError, match="both classes"):
        M.roc_auc([1, 1, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="binary"):
        M.roc_auc([0, 2, 1], [0.1, 0.2, 0.3])


# ---------------------------------------------------------------- calibration


def test_gaussian_interval_is_mean_plus_minus_z_sd():
    lower, upper = M.gaussian_interval(torch.tensor([1.0, -2.0]), torch.tensor([4.0, 0.25]))
    np.testing.assert_allclose(lower, [1.0 - 1.959964 * 2.0, -2.0 - 1.959964 * 0.5], rtol=1e-6)
    np.testing.assert_allclose(upper, [1.0 + 1.959964 * 2.0, -2.0 + 1.959964 * 0.5], rtol=1e-6)
    with pytest.raises(ValueError):
        M.gaussian_interval([0.0], [1.0], level=1.0)


def _gaussian_draws(n=100_000, seed=0):
    rng = np.random.default_rng(seed)
    mean = rng.normal(size=n)
    var = rng.uniform(0.1, 3.0, n)
    y = mean + np.sqrt(var) * rng.normal(size=n)
    return y, mean, var


def test_coverage_of_correct_gaussian_predictive():
    y, mean, var = _gaussian_draws()
    assert M.coverage(y, *M.gaussian_interval(mean, var, 0.95)) == pytest.approx(0.95, abs=0.005)
    assert M.coverage(y, *M.gaussian_interval(mean, var, 0.5)) == pytest.approx(0.5, abs=0.01)
    # overconfident predictive (variance 4x too small) undercovers
    assert M.coverage(y, *M.gaussian_interval(mean, var / 4, 0.95)) < 0.7


def test_coverage_counts_endpoints_as_inside():
    assert M.coverage([0.0, 1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]) == 0.5


def test_gaussian_pit_uniform_when_correct_and_not_when_misscaled():
    y, mean, var = _gaussian_draws()
    good = M.gaussian_pit(torch.from_numpy(y), mean, var)
    assert good.shape == y.shape
    assert M.pit_uniformity(good) < 0.01
    assert M.pit_uniformity(M.gaussian_pit(y, mean, 4 * var)) > 0.05  # underconfident
    assert M.pit_uniformity(M.gaussian_pit(y, mean, var / 4)) > 0.05  # overconfident
    assert M.pit_uniformity(M.gaussian_pit(y, mean + 0.5, var)) > 0.05  # biased


@pytest.mark.parametrize("seed", range(3))
def test_pit_uniformity_is_ks_statistic(seed):
    u = np.random.default_rng(seed).beta(1.3, 1.0, 500)
    assert M.pit_uniformity(u) == pytest.approx(kstest(u, "uniform").statistic, abs=1e-12)
    assert M.pit_uniformity([0.5]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        M.pit_uniformity([0.2, 1.2])


def test_pit_returns_cdf_values_and_checks_them():
    np.testing.assert_array_equal(M.pit([3.0, 4.0], torch.tensor([0.25, 1.0])), [0.25, 1.0])
    with pytest.raises(ValueError):
        M.pit([3.0, 4.0], [0.25, -0.1])
    with pytest.raises(ValueError):
        M.pit([3.0, 4.0, 5.0], [0.25, 0.5])


# ---------------------------------------------------------------- reports


def test_regression_report():
    y, mean, var = _gaussian_draws(n=20_000, seed=3)
    log_density = -0.5 * (np.log(2 * np.pi * var) + (y - mean) ** 2 / var)
    report = M.regression_report(torch.from_numpy(y), mean, var, log_density)
    assert set(report) == {"nlpd", "rmse", "mae", "coverage95", "n"}
    assert report["n"] == 20_000 and isinstance(report["n"], int)
    assert report["nlpd"] == pytest.approx(-log_density.mean())
    assert report["rmse"] == pytest.approx(np.sqrt(np.mean((y - mean) ** 2)))
    assert report["mae"] == pytest.approx(np.mean(np.abs(y - mean)))
    assert report["coverage95"] == pytest.approx(0.95, abs=0.01)
    # E[−log N(y|m,v)] = ½ E[log 2πv] + ½ for a calibrated predictive
    assert report["nlpd"] == pytest.approx(0.5 * np.mean(np.log(2 * np.pi * var)) + 0.5, abs=0.02)


def test_classification_report_binary_and_multiclass():
    y = np.array([1, 0, 1, 0])
    p = np.array([0.8, 0.3, 0.6, 0.7])
    report = M.classification_report(y, p, _bernoulli_log_density(y, p))
    assert set(report) == {"nlpd", "accuracy", "roc_auc", "n"}
    assert report["accuracy"] == pytest.approx(0.75)
    assert report["roc_auc"] == pytest.approx(0.75)  # 3 of 4 (pos, neg) pairs ordered
    assert report["nlpd"] == pytest.approx(-np.mean(np.log([0.8, 0.7, 0.6, 0.3])))
    assert report["n"] == 4

    y3 = np.array([0, 2, 1])
    p3 = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.5, 0.4, 0.1]])
    log_density = np.log(p3[np.arange(3), y3])
    report3 = M.classification_report(y3, torch.from_numpy(p3), log_density)
    assert set(report3) == {"nlpd", "accuracy", "n"}
    assert report3["accuracy"] == pytest.approx(2 / 3)

    one_class = M.classification_report([1, 1], [0.9, 0.4], np.log([0.9, 0.4]))
    assert math.isnan(one_class["roc_auc"])
