"""Splitting data into partitions, routing new points by the same rule, and padding for batches.

A partition's ``rule`` is a JSON-serialisable dict that every partitioner fills with
``"kind"`` and ``"num_partitions"`` plus what its kind needs to route new points:

- ``{"kind": "random"}``: no region, so nothing can be routed;
- ``{"kind": "contiguous", "dim": d, "boundaries": [K-1 cut values]}``: partition k holds the
  points with ``boundaries[k-1] <= x[d] < boundaries[k]``;
- ``{"kind": "kmeans", "centres": [[...], ...]}``: the nearest centre (the first on ties);
- ``{"kind": "label", "column": name, "values": [sorted distinct labels]}``: partition k holds
  the points labelled ``values[k]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pyrogp_models.data import require_finite
from pyrogp_models.data.kmeans import kmeans, kmeans_assign
from pyrogp_models.errors import DataError

ArrayLike = np.ndarray | torch.Tensor

_RULE_KEYS = {
    "random": (),
    "contiguous": ("dim", "boundaries"),
    "kmeans": ("centres",),
    "label": ("column", "values"),
}


@dataclass(frozen=True, eq=False)
class Partition:
    """Which partition (0..K-1) each of N points belongs to (``assignments`` [N], int), and
    the rule that put it there (JSON, see the module docstring)."""

    assignments: np.ndarray
    rule: dict[str, Any]

    def __post_init__(self) -> None:
        assignments = np.asarray(self.assignments)
        if assignments.ndim != 1 or assignments.size == 0:
            raise DataError("a partition needs a non-empty 1-D array of assignments")
        if assignments.dtype.kind not in "iu" or assignments.min() < 0:
            raise DataError("partition assignments must be non-negative integers")
        try:
            rule = json.loads(json.dumps(self.rule))
        except TypeError as error:
            raise DataError(f"partition rule is not JSON-serialisable: {error}") from None
        _check_rule(rule)
        sizes = np.bincount(assignments, minlength=rule["num_partitions"])
        if sizes.size != rule["num_partitions"]:
            raise DataError(
                f"assignments name partition {sizes.size - 1} but the rule has "
                f"{rule['num_partitions']} partitions"
            )
        empty = np.flatnonzero(sizes == 0)
        if empty.size:
            raise DataError(f"partition {int(empty[0])} of {sizes.size} is empty")
        object.__setattr__(self, "assignments", assignments.astype(np.int64))
        object.__setattr__(self, "rule", rule)

    @classmethod
    def from_rule(cls, rule: dict[str, Any], assignments: np.ndarray) -> Partition:
        """Rebuild a partition from a stored (e.g. JSON-loaded) rule and its assignments."""
        return cls(np.asarray(assignments), rule)

    @property
    def num_partitions(self) -> int:
        return self.rule["num_partitions"]

    @property
    def sizes(self) -> np.ndarray:
        """Number of points [K] in each partition."""
        return np.bincount(self.assignments, minlength=self.num_partitions)

    def indices(self, k: int) -> np.ndarray:
        """Row indices, in increasing order, of the points in partition ``k``."""
        if not 0 <= k < self.num_partitions:
            raise IndexError(f"partition {k} out of range 0..{self.num_partitions - 1}")
        return np.flatnonzero(self.assignments == k)

    def route(self, X: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
        """Partition indices [N] for new points ``X`` [N, D] (and their labels, by label)."""
        return route(self.rule, X, labels)


def route(rule: dict[str, Any], X: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
    """Send new points ``X`` [N, D] to partitions by a stored rule; returns int64 [N]."""
    _check_rule(rule)
    kind = rule["kind"]
    if kind == "random":
        raise DataError(
            "modules fitted on a random partition have no region to route a point to; "
            "combine them instead"
        )
    if kind == "label":
        return _route_by_label(rule, labels)
    X = _as_2d_float64(X)
    require_finite(X, "inputs to route")
    if kind == "contiguous":
        dim = rule["dim"]
        if dim >= X.shape[1]:
            raise DataError(f"routing by input dimension {dim} needs at least {dim + 1} inputs")
        return np.searchsorted(rule["boundaries"], X[:, dim], side="right").astype(np.int64)
    centres = np.asarray(rule["centres"], dtype=np.float64)
    if X.shape[1] != centres.shape[1]:
        raise DataError(
            f"inputs have {X.shape[1]} dimensions but the k-means centres have {centres.shape[1]}"
        )
    return kmeans_assign(torch.from_numpy(X), torch.from_numpy(centres)).numpy().astype(np.int64)


def _route_by_label(rule: dict[str, Any], labels: np.ndarray | None) -> np.ndarray:
    column = rule["column"]
    if labels is None:
        raise DataError(f"routing by label needs the values of column '{column}'")
    labels = np.asarray(labels).reshape(-1)
    values = np.asarray(rule["values"])
    positions = np.clip(np.searchsorted(values, labels), 0, len(values) - 1)
    known = values[positions] == labels
    if not known.all():
        unknown = ", ".join(str(value) for value in np.unique(labels[~known])[:10])
        known_values = ", ".join(str(value) for value in rule["values"][:10])
        raise DataError(
            f"unknown label values in column '{column}': {unknown}; known: {known_values}"
        )
    return positions.astype(np.int64)


def partition_random(num_points: int, num_partitions: int, seed: int) -> Partition:
    """Points dealt at random into partitions whose sizes differ by at most one."""
    _check_num_partitions(num_points, num_partitions)
    permutation = np.random.default_rng(seed).permutation(num_points)
    assignments = np.empty(num_points, dtype=np.int64)
    assignments[permutation] = np.arange(num_points) % num_partitions
    return Partition(assignments, {"kind": "random", "num_partitions": num_partitions})


def partition_contiguous(X: np.ndarray, num_partitions: int, dim: int = 0) -> Partition:
    """Equal-count blocks of the points sorted along input dimension ``dim``.

    Each cut lies midway between the neighbouring sorted values; a point on a cut goes to the
    upper block, so tied values are never split (which can make block sizes unequal).
    """
    X = _as_2d_float64(X)
    if not 0 <= dim < X.shape[1]:
        raise DataError(f"input dimension {dim} out of range for inputs with {X.shape[1]} columns")
    require_finite(X[:, dim], f"input dimension {dim}")
    num_points = X.shape[0]
    _check_num_partitions(num_points, num_partitions)
    ordered = np.sort(X[:, dim])
    block = np.arange(1, num_partitions)
    starts = block * (num_points // num_partitions) + np.minimum(block, num_points % num_partitions)
    boundaries = (ordered[starts - 1] + ordered[starts]) / 2
    assignments = np.searchsorted(boundaries, X[:, dim], side="right")
    if np.unique(assignments).size < num_partitions:
        raise DataError(
            f"cannot cut input dimension {dim} into {num_partitions} non-empty contiguous blocks: "
            "too many tied values"
        )
    rule = {
        "kind": "contiguous",
        "num_partitions": num_partitions,
        "dim": dim,
        "boundaries": boundaries.tolist(),
    }
    return Partition(assignments, rule)


def partition_kmeans(
    X: np.ndarray, num_partitions: int, seed: int, num_iters: int = 100
) -> Partition:
    """Partitions are the k-means clusters of the inputs (k-means++ start, float64)."""
    X = _as_2d_float64(X)
    require_finite(X, "inputs")
    _check_num_partitions(X.shape[0], num_partitions)
    num_distinct = np.unique(X, axis=0).shape[0]
    if num_distinct < num_partitions:
        raise DataError(
            f"cannot form {num_partitions} k-means partitions from {num_distinct} distinct "
            "input points"
        )
    points = torch.from_numpy(X)
    generator = torch.Generator().manual_seed(seed)
    centres = kmeans(points, num_partitions, num_iters=num_iters, generator=generator)
    assignments = kmeans_assign(points, centres).numpy()
    sizes = np.bincount(assignments, minlength=num_partitions)
    if (sizes == 0).any():
        raise DataError(
            f"k-means left partition {int(np.argmin(sizes))} empty; "
            "try another seed or fewer partitions"
        )
    rule = {"kind": "kmeans", "num_partitions": num_partitions, "centres": centres.tolist()}
    return Partition(assignments, rule)


def partition_by_label(labels: np.ndarray, column_name: str) -> Partition:
    """One partition per distinct label value, in sorted order of the values."""
    labels = np.asarray(labels).reshape(-1)
    if labels.size == 0:
        raise DataError(f"column '{column_name}' has no labels to partition by")
    if labels.dtype.kind == "f":
        require_finite(labels, f"column '{column_name}'")
    values, assignments = np.unique(labels, return_inverse=True)
    rule = {
        "kind": "label",
        "num_partitions": len(values),
        "column": column_name,
        "values": values.tolist(),
    }
    return Partition(assignments.reshape(-1), rule)


def pad_partitions(
    X: ArrayLike, y: ArrayLike, partition: Partition
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack the partitions into padded tensors for a batched model.

    Returns ``Xp`` [K, Nmax, D], ``yp`` [K, Nmax, ...], ``mask`` [K, Nmax] (True on real points)
    and ``index`` [K, Nmax]: the row of the data in each slot (0 on padding). Each row holds its
    partition's points first, in their original order, then zeros. Tensors stay on their device
    and keep their dtype; arrays become tensors.
    """
    X = X if isinstance(X, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(X))
    y = torch.as_tensor(y, device=X.device)
    num_points = partition.assignments.shape[0]
    if X.ndim != 2 or X.shape[0] != num_points or y.shape[:1] != (num_points,):
        raise DataError(
            f"inputs {tuple(X.shape)} and outputs {tuple(y.shape)} do not match a partition of "
            f"{num_points} points"
        )
    sizes = partition.sizes
    num_partitions, max_size = sizes.size, int(sizes.max())
    order, rows, positions = _sorted_layout(partition, X.device)
    Xp = X.new_zeros((num_partitions, max_size, X.shape[1]))
    Xp[rows, positions] = X[order]
    yp = y.new_zeros((num_partitions, max_size, *y.shape[1:]))
    yp[rows, positions] = y[order]
    index = torch.zeros((num_partitions, max_size), dtype=torch.long, device=X.device)
    index[rows, positions] = order
    counts = torch.as_tensor(sizes, dtype=torch.long, device=X.device)
    mask = torch.arange(max_size, device=X.device) < counts.unsqueeze(-1)
    return Xp, yp, mask, index


