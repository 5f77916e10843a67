"""Evaluation metrics for predictive distributions.

Every function accepts torch tensors (detached and moved to CPU) or anything ``numpy.asarray``
understands. Scalar metrics return Python floats; array-valued helpers return float64 numpy
arrays. Inputs that are paired element-wise must have identical shapes: nothing is broadcast,
so an ``[N]`` vs ``[N, 1]`` mix-up raises instead of silently producing an ``[N, N]`` result.

The NLPD here is always the mean over points of per-point negative log predictive densities,
never the negative log of a sum (or mean) of predictive probabilities; see :func:`nlpd`.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import torch

__all__ = [
    "accuracy",
    "classification_report",
    "coverage",
    "gaussian_interval",
    "gaussian_pit",
    "mae",
    "nlpd",
    "pit",
    "pit_uniformity",
    "regression_report",
    "rmse",
    "roc_auc",
]


def _np(x) -> np.ndarray:
    """x as a float64 numpy array; torch tensors are detached and copied to CPU first."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _same_shape(**arrays) -> tuple[np.ndarray, ...]:
    """Convert with :func:`_np` and require one common, non-empty shape (no broadcasting)."""
    out = tuple(_np(a) for a in arrays.values())
    shapes = {name: a.shape for name, a in zip(arrays, out, strict=True)}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shapes must match exactly, got {shapes}")
    if out[0].size == 0:
        raise ValueError("metrics need at least one point")
    return out


def _unit_interval(values: np.ndarray, what: str) -> np.ndarray:
    """Require every value to lie in [0, 1] (NaN is rejected too)."""
    if not np.all((values >= 0.0) & (values <= 1.0)):
        raise ValueError(f"{what} must lie in [0, 1]")
    return values


def nlpd(log_pred_density) -> float:
    """Mean negative log predictive density: NLPD = −(1/N) Σ_t log p(y_t | D).

    ``log_pred_density`` holds the per-point log predictive densities log p(y_t | D) (any
    shape; every element is one point). The result is the MEAN of the per-point negative logs.

    !!! This is NEVER −log Σ_t p(y_t | D), nor −log((1/N) Σ_t p(y_t | D)). !!!
    Summing probabilities before the log turns a random-guess binary classifier's score from
    log 2 into −log(N/2), which grows with the test-set size and means nothing.
    """
    lpd = _np(log_pred_density)
    if lpd.size == 0:
        raise ValueError("nlpd needs at least one point")
    return float(-np.mean(lpd))


def rmse(y, mean) -> float:
    """Root mean squared error: √((1/N) Σ_t (y_t − m_t)²)."""
    y, mean = _same_shape(y=y, mean=mean)
    return float(np.sqrt(np.mean((y - mean) ** 2)))


def mae(y, mean) -> float:
    """Mean absolute error: (1/N) Σ_t |y_t − m_t|."""
    y, mean = _same_shape(y=y, mean=mean)
    return float(np.mean(np.abs(y - mean)))


def accuracy(y, prob) -> float:
    """Fraction of correct labels: (1/N) Σ_t 1[ŷ_t = y_t].

    Binary: ``prob`` is [N] with p(y_t = 1) and ŷ_t = 1[p_t > 0.5].
    Multi-class: ``prob`` is [N, C] (C ≥ 2) and ŷ_t = argmax_c p_tc.
    """
    y, prob = _np(y), _np(prob)
    if prob.ndim == 1:
        pred = (prob > 0.5).astype(np.float64)
    elif prob.ndim == 2 and prob.shape[1] >= 2:
        pred = np.argmax(prob, axis=1).astype(np.float64)
    else:
        raise ValueError(f"prob must be [N] (binary) or [N, C>=2], got shape {prob.shape}")
    y, pred = _same_shape(y=y, pred=pred)
    return float(np.mean(pred == y))


def _has_both_classes(y: np.ndarray) -> bool:
    """True when binary labels y contain at least one 0 and one 1."""
    return bool(np.any(y == 1) and np.any(y == 0))


