"""Partitioners, routing by stored rules, and padding partitions into batches."""

import json

import numpy as np
import pytest
import torch

from pyrogp_models.data.partitioners import (
    Partition,
    pad_partitions,
    partition_by_label,
    partition_contiguous,
    partition_kmeans,
    partition_random,
    route,
)
from pyrogp_models.errors import DataError


def random_inputs(num_points=97, num_dims=2, seed=0):
    return np.random.default_rng(seed).normal(size=(num_points, num_dims))


def blobs(seed=0):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0]])
    labels = rng.integers(0, 3, size=150)
    return centres[labels] + 0.4 * rng.normal(size=(150, 2)), labels


def all_partitions():
    X = random_inputs()
    labels = np.random.default_rng(1).choice([-1.0, 2.0, 7.5], size=X.shape[0])
    return X, [
        partition_random(X.shape[0], 5, seed=0),
        partition_contiguous(X, 5, dim=1),
        partition_kmeans(X, 5, seed=0),
        partition_by_label(labels, "group"),
    ]


def test_every_point_is_in_exactly_one_partition():
    X, partitions = all_partitions()
    for partition in partitions:
        K = partition.num_partitions
        assert partition.assignments.dtype == np.int64
        assert partition.assignments.shape == (X.shape[0],)
        members = np.concatenate([partition.indices(k) for k in range(K)])
        assert np.array_equal(np.sort(members), np.arange(X.shape[0]))
        assert (partition.sizes > 0).all() and partition.sizes.sum() == X.shape[0]
        for k in range(K):
            assert (partition.assignments[partition.indices(k)] == k).all()


def test_rules_survive_json_and_route_the_same():
    X, partitions = all_partitions()
    for partition in partitions[1:3]:
        stored = json.loads(json.dumps(partition.rule))
        rebuilt = Partition.from_rule(stored, partition.assignments)
        assert rebuilt.rule == partition.rule
        assert np.array_equal(rebuilt.route(X), partition.route(X))
        assert np.array_equal(route(stored, X), partition.assignments)


def test_random_partition_is_balanced_seeded_and_cannot_route():
    first = partition_random(103, 4, seed=7)
    assert sorted(first.sizes.tolist()) == [25, 26, 26, 26]
    assert np.array_equal(first.assignments, partition_random(103, 4, seed=7).assignments)
    assert not np.array_equal(first.assignments, partition_random(103, 4, seed=8).assignments)
    assert first.rule["kind"] == "random"
    with pytest.raises(DataError, match="random partition have no region .*combine them"):
        first.route(np.zeros((2, 1)))


def test_contiguous_blocks_are_contiguous_and_equal_sized():
    X = random_inputs(103, 3)
    partition = partition_contiguous(X, 4, dim=2)
    assert sorted(partition.sizes.tolist()) == [25, 26, 26, 26]
    blocks = [X[partition.indices(k), 2] for k in range(4)]
    for lower, upper in zip(blocks, blocks[1:], strict=False):
        assert lower.max() < upper.min()
    boundaries = partition.rule["boundaries"]
    assert len(boundaries) == 3
    for k, cut in enumerate(boundaries):
        assert cut == (blocks[k].max() + blocks[k + 1].min()) / 2
    assert np.array_equal(partition.route(X), partition.assignments)


def test_contiguous_routing_of_new_points():
    X = np.arange(10.0).reshape(-1, 1)
    partition = partition_contiguous(X, 2)
    assert partition.rule["boundaries"] == [4.5]
    new = np.array([[-100.0], [4.4], [4.5], [4.6], [100.0]])
    assert partition.route(new).tolist() == [0, 0, 1, 1, 1]


def test_contiguous_never_splits_tied_values():
    years = np.repeat(np.arange(2000.0, 2010.0), 12)[:, None]
    partition = partition_contiguous(years, 7)
    for k in range(7):
        inside = np.unique(years[partition.indices(k), 0])
        outside = np.unique(years[partition.assignments != k, 0])
        assert np.intersect1d(inside, outside).size == 0
    assert np.array_equal(partition.route(years), partition.assignments)
    with pytest.raises(DataError, match="too many tied values"):
        partition_contiguous(years, 11)


def test_kmeans_partition_recovers_blobs_and_routes_its_points():
    X, labels = blobs()
    partition = partition_kmeans(X, 3, seed=4)
    # Same grouping as the generating labels, up to renaming the groups.
    pairs = {(a, b) for a, b in zip(partition.assignments, labels, strict=True)}
    assert len(pairs) == 3
    assert np.array_equal(partition.route(X), partition.assignments)
    new = np.array([[8.1, 0.2], [-0.3, 7.7]])
    expected = [partition.assignments[labels == 1][0], partition.assignments[labels == 2][0]]
    assert partition.route(new).tolist() == expected


def test_kmeans_partition_with_repeated_rows():
    X = np.repeat(np.arange(6.0), 50)[:, None]
    partition = partition_kmeans(X, 6, seed=0)
    assert sorted(partition.sizes.tolist()) == [50] * 6
    with pytest.raises(DataError, match="from 6 distinct input points"):
        partition_kmeans(X, 7, seed=0)