def _sorted_layout(
    partition: Partition, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows grouped by partition: the row order, and each one's partition and slot in it."""
    order = np.argsort(partition.assignments, kind="stable")
    rows = partition.assignments[order]
    starts = np.cumsum(partition.sizes) - partition.sizes
    positions = np.arange(order.size) - starts[rows]
    return (
        torch.as_tensor(order, device=device),
        torch.as_tensor(rows, device=device),
        torch.as_tensor(positions, device=device),
    )


def _as_2d_float64(X: ArrayLike) -> np.ndarray:
    """Inputs as float64 [N, D]; a 1-D array is one input dimension."""
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().double().numpy()
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2 or X.shape[0] == 0:
        raise DataError(f"inputs must have shape [N, D] with N > 0, got {X.shape}")
    return np.ascontiguousarray(X)


def _check_num_partitions(num_points: int, num_partitions: int) -> None:
    if not 1 <= num_partitions <= num_points:
        raise DataError(f"cannot split {num_points} points into {num_partitions} partitions")


def _check_rule(rule: dict[str, Any]) -> None:
    kind = rule.get("kind")
    if kind not in _RULE_KEYS:
        raise DataError(f"unknown partition rule kind {kind!r}; known: {', '.join(_RULE_KEYS)}")
    missing = [key for key in ("num_partitions", *_RULE_KEYS[kind]) if key not in rule]
    if missing:
        raise DataError(f"partition rule of kind '{kind}' lacks {', '.join(missing)}")
    num_partitions = rule["num_partitions"]
    if not isinstance(num_partitions, int) or num_partitions < 1:
        raise DataError(f"partition rule has an invalid number of partitions: {num_partitions!r}")
    listed = {"contiguous": ("boundaries", 1), "kmeans": ("centres", 0), "label": ("values", 0)}
    if kind in listed:
        key, offset = listed[kind]
        if len(rule[key]) + offset != num_partitions:
            raise DataError(
                f"partition rule '{kind}' lists {len(rule[key])} {key} for "
                f"{num_partitions} partitions"
            )