def roc_auc(y, score) -> float:
    """Binary ROC-AUC by the rank (Mann–Whitney U) formula.

    AUC = (R₁ − n₁(n₁ + 1)/2) / (n₁ n₀), with R₁ the sum of the ranks (1-based, ties get
    their average rank) of the positives' scores, n₁ positives and n₀ negatives. This is the
    probability that a random positive outscores a random negative, ties counting 1/2.
    """
    y, score = _same_shape(y=y, score=score)
    y, score = y.ravel(), score.ravel()
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("roc_auc needs binary labels in {0, 1}")
    if not _has_both_classes(y):
        raise ValueError("roc_auc is undefined unless both classes are present")
    if np.isnan(score).any():
        raise ValueError("roc_auc scores must not be NaN")
    n = score.size
    order = np.argsort(score, kind="stable")
    sorted_score = score[order]
    is_start = np.r_[True, sorted_score[1:] != sorted_score[:-1]]
    starts = np.flatnonzero(is_start)  # 0-based first position of each tie block
    ends = np.r_[starts[1:], n]  # exclusive end of each tie block
    block_rank = (starts + 1 + ends) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(n)
    ranks[order] = block_rank[np.cumsum(is_start) - 1]
    n_pos = float(np.sum(y))
    n_neg = n - n_pos
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def coverage(y, lower, upper) -> float:
    """Empirical interval coverage: (1/N) Σ_t 1[l_t ≤ y_t ≤ u_t]."""
    y, lower, upper = _same_shape(y=y, lower=lower, upper=upper)
    return float(np.mean((lower <= y) & (y <= upper)))


def gaussian_interval(mean, var, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Central Gaussian interval: m ± z √var with z = Φ⁻¹((1 + level)/2)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    mean, var = _same_shape(mean=mean, var=var)
    half_width = NormalDist().inv_cdf((1.0 + level) / 2.0) * np.sqrt(var)
    return mean - half_width, mean + half_width


def pit(y, cdf_values) -> np.ndarray:
    """Probability integral transform: PIT_t = F_t(y_t), given the already evaluated F_t(y_t).

    ``y`` is only used to check that there is one CDF value per observation.
    """
    _, cdf_values = _same_shape(y=y, cdf_values=cdf_values)
    return _unit_interval(cdf_values, "cdf_values")


def gaussian_pit(y, mean, var) -> np.ndarray:
    """Gaussian PIT: PIT_t = Φ((y_t − m_t) / √var_t)."""
    y, mean, var = _same_shape(y=y, mean=mean, var=var)
    z = torch.from_numpy((y - mean) / np.sqrt(var))
    return torch.special.ndtr(z).numpy()


def pit_uniformity(pit_values) -> float:
    """Kolmogorov–Smirnov distance of the PIT values to U(0, 1).

    D = max_i max(i/n − u_(i), u_(i) − (i − 1)/n) over the sorted values u_(1) ≤ … ≤ u_(n).
    Calibrated predictions give D → 0 (≈ 1.36/√n at the 5% level).
    """
    u = np.sort(_unit_interval(_np(pit_values).ravel(), "pit_values"))
    n = u.size
    if n == 0:
        raise ValueError("pit_uniformity needs at least one value")
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - u), np.max(u - (i - 1) / n)))


def regression_report(y, mean, var_y, log_density) -> dict[str, float | int]:
    """Regression summary: nlpd, rmse, mae, coverage95 (of m ± 1.96 √var_y) and n.

    ``var_y`` is the predictive variance of y (noise included); ``log_density`` holds the
    per-point log p(y_t | D).
    """
    y, mean, var_y, log_density = _same_shape(y=y, mean=mean, var_y=var_y, log_density=log_density)
    return {
        "nlpd": nlpd(log_density),
        "rmse": rmse(y, mean),
        "mae": mae(y, mean),
        "coverage95": coverage(y, *gaussian_interval(mean, var_y, 0.95)),
        "n": int(y.size),
    }


def classification_report(y, prob, log_density) -> dict[str, float | int]:
    """Classification summary: nlpd, accuracy, n, and roc_auc for binary ``prob`` [N] only.

    ``log_density`` holds the per-point log p(y_t | D) of the observed labels. roc_auc is NaN
    when the labels contain a single class (it is undefined there).
    """
    y, log_density = _same_shape(y=y, log_density=log_density)
    prob = _np(prob)
    report: dict[str, float | int] = {
        "nlpd": nlpd(log_density),
        "accuracy": accuracy(y, prob),
    }
    if prob.ndim == 1:
        report["roc_auc"] = roc_auc(y, prob) if _has_both_classes(y) else float("nan")
    report["n"] = int(y.size)
    return report
