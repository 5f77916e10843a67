"""Data from which a GP fit cannot identify its hyperparameters, refused in one line.

A GP's lengthscale and its signal and noise variances need at least
:data:`MIN_DISTINCT_INPUTS` rows with distinct inputs: on one row (or on copies of one input) the
marginal likelihood grows without bound as the noise shrinks, and the fit predicts a variance of
~1e-120 far from its only point. Constant Gaussian targets leave nothing to learn: the optimum
has σ² → 0 and ℓ → ∞ (a "converged" fit with ℓ = 1e141 and σ² = 1e-295). Both are checked on the
whole data and, for local fits, on every partition (each fits its own hyperparameters).
Partitions are numbered from 0 as their modules are (``part000``, ...).
"""

from __future__ import annotations

import numpy as np

from pyrogp_models.data.partitioners import Partition
from pyrogp_models.errors import DataError
from pyrogp_models.text import count_of

#: Fewest rows with distinct inputs from which a GP fit identifies ℓ, σ_f² and σ².
MIN_DISTINCT_INPUTS = 3


def require_identifiable(X: np.ndarray, y: np.ndarray, partition: Partition | None = None,
                         constant_targets: bool = True) -> None:
    """Raise :class:`DataError` if the rows X [N, D], y [N] (or, with a ``partition``, the rows of
    one of its partitions) have fewer than :data:`MIN_DISTINCT_INPUTS` distinct inputs or —
    when ``constant_targets`` are refused (Gaussian targets) — one target value only."""
    if partition is not None and partition.num_partitions == 1:
        partition = None  # one partition is the whole data
    X = np.asarray(X, dtype=np.float64).reshape(len(X), -1)
    y = np.asarray(y, dtype=np.float64).reshape(len(X), -1)
    labels = (np.zeros(len(X), dtype=np.int64) if partition is None
              else np.asarray(partition.assignments))
    count = int(labels.max(initial=0)) + 1
    order = np.lexsort((*X.T[::-1], labels))
    X_sorted, labels_sorted = X[order], labels[order]
    new_run = np.ones(len(X), dtype=bool)
    new_run[1:] = (labels_sorted[1:] != labels_sorted[:-1]) | (
        X_sorted[1:] != X_sorted[:-1]).any(axis=1)
    distinct = np.bincount(labels_sorted[new_run], minlength=count)
    rows = np.bincount(labels, minlength=count)
    for k in np.flatnonzero(distinct < MIN_DISTINCT_INPUTS):
        have = (count_of(rows[k], "row") if rows[k] == distinct[k]
                else f"{count_of(rows[k], 'row')} with {count_of(distinct[k], 'distinct input')}")
        raise DataError(f"{_subject(partition, k)} {have}; a GP fit needs at least "
                        f"{MIN_DISTINCT_INPUTS} rows with distinct inputs to identify its "
                        f"lengthscale and its signal and noise variances{_remedy(partition)}")
    if not constant_targets:
        return
    starts = np.cumsum(rows) - rows
    targets = y[np.argsort(labels, kind="stable")]
    low = np.minimum.reduceat(targets, starts, axis=0).min(axis=1)
    high = np.maximum.reduceat(targets, starts, axis=0).max(axis=1)
    for k in np.flatnonzero(low == high):
        raise DataError(f"{_subject(partition, k)} constant targets (all {low[k]:g}): a GP fit "
                        "has nothing to learn (its noise would shrink to zero and its "
                        "lengthscale grow without bound)"
                        f"{_remedy(partition, 'fit a constant instead')}")


def _subject(partition: Partition | None, k: int) -> str:
    return "the data have" if partition is None else f"partition {k} has"


def _remedy(partition: Partition | None, whole: str = "") -> str:
    if partition is None:
        return f"; {whole}" if whole else ""
    return "; use fewer partitions"