def test_label_partition_orders_values_and_routes_by_label():
    labels = np.array([3.0, 1.0, 3.0, 2.0, 1.0])
    partition = partition_by_label(labels, "site")
    assert partition.rule == {
        "kind": "label",
        "num_partitions": 3,
        "column": "site",
        "values": [1.0, 2.0, 3.0],
    }
    assert partition.assignments.tolist() == [2, 0, 2, 1, 0]
    X = np.zeros((3, 1))
    assert partition.route(X, labels=np.array([2, 3, 1])).tolist() == [1, 2, 0]
    with pytest.raises(DataError, match=r"unknown label values in column 'site': 4\.0, 9\.0"):
        partition.route(np.zeros((4, 1)), labels=np.array([1.0, 9.0, 4.0, 9.0]))
    with pytest.raises(DataError, match="needs the values of column 'site'"):
        partition.route(X)
    with pytest.raises(DataError, match="column 'site' contains NaN"):
        partition_by_label(np.array([1.0, np.nan]), "site")


@pytest.mark.parametrize("num_partitions", [0, -1, 11])
def test_impossible_numbers_of_partitions(num_partitions):
    X = random_inputs(10, 1)
    with pytest.raises(DataError, match=f"cannot split 10 points into {num_partitions}"):
        partition_random(10, num_partitions, seed=0)
    with pytest.raises(DataError, match=f"cannot split 10 points into {num_partitions}"):
        partition_contiguous(X, num_partitions)
    with pytest.raises(DataError, match=f"cannot split 10 points into {num_partitions}"):
        partition_kmeans(X, num_partitions, seed=0)


def test_partition_rejects_empty_partitions_and_bad_rules():
    with pytest.raises(DataError, match="partition 1 of 3 is empty"):
        Partition(np.array([0, 2, 2]), {"kind": "random", "num_partitions": 3})
    with pytest.raises(DataError, match="lists 1 boundaries for 3 partitions"):
        Partition.from_rule(
            {"kind": "contiguous", "num_partitions": 3, "dim": 0, "boundaries": [0.5]},
            np.array([0, 1, 2]),
        )
    with pytest.raises(DataError, match="unknown partition rule kind 'voronoi'"):
        Partition.from_rule({"kind": "voronoi", "num_partitions": 1}, np.array([0]))
    with pytest.raises(DataError, match="lacks centres"):
        Partition.from_rule({"kind": "kmeans", "num_partitions": 1}, np.array([0]))


def test_routing_checks_its_inputs():
    X, partitions = all_partitions()
    contiguous, kmeans_partition = partitions[1], partitions[2]
    with pytest.raises(DataError, match="inputs to route contains NaN"):
        kmeans_partition.route(np.array([[0.0, np.nan]]))
    with pytest.raises(DataError, match="inputs have 3 dimensions but the k-means centres have 2"):
        kmeans_partition.route(np.zeros((1, 3)))
    with pytest.raises(DataError, match="input dimension 1 needs at least 2 inputs"):
        contiguous.route(np.zeros((1, 1)))


def test_pad_puts_real_points_first_and_indexes_their_rows():
    X = random_inputs(23, 3)
    y = np.arange(23.0)
    partition = partition_kmeans(X, 4, seed=1)
    Xp, yp, mask, index = pad_partitions(X, y, partition)
    K, Nmax = 4, partition.sizes.max()
    assert Xp.shape == (K, Nmax, 3) and yp.shape == (K, Nmax) and mask.shape == (K, Nmax)
    assert Xp.dtype == torch.float64 and mask.dtype == torch.bool
    assert mask.sum(-1).tolist() == partition.sizes.tolist()
    for k in range(K):
        rows = partition.indices(k)
        assert mask[k].tolist() == [True] * len(rows) + [False] * (Nmax - len(rows))
        assert np.array_equal(Xp[k, : len(rows)].numpy(), X[rows])
        assert np.array_equal(yp[k, : len(rows)].numpy(), y[rows])
        assert index[k, : len(rows)].tolist() == rows.tolist()
        assert (Xp[k, len(rows) :] == 0).all() and (yp[k, len(rows) :] == 0).all()
    assert sorted(index[mask].tolist()) == list(range(23))


def test_pad_keeps_tensor_dtype_and_trailing_output_dimensions():
    X = torch.randn(12, 2, dtype=torch.float32)
    y = torch.randn(12, 3, dtype=torch.float32)
    partition = partition_random(12, 5, seed=3)
    Xp, yp, mask, index = pad_partitions(X, y, partition)
    assert Xp.dtype == torch.float32 and yp.shape == (5, 3, 3)
    restored = torch.empty_like(y)
    restored[index[mask]] = yp[mask]
    assert torch.equal(restored, y)


def test_pad_checks_sizes():
    partition = partition_random(6, 2, seed=0)
    with pytest.raises(DataError, match="do not match a partition of 6 points"):
        pad_partitions(np.zeros((5, 1)), np.zeros(5), partition)
